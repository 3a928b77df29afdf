#!/usr/bin/env bash
# Packs what a GPU machine needs next to a checkout into .device/ (ignored by git; carry it):
#   .device/sovereign          the release binary (rpath $ORIGIN/lib)
#   .device/lib/               libllama, libggml, libggml-base (by SONAME) and the CPU module
#   .device/engine-src.tar.gz  the patched engine source the binary was built from
#   .device/build-info.json    the build identity, with the engine's CMake options
# Usage: scripts/pack-device.sh [BINARY]   (default: $CARGO_TARGET_DIR or target, release)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-${CARGO_TARGET_DIR:-target}/release/sovereign}
[ -x "$bin" ] || { echo "pack-device: $bin: no release binary (cargo build --release --locked)" >&2; exit 2; }
rm -rf .device
mkdir -p .device/lib
cp "$bin" .device/sovereign
"$bin" build-info --json > .device/build-info.json
# The libraries the binary maps, copied under their SONAME file names so $ORIGIN/lib resolves.
python3 - "$bin" <<'PY'
import json, os, shutil, sys
info = json.load(open(".device/build-info.json"))
for lib in info["libraries"]:
    p = lib["path"]
    name = os.path.basename(p)
    if name.startswith("libggml-cpu"):
        dst = "libggml-cpu.so"
    else:
        # libfoo.so.0.26.0 -> libfoo.so.0 (the SONAME the binary and modules ask for)
        stem, _, ver = name.partition(".so.")
        dst = f"{stem}.so.{ver.split('.')[0]}" if ver else name
    shutil.copy2(p, os.path.join(".device/lib", dst))
    # libggml-base.so too: what a backend module build links against
    if dst.startswith("libggml-base.so."):
        shutil.copy2(p, ".device/lib/libggml-base.so")
PY
"$bin" build-info --export-source .device/engine-src.tar.gz 2>/dev/null
ls -la .device .device/lib
du -sh .device

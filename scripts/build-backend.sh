#!/usr/bin/env bash
# Builds one ggml backend module (today: cuda) from the patched engine source the harness
# exported, with the harness's own CMake options, so the module matches the carried ggml-base.
# Usage: scripts/build-backend.sh cuda OUTDIR [SRC.tar.gz] [BUILD-INFO.json]
#   defaults: .device/engine-src.tar.gz and .device/build-info.json (scripts/pack-device.sh)
# Env: JOBS (16), CUDA_ARCH (90), BUILD_DIR (OUTDIR/build)
set -euo pipefail
kind=${1:?usage: build-backend.sh cuda OUTDIR [SRC.tar.gz] [BUILD-INFO.json]}
out=${2:?usage: build-backend.sh cuda OUTDIR [SRC.tar.gz] [BUILD-INFO.json]}
root=$(cd "$(dirname "$0")/.." && pwd)
src_tar=${3:-$root/.device/engine-src.tar.gz}
info=${4:-$root/.device/build-info.json}
[ "$kind" = cuda ] || { echo "build-backend: only 'cuda' is known, not '$kind'" >&2; exit 2; }
[ -f "$src_tar" ] || { echo "build-backend: $src_tar: no engine source (sovereign build-info --export-source)" >&2; exit 2; }
[ -f "$info" ] || { echo "build-backend: $info: no build identity (sovereign build-info --json)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${BUILD_DIR:-$out/build}
rm -rf "$work"
mkdir -p "$work"
tar -xzf "$src_tar" -C "$work"
# The harness's options exactly, then the backend's own.
mapfile -t opts < <(python3 -c '
import json, sys
for o in json.load(open(sys.argv[1]))["engine"]["cmake_options"]:
    print("-D" + o)' "$info")
opts+=(-DGGML_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90}" -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF)
echo "build-backend: cmake ${opts[*]}"
cmake -S "$work/llama.cpp" -B "$work/b" -G Ninja "${opts[@]}" > "$work/configure.log" 2>&1 \
  || { tail -30 "$work/configure.log"; exit 1; }
cmake --build "$work/b" --target ggml-cuda -j "${JOBS:-16}" > "$work/build.log" 2>&1 \
  || { tail -40 "$work/build.log"; exit 1; }
mod=$(find "$work/b" -name 'libggml-cuda.so' -print -quit)
[ -n "$mod" ] || { echo "build-backend: no libggml-cuda.so was produced" >&2; exit 1; }
cp "$mod" "$out/libggml-cuda.so"
# The module asks for ggml-base by SONAME; in the harness that is the carried library. Same
# source and options; the files may differ only by embedded build paths.
echo "build-backend: $out/libggml-cuda.so $(sha256sum < "$out/libggml-cuda.so" | cut -d' ' -f1)"
readelf -d "$out/libggml-cuda.so" | awk '/NEEDED/ {print "build-backend: needs " $NF}'

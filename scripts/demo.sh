#!/usr/bin/env bash
# `make demo`: what sovereign is for, end to end on a forged model larger than the hard memory
# limit it runs under. The resident oracle (no limit); stock llama.cpp (mmap) under a 128 MiB
# cgroup limit (it completes, pressed against the ceiling: limit events); F with per-layer LRU
# under the same limit (no limit event, a positive margin); both compared with the oracle on
# every surface; the F run's certificate and its timeline figure; then one table.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sovereign}
MODEL=models/small.gguf
OUT=${DEMO_RESULTS:-results}/demo
CAP=134217728   # 128 MiB: about half the model
mkdir -p models "$OUT"

"$BIN" build-info
[ -f "$MODEL" ] || "$BIN" model forge --preset small --seed 7 --out "$MODEL"
# (The whole inventory goes to a file: `| head` would end it by SIGPIPE under pipefail.)
"$BIN" inventory "$MODEL" > "$OUT/inventory.txt"
head -4 "$OUT/inventory.txt"
# Records are sealed read-only where they are written: writable again before they go.
chmod -R u+w "$OUT"/oracle "$OUT"/stock "$OUT"/F-LRU 2>/dev/null || true
rm -rf "$OUT"/oracle "$OUT"/stock "$OUT"/F-LRU
gen() {
  local name=$1; shift
  echo "== $name"
  "$BIN" generate --model "$MODEL" --prompt-file campaigns/prompts/demo.txt --n-predict 64 \
    --record "$OUT/$name" "$@" > /dev/null
}
gen oracle
gen stock --memory-max "$CAP"
gen F-LRU --memory-max "$CAP" --experts plan --slots 16 --policy lru:16 --source f

echo "== F-LRU against the oracle, surface by surface"
"$BIN" compare "$OUT/oracle" "$OUT/F-LRU"
"$BIN" compare --json "$OUT/oracle" "$OUT/stock" > "$OUT/stock-compare.json" || true
"$BIN" compare --json "$OUT/oracle" "$OUT/F-LRU" > "$OUT/F-LRU-compare.json"
echo "== the F-LRU run's certificate (CPU only: no GPU allowance, no board, no host reserve)"
"$BIN" certificate show "$OUT/F-LRU" --oracle "$OUT/oracle" --g-decl 0 --g-phys 0 --r-policy 0
"$BIN" export timeline --record "$OUT/F-LRU" --out "$OUT/F-LRU-timeline.svg"

echo "== under a $CAP-byte hard limit (the model is $(stat -c %s "$MODEL") bytes)"
python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print(f"{'arm':<8} {'decode tok/s':>12} {'host peak':>12} {'limit events':>13} {'exact':>6} {'admitted':>9}")
for arm in ["oracle", "stock", "F-LRU"]:
    r = json.load(open(os.path.join(out, arm, "record.json")))
    steps = r["counts"]["generated_tokens"] - 1
    tps = steps / r["timing"]["decode_s"]
    host = (r.get("resources") or {}).get("host") or {}
    adm = ((r.get("resources") or {}).get("admission") or {}).get("admitted")
    exact = "-" if arm == "oracle" else str(json.load(open(os.path.join(out, f"{arm}-compare.json")))["exact"]).lower()
    peak = host.get("kernel_peak")
    print(f"{arm:<8} {tps:>12.2f} {'-' if peak is None else peak:>12} {host.get('limit_events', '-'):>13} {exact:>6} {'-' if adm is None else str(adm).lower():>9}")
PY

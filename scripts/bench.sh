#!/usr/bin/env bash
# `make bench`: the bench model under one hard host cap below its size, arms side by side in
# one run: stock llama.cpp (mmap, resident path), P, D, F and F with LRU; plus the device's
# O_DIRECT read ceiling measured in the same run. Writes a table and CSV under results/.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=target/release/sovereign
MODEL=${BENCH_MODEL:-models/bench.gguf}
CAP=${BENCH_CAP:-2G}
OUTPUTS=${BENCH_OUTPUTS:-16}
THREADS=${BENCH_THREADS:-2}
SLOTS=${BENCH_SLOTS:-16}
LRU=${BENCH_LRU:-16}
PROMPT=campaigns/prompts/demo.txt
OUT=results/bench-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p "$OUT" models

[ -f "$MODEL" ] || $BIN model forge --preset bench --seed 1 --out "$MODEL"
echo "== device read ceiling (O_DIRECT, io_uring)"
$BIN envelope --file "$MODEL" --bytes-per-cell $((64 << 20)) --csv "$OUT/envelope.csv" --figure "$OUT/envelope.svg" --json > "$OUT/envelope.json"

run_arm() {
  local name=$1; shift
  echo "== $name"
  $BIN generate --model "$MODEL" --prompt-file "$PROMPT" --n-predict "$OUTPUTS" --threads "$THREADS" \
    --memory-max "$CAP" --record "$OUT/$name" "$@" || echo "   ($name did not complete; its record says why)"
}
run_arm stock
run_arm P     --experts plan --slots "$SLOTS" --source p
run_arm D     --experts plan --slots "$SLOTS" --source d
run_arm F     --experts plan --slots "$SLOTS" --source f
run_arm F-LRU --experts plan --slots "$SLOTS" --source f --policy "lru:$LRU"

python3 scripts/bench_table.py "$OUT"

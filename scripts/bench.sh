#!/usr/bin/env bash
# `make bench`: the shipped bench campaign (campaigns/bench.yaml) unattended: forge the bench
# model if it is missing, run the campaign (a rerun resumes), export its tables, then the
# paired F/D ratio and F's ratio to its floor with their intervals.
#
# BENCH_OUTPUTS (tokens per cell) and BENCH_BLOCKS (counterbalanced blocks, at most the
# shipped four) scale it down: the scaled campaign is written under results/bench-campaigns/
# with its own id, since a preregistered campaign never changes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sovereign}
CAMPAIGN=campaigns/bench.yaml
MODEL=models/bench.gguf
RESULTS=${BENCH_RESULTS:-results}
mkdir -p models "$RESULTS"

[ -f "$MODEL" ] || "$BIN" model forge --preset bench --seed 1 --alignment 4096 --out "$MODEL"

if [ -n "${BENCH_OUTPUTS:-}${BENCH_BLOCKS:-}" ]; then
  dir="$RESULTS/bench-campaigns"
  mkdir -p "$dir"
  CAMPAIGN=$(python3 - "$CAMPAIGN" "$dir" "${BENCH_OUTPUTS:-}" "${BENCH_BLOCKS:-}" <<'PY'
import os, re, sys
src, out_dir, outputs, blocks = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
text = open(src).read()
base = os.path.dirname(os.path.abspath(src))
rel = lambda p: os.path.relpath(os.path.join(base, p), os.path.abspath(out_dir))
text = re.sub(r"(?m)^(  path: )(\S+)", lambda m: m.group(1) + rel(m.group(2)), text)
text = re.sub(r"(?m)^(  prompt_file: )(\S+)", lambda m: m.group(1) + rel(m.group(2)), text)
cid = re.search(r"(?m)^id: (\S+)", text).group(1)
if outputs:
    text = re.sub(r"(?m)^(  outputs: )\d+", r"\g<1>" + outputs, text)
    text = re.sub(r"(?m)^(  horizon: )\d+", r"\g<1>" + outputs, text)
    cid += "-o" + outputs
if blocks:
    lines, out, inside, kept = text.split("\n"), [], False, 0
    for l in lines:
        if l.strip() == "preordered:":
            inside = True
        elif inside and l.startswith("      - ["):
            kept += 1
            if kept > int(blocks):
                continue
        elif inside:
            inside = False
        out.append(l)
    text = "\n".join(out)
    cid += "-b" + blocks
text = re.sub(r"(?m)^id: \S+", "id: " + cid, text)
path = os.path.join(out_dir, cid + ".yaml")
open(path, "w").write(text)
print(path)
PY
)
fi
ID=$("$BIN" campaign check "$CAMPAIGN" | sed -n 's/.*campaign \([^ ]*\) (.*/\1/p')
echo "== campaign $ID ($CAMPAIGN)"
"$BIN" campaign run "$CAMPAIGN" --results "$RESULTS"
OUT="$RESULTS/export-$ID"
echo "== export"
"$BIN" export --campaign "$ID" --results "$RESULTS" --out "$OUT"
echo "== F/D decode time, paired"
"$BIN" stats pairs --csv "$OUT/pairs.csv" --a a --b b
echo "== F decode time per token over its floor, max(replayed reads, resident compute)"
"$BIN" stats pairs --csv "$OUT/floor.csv" --a floor_s_per_token --b arm_s_per_token

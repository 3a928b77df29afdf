#!/usr/bin/env bash
# `make bench`: the shipped bench campaign (campaigns/bench.yaml) unattended: forge the bench
# model if it is missing, run the campaign (a rerun resumes), export its tables, then the
# paired F/D ratio, F's ratio to its floor and its bytes per second over the envelope with
# their intervals; then the prefill bench (campaigns/bench-prefill.yaml: a 4,244-token prompt on
# a 24 x 256-expert model under a third of its size; BENCH_PREFILL=0 leaves it out), then the
# skewed-routing bench (campaigns/bench-skew.yaml, its model made
# from its recipe; BENCH_SKEW=0 leaves it out), then temporal amortization
# (campaigns/bench-draft.yaml; BENCH_DRAFT=0 leaves it out), then sessions of eight requests
# against separate runs (campaigns/bench-session.yaml; BENCH_SESSION=0 leaves it out).
#
# BENCH_OUTPUTS (tokens per cell) and BENCH_BLOCKS (counterbalanced blocks, at most the
# shipped eight) scale it down: the scaled campaign is written under results/bench-campaigns/
# with its own id, since a preregistered campaign never changes.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sovereign}
CAMPAIGN=campaigns/bench.yaml
MODEL=models/bench.gguf
RESULTS=${BENCH_RESULTS:-results}
mkdir -p models "$RESULTS"

# The model the campaign pins (a model forged by an earlier bench, with other bytes, is
# forged again).
want=$(awk '/^  sha256: / { print $2; exit }' "$CAMPAIGN")
if [ ! -f "$MODEL" ] || [ "$(sha256sum "$MODEL" | cut -d' ' -f1)" != "$want" ]; then
  "$BIN" model forge --preset bench --seed 1 --out "$MODEL"
fi

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
echo "== F decode time per token over its floor, max(replayed reads, warm resident compute)"
"$BIN" stats pairs --csv "$OUT/floor.csv" --a floor_s_per_token --b arm_s_per_token
echo "== F decode bytes per second over the envelope's best cell"
"$BIN" stats pairs --csv "$OUT/floor.csv" --a envelope_mib_per_s --b arm_mib_per_s
echo "== F's replay plus its device idle per token (no read in flight, its timeline) over its floor: the least F/floor that idle allows"
"$BIN" stats pairs --csv "$OUT/floor.csv" --a floor_s_per_token --b idle_bound_s_per_token
echo "== F decode time per token over its idle bound (its replay plus its device idle): what F loses beyond the router's dependence"
"$BIN" stats pairs --csv "$OUT/floor.csv" --a idle_bound_s_per_token --b arm_s_per_token
echo "== F decode time per token with reads in flight over its replay's: how much slower F's reads ran than the same reads with nothing else to do (floor.csv's arm_plan_busy_s_per_token: the Plan's verification within that time)"
"$BIN" stats pairs --csv "$OUT/floor.csv" --a read_s_per_token --b arm_busy_s_per_token
echo "== F decode time per token over its layer bound (its reads replayed one layer after the other, plus its device idle): what F loses beyond the router's barriers, queue drains included"
# A block whose F beat its layer replay has no layer bound (that replay was no floor there):
# the ratio is left out, and the blocks named, rather than taken over the others.
unbound=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "layer_bound_s_per_token") c = i; next }
  c && $c == "" { printf "%s%s", sep, $1; sep = " " }' "$OUT/floor.csv")
if [ -n "$unbound" ]; then
  echo "no ratio: F decoded faster than its reads replayed one layer after the other in block(s) $unbound"
else
  "$BIN" stats pairs --csv "$OUT/floor.csv" --a layer_bound_s_per_token --b arm_s_per_token
fi
echo "== The replay of F's reads, bytes per second over the envelope's best cell: the most F's reads allow"
"$BIN" stats pairs --csv "$OUT/floor.csv" --a envelope_mib_per_s --b replay_mib_per_s

if [ "${BENCH_PREFILL:-1}" != 0 ] && [ -z "${BENCH_OUTPUTS:-}${BENCH_BLOCKS:-}" ]; then
  echo "== campaign bench-prefill-1 (campaigns/bench-prefill.yaml)"
  "$BIN" campaign run campaigns/bench-prefill.yaml --results "$RESULTS"
  # export prints each arm's prefill over its floor and stock's prefill over the arm's, with
  # their intervals, and fails closed on a floor an arm beat.
  "$BIN" export --campaign bench-prefill-1 --results "$RESULTS" --out "$RESULTS/export-bench-prefill-1"
  echo "== F-budget/F decode time, paired (the budget's sizing against the hand-sized flags)"
  "$BIN" stats pairs --csv "$RESULTS/export-bench-prefill-1/pairs.csv" --a a --b b
fi

if [ "${BENCH_SKEW:-1}" != 0 ] && [ -z "${BENCH_OUTPUTS:-}${BENCH_BLOCKS:-}" ]; then
  echo "== campaign bench-skew-2 (campaigns/bench-skew.yaml)"
  "$BIN" campaign run campaigns/bench-skew.yaml --results "$RESULTS"
  "$BIN" export --campaign bench-skew-2 --results "$RESULTS" --out "$RESULTS/export-bench-skew-2"
fi

if [ "${BENCH_DRAFT:-1}" != 0 ] && [ -z "${BENCH_OUTPUTS:-}${BENCH_BLOCKS:-}" ]; then
  echo "== campaign bench-draft-2 (campaigns/bench-draft.yaml)"
  "$BIN" campaign run campaigns/bench-draft.yaml --results "$RESULTS"
  "$BIN" export --campaign bench-draft-2 --results "$RESULTS" --out "$RESULTS/export-bench-draft-2"
  echo "== F/F-mtp-4 decode time, paired"
  "$BIN" stats pairs --csv "$RESULTS/export-bench-draft-2/pairs.csv" --a a --b b
fi

if [ "${BENCH_SESSION:-1}" != 0 ] && [ -z "${BENCH_OUTPUTS:-}${BENCH_BLOCKS:-}" ]; then
  echo "== campaign bench-session-1 (campaigns/bench-session.yaml)"
  "$BIN" campaign run campaigns/bench-session.yaml --results "$RESULTS"
  "$BIN" export --campaign bench-session-1 --results "$RESULTS" --out "$RESULTS/export-bench-session-1"
  echo "== session (reset) over separate runs: request+reset wall time, paired"
  "$BIN" stats pairs --csv "$RESULTS/export-bench-session-1/pairs.csv" --a a --b b
fi

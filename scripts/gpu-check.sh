#!/usr/bin/env bash
# The device check: CUDA backend module, build identity, exactness matrix, a long prefill
# through many passes, the copy path (asynchronous copies, pinned windows, copy/compute
# overlap), fault cells through F, and the budget bench, all with the carried release binary.
# Every step is timed; a failing step is reported and the next one runs. Everything goes to $OUT/gpu-check.log as well.
#
#   scripts/gpu-check.sh            on a GPU machine (needs .device/ from scripts/pack-device.sh)
#   scripts/gpu-check.sh --cpu      dry run here: no CUDA build, --gpu-layers 0
#
# Env: STEPS (a subset of the steps, by name), SOVEREIGN (binary, default .device/sovereign), OUT (log, build identity, table; default
# .device/out), WORK (models, records, CUDA build; default /tmp/gpu-check-work), BACKEND_DIR
# (skip the CUDA build and load the modules found there).
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
mode=gpu
[ "${1:-}" = "--cpu" ] && mode=cpu
BIN=${SOVEREIGN:-$root/.device/sovereign}
OUT=${OUT:-$root/.device/out}
mkdir -p "$OUT"
# Models, records and the CUDA build stay out of $OUT (only the log and small files go back).
W=${WORK:-/tmp/gpu-check-work}
# Records are sealed read-only where they are written: writable again before they go.
chmod -R u+w "$W" 2>/dev/null || true
rm -rf "$W"
mkdir -p "$W"
exec > >(tee -a "$OUT/gpu-check.log") 2>&1
T0=$(date +%s)
FAILED=()
step() {
    local name=$1; shift
    local _t0=$(date +%s.%N)
    echo "=== $name"
    "$@"
    local rc=$?
    local s=$(python3 -c "print(f'{$(date +%s.%N)-$_t0:.1f}')")
    echo "=== $name: rc=$rc ${s}s (total $(( $(date +%s) - T0 ))s)"
    [ $rc -eq 0 ] || FAILED+=("$name")
    return 0
}
S() { "$BIN" "$@"; }
if [ "$mode" = gpu ]; then GL=all; else GL=0; fi
TH=${THREADS:-$(( $(nproc) < 8 ? $(nproc) : 8 ))}
PROMPT="The quick brown fox jumps over the lazy dog, and then"

build_cuda() {
    if [ -n "${BACKEND_DIR:-}" ]; then echo "using modules in $BACKEND_DIR"; return 0; fi
    [ "$mode" = gpu ] || { echo "cpu dry run: no CUDA build"; return 0; }
    BUILD_DIR=$W/cuda-build "$root/scripts/build-backend.sh" cuda "$W/backend" && BACKEND_DIR=$W/backend
}
identity() {
    [ -n "${BACKEND_DIR:-}" ] && export SOVEREIGN_BACKEND_DIR=$BACKEND_DIR
    S build-info && S build-info --json > "$OUT/build-info.json"
    if [ "$mode" = gpu ]; then
        grep -q '"kind": "gpu"' "$OUT/build-info.json" || { echo "no GPU device in the ggml registry"; return 1; }
    fi
}
forge() {
    S model forge --preset tiny --seed 1 --out "$W/f32.gguf" || return 1
    for t in f16 q8_0 q4_k_m; do S model quantize --type $t "$W/f32.gguf" "$W/$t.gguf" || return 1; done
    # Bench model: experts well over the device budget on the GPU; small for the dry run.
    if [ "$mode" = gpu ]; then
        S model forge --preset small --seed 2 --layers 24 --experts 128 --out "$W/bench.gguf"
    else
        S model forge --preset small --seed 2 --layers 4 --experts 32 --out "$W/bench.gguf"
    fi
}
# gen NAME ARGS...: one generate run, its JSON summary in $W/NAME.json, record in $W/NAME.rec
gen() {
    local n=$1; shift
    S generate --prompt "$PROMPT" --n-predict 16 --threads $TH --gpu-layers $GL --record "$W/$n.rec" --json "$@" > "$W/$n.json" 2> "$W/$n.err"
}
logits() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['surfaces']['logits']['sha256'])" "$W/$1.rec/record.json" 2>/dev/null || echo "-"; }
matrix() {
    local bad=0 n=0
    for t in f32 f16 q8_0 q4_k_m; do
        gen "res-$t" --model "$W/$t.gguf" || { echo "$t resident: failed: $(tail -1 "$W/res-$t.err")"; bad=$((bad+1)); continue; }
        local ref=$(logits "res-$t")
        for src in p d f; do
            for pol in zero lru:4 zero+prefetch; do
                local c="plan-$t-$src-${pol//[:+]/_}"
                n=$((n+1))
                if gen "$c" --model "$W/$t.gguf" --experts plan --source $src --policy $pol --slots 8; then
                    local got=$(logits "$c")
                    if [ "$got" = "$ref" ]; then echo "exact     $c"; else echo "DIFFERENT $c $got vs $ref"; bad=$((bad+1)); fi
                else
                    echo "FAILED    $c: $(tail -1 "$W/$c.err")"; bad=$((bad+1))
                fi
            done
        done
    done
    echo "matrix: $((n-bad))/$n plan cells bitwise equal to the resident run of their type"
    [ $bad -eq 0 ]
}
faults() {
    local bad=0
    gen fault-none --model "$W/q8_0.gguf" --experts plan --source f --slots 8 || { echo "control failed"; return 1; }
    local ref=$(logits fault-none)
    for cell in short_read eio out_of_order stale_completion wrong_object held_consumer reset_outstanding shutdown_live_consumer partial_bundle; do
        gen "fault-$cell" --model "$W/q8_0.gguf" --experts plan --source f --slots 8 --fault $cell
        local rc=$?
        local v=$(python3 - "$W/fault-$cell.rec/record.json" "$ref" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print(f"no record ({e})"); sys.exit()
f = r.get("experts", {}).get("fault", {})
exp, out = f.get("expect"), r.get("outcome")
lg = r.get("surfaces", {}).get("logits", {}).get("sha256")
if exp == "fatal":
    print("ok" if out == "failed" else f"BAD fatal cell {out}", exp, out, "fired", f.get("fired"))
else:
    print("ok" if out == "completed" and lg == sys.argv[2] else f"BAD {out} logits {'equal' if lg == sys.argv[2] else 'differ'}", exp, out, "fired", f.get("fired"))
PY
)
        echo "fault $cell (exit $rc): $v"
        case "$v" in ok*) ;; *) bad=$((bad+1));; esac
    done
    [ $bad -eq 0 ]
}
# The copy path of the matrix's records: asynchronous on the device (a copy stream, an event per
# extent), windows from its pinned host memory, and with token passes copies overlapping compute.
copies() {
    gen copy-pass --model "$W/q8_0.gguf" --experts plan --source f --slots 8 --token-pass 2 || { echo "token-pass run failed: $(tail -1 "$W/copy-pass.err")"; return 1; }
    python3 - "$mode" "$W/plan-q8_0-f-zero.rec/record.json" "$W/copy-pass.rec/record.json" <<'PY'
import json, sys
mode, plain, passes = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
bad = 0
for name, r in (("plan-q8_0-f-zero", plain), ("copy-pass", passes)):
    e = r["experts"]
    c, t, w = e["copy"], e["telemetry"], e["m_source_bound"].get("windows_memory", "")
    if mode == "gpu":
        ok = c.get("asynchronous") == ["CUDA0"] and t.get("async_copies", 0) == t["q_run"]["reads"] and w.startswith("pinned")
    else:
        ok = c.get("synchronous") == ["CPU"] and not c.get("asynchronous") and w.startswith("aligned mapping")
    print(f"{'ok  ' if ok else 'BAD '} {name}: asynchronous {c.get('asynchronous')} synchronous {c.get('synchronous')} "
          f"async copies {t.get('async_copies', 0)} of {t['q_run']['reads']} extents, wait {c.get('wait_seconds', 0):.4f} s, windows {w}")
    bad += not ok
tot = passes["experts"]["timeline"]["total"]
print(f"copy lane: in flight {tot.get('copy_in_flight_ns', 0)/1e6:.2f} ms, overlapping compute {tot.get('copy_overlap_compute_ns', 0)/1e6:.2f} ms of {tot['wall_ns']/1e6:.2f} ms")
if mode == "gpu" and not tot.get("copy_overlap_compute_ns"):
    print("BAD  no copy overlapped compute"); bad += 1
sys.exit(1 if bad else 0)
PY
}
bench() {
    local inv t_repr experts
    inv=$(S inventory --json "$W/bench.gguf" 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['t_repr_bytes'], d['expert_bytes'])") || { echo "inventory failed"; return 1; }
    read t_repr experts <<< "$inv"
    # Budget: non-expert weights + 1 GiB (context, KV, compute, slot pools), below the experts.
    local budget=$((t_repr + (1 << 30)))
    local hostcap=$((t_repr + (768 << 20)))
    echo "bench model: T_repr $t_repr bytes, experts $experts bytes; --gpu-budget $budget, host cap $hostcap"
    [ "$mode" = cpu ] || [ $experts -gt $budget ] || echo "note: experts do not exceed the budget"
    local m="--model $W/bench.gguf --n-predict 32 --ignore-eos"
    local arms=(
        "resident|--contain"
        "experts-host|--contain --experts host"
        "plan-P|--memory-max $hostcap --gpu-budget $budget --experts plan --source p --slots 16"
        "plan-D|--memory-max $hostcap --gpu-budget $budget --experts plan --source d --slots 16"
        "plan-F|--memory-max $hostcap --gpu-budget $budget --experts plan --source f --slots 16"
        "plan-F+LRU|--memory-max $hostcap --gpu-budget $budget --experts plan --source f --slots 16 --policy lru:8"
        "plan-F-budget|--memory-max $hostcap --gpu-budget $budget --experts plan --source f"
    )
    for a in "${arms[@]}"; do
        local n=${a%%|*} args=${a#*|}
        local _a0=$(date +%s.%N)
        S generate --prompt "$PROMPT" --threads $TH --gpu-layers $GL $m $args --record "$W/bench-$n.rec" --json > "$W/bench-$n.json" 2> "$W/bench-$n.err"
        echo "$n exit $? wall $(python3 -c "print(f'{$(date +%s.%N)-$_a0:.2f}')")" | tee "$W/bench-$n.wall"
    done
    python3 "$root/scripts/gpu_check_table.py" "$W" "${arms[@]%%|*}" | tee "$OUT/bench-table.txt"
    # The budget-sized arm: slots and policy from --gpu-budget, every term.
    python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['params']['experts']; print('plan-F-budget: slots', e['slots'], e['policy'], json.dumps(e.get('budget')))" \
        "$W/bench-plan-F-budget.rec/record.json" 2>&1 | tee -a "$OUT/bench-table.txt"
}
# errtail FILE: the last lines of a failed run's stderr (the runtime's message and failing call).
errtail() { grep -v '^[[:space:]]*$' "$1" | tail -n 12 | sed 's/^/  | /'; }
# probe NAME ARGS: after a failed prefill arm on the GPU, the same arm varied one way at a time,
# so that the log says which condition the failure needs.
probe() {
    local n=$1 args=$2 v
    local slots=${args##*--slots }
    for v in "blocking|long|4|$slots|CUDA_LAUNCH_BLOCKING=1" "no-graphs|long|4|$slots|GGML_CUDA_DISABLE_GRAPHS=1" \
             "one-slot-fewer|long|4|$((slots - 1))|" "short-prompt|short|4|$slots|" "decode-only|short|1|$slots|"; do
        IFS='|' read -r vn vp vnp vslots venv <<< "$v"
        local p=(--prompt-file "$W/long.txt"); [ "$vp" = short ] && p=(--prompt "$PROMPT")
        local e="$W/pf-$n-$vn.err"
        if env $venv "$BIN" generate --model "$W/wide.gguf" "${p[@]}" --n-predict $vnp --threads $TH --gpu-layers $GL \
            ${args%--slots*}--slots $vslots --record "$W/pf-$n-$vn.rec" --json > /dev/null 2> "$e"; then
            echo "  probe $vn: completed" | tee -a "$W/probe-$n.log"
        else
            echo "  probe $vn: FAILED" | tee -a "$W/probe-$n.log"; errtail "$e"
        fi
    done
    if grep -q 'probe short-prompt: FAILED' "$W/probe-$n.log" 2>/dev/null && { command -v compute-sanitizer > /dev/null || [ -x /usr/local/cuda/bin/compute-sanitizer ]; }; then
        local cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
        timeout 90 "$cs" --tool memcheck --print-limit 5 "$BIN" generate --model "$W/wide.gguf" --prompt "$PROMPT" --n-predict 1 \
            --threads $TH --gpu-layers $GL $args --record "$W/pf-$n-memcheck.rec" --json > "$W/pf-$n-memcheck.out" 2>&1
        echo "  memcheck (rc $?):"; grep -E 'Invalid|ERROR SUMMARY|at 0x|by thread|Address|kernel|Program hit' "$W/pf-$n-memcheck.out" | head -20 | sed 's/^/  | /'
    fi
}
# Prefill through passes: a long prompt on a wide model, resident and through F at three slot
# counts (many, some and one pass per ubatch), each bitwise against resident, with its prefill time.
prefill() {
    local layers=24 experts=256 words=600
    [ "$mode" = gpu ] || { layers=4; experts=64; words=250; }
    S model forge --preset small --seed 3 --layers $layers --experts $experts --context 8192 --out "$W/wide.gguf" || return 1
    python3 -c "import random; r=random.Random(7); w='the of and to in is was for on that with as by at from his her it an were are which this be or has had not but also'.split(); print(' '.join(r.choice(w) for _ in range($words)))" > "$W/long.txt"
    local bad=0 ref=""
    # Prompt passes: the default (half the slots, from 32 on), one group at a time (0), and
    # small passes given by flag; each reads the next group while the engine computes one.
    for a in "resident|" "f-16|--experts plan --source f --slots 16" "f-16-pp8|--experts plan --source f --slots 16 --prompt-pass 8" \
        "f-64|--experts plan --source f --slots 64" "f-64-pp0|--experts plan --source f --slots 64 --prompt-pass 0" \
        "f-all|--experts plan --source f --slots $experts" "f-all-pp0|--experts plan --source f --slots $experts --prompt-pass 0"; do
        local n=${a%%|*} args=${a#*|}
        if ! S generate --model "$W/wide.gguf" --prompt-file "$W/long.txt" --n-predict 4 --threads $TH --gpu-layers $GL $args \
            --record "$W/pf-$n.rec" --json > "$W/pf-$n.json" 2> "$W/pf-$n.err"; then
            echo "FAILED $n:"; errtail "$W/pf-$n.err"; bad=$((bad+1))
            [ "$mode" = gpu ] && probe "$n" "$args"
            continue
        fi
        local got=$(logits "pf-$n")
        [ -n "$ref" ] || ref=$got
        python3 - "$W/pf-$n.rec/record.json" "$n" "$([ "$got" = "$ref" ] && echo equal || echo DIFFERENT)" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); t = r["timing"]; e = r.get("experts") or {}
sel = (e.get("selections") or {}).get("layers") or []
passes = sel[0].get("passes") if sel and isinstance(sel[0], dict) else None
pf = e.get("prefill") or {}
pp = ((r.get("params") or {}).get("experts") or {}).get("prompt_pass")
parts = f"  read {pf['read_s']:.2f} s compute {pf['compute_s']:.2f} s exposed wait {pf['exposed_wait_s']:.2f} s" if pf else ""
print(f"{sys.argv[2]:9} prompt {r['counts'].get('prompt_tokens')} tokens  prefill {t['prefill_s']:.3f} s ({t['prefill_tokens_per_s']:.0f} tok/s)  "
      f"prompt pass {pp}  layer-0 passes {passes}{parts}  logits {sys.argv[3]}")
PY
        [ "$got" = "$ref" ] || bad=$((bad+1))
    done
    [ $bad -eq 0 ]
}
# STEPS: the steps to run (default: all), e.g. STEPS="build-cuda identity forge prefill".
STEPS=${STEPS:-build-cuda identity forge prefill exactness copies faults bench}
want() { [[ " $STEPS " == *" $1 "* ]]; }
want build-cuda && step build-cuda build_cuda
want identity && step identity identity
want forge && step forge forge
want prefill && step prefill prefill
want exactness && step exactness matrix
want copies && step copies copies
want faults && step faults faults
want bench && step bench bench
echo "gpu-check ($mode): $(( $(date +%s) - T0 ))s; failed steps: ${FAILED[*]:-none}"
[ ${#FAILED[@]} -eq 0 ]

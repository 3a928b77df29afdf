#!/usr/bin/env bash
# `make bench-big`: a model larger than this machine's memory, with no cgroup cap. Forges a
# shard set of 1.5 x physical memory (BENCH_BIG_FACTOR), kept under models/big/ for the next
# run; then, each from a cold page cache and against a zero-cache D oracle (as seed 000's C1
# compares against a zero-cache run): stock llama.cpp (mmap, experts resident) and F with LRU.
# Per arm: prefill and decode tok/s, major page faults, host peak (max RSS of the run's
# process tree), wall time, and whether every surface equals the oracle's.
#
# BENCH_BIG_OUTPUTS (tokens decoded, default 16) and BENCH_BIG_FACTOR scale it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/sovereign}
OUT=${BENCH_BIG_RESULTS:-results}/bench-big
FACTOR=${BENCH_BIG_FACTOR:-1.5}
OUTPUTS=${BENCH_BIG_OUTPUTS:-16}
DIR=models/big
mkdir -p "$DIR" "$OUT"

mem=$(python3 -c "import os; print(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES'))")
# qwen3moe, 128 experts of 1024 x 1024 (12 MiB at F32), top-8: as many layers as the size takes.
per_layer=$((128 * 3 * 1024 * 1024 * 4))
layers=$(python3 -c "import math; print(math.ceil($mem * $FACTOR / $per_layer))")
want=$((layers * per_layer))
PREFIX="$DIR/big-l$layers"
FIRST="$PREFIX-00001-of-"
if ! ls "$FIRST"*.gguf > /dev/null 2>&1; then
  avail=$(df -B1 --output=avail "$DIR" | tail -1)
  if [ "$avail" -lt $((want + (2 << 30))) ]; then
    echo "bench-big: a model of $want bytes (${FACTOR} x the $mem bytes of memory) needs that much free disk under $DIR; $avail are free" >&2
    exit 1
  fi
  rm -f "$DIR"/big-*.gguf "$DIR"/*.partial
  echo "== forging $layers layers x 128 experts ($want expert bytes, ${FACTOR} x memory) into a shard set"
  "$BIN" model forge --preset bench --seed 5 --layers "$layers" --experts 128 --top-k 8 --embd 1024 --expert-ff 1024 \
    --split-max-size 4G --out "$PREFIX"
fi
MODEL=$(ls "$FIRST"*.gguf)
"$BIN" inventory "$MODEL" > "$OUT/inventory.txt"
head -6 "$OUT/inventory.txt"
echo "== digest manifests (once per shard, cached for the runs)"
"$BIN" model digests "$MODEL" | grep -v '^shard'

python3 - "$BIN" "$MODEL" "$OUT" "$OUTPUTS" "$mem" <<'PY'
import json, os, resource, subprocess, sys, time
bin_, model, out, outputs, mem = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
shards = sorted(os.path.join(os.path.dirname(model), f) for f in os.listdir(os.path.dirname(model))
                if f.startswith(os.path.basename(model).rsplit("-00001-of-", 1)[0] + "-") and f.endswith(".gguf"))
total = sum(os.path.getsize(s) for s in shards)

def cold():
    for s in shards:
        fd = os.open(s, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

def arm(name, extra):
    rec = os.path.join(out, name)
    subprocess.run(["rm", "-rf", rec], check=True)
    cold()
    print(f"== {name}", flush=True)
    cmd = [bin_, "generate", "--model", model, "--prompt-file", "campaigns/prompts/demo.txt",
           "--n-predict", str(outputs), "--ignore-eos", "--record", rec] + extra
    t = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    _, status, ru = os.wait4(p.pid, 0)
    wall = time.monotonic() - t
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"bench-big: {name} failed (exit {os.waitstatus_to_exitcode(status)})")
    r = json.load(open(os.path.join(rec, "record.json")))
    tm = r["timing"]
    return {"arm": name, "prefill_tok_s": tm["prefill_tokens_per_s"], "decode_tok_s": tm["decode_tokens_per_s"],
            "major_faults": ru.ru_majflt, "host_peak_bytes": ru.ru_maxrss * 1024, "wall_s": wall,
            "outcome": r["outcome"], "rec": rec}

rows = [arm("oracle-D-zero", ["--experts", "plan", "--source", "d", "--policy", "zero", "--slots", "16"]),
        arm("stock", []),
        arm("F-LRU", ["--experts", "plan", "--source", "f", "--policy", "lru:16", "--slots", "16"])]
oracle = rows[0]["rec"]
for r in rows[1:]:
    c = subprocess.run([bin_, "compare", oracle, r["rec"]], stdout=subprocess.DEVNULL)
    r["exact"] = c.returncode == 0
rows[0]["exact"] = None
summary = {"memory_bytes": mem, "model_bytes": total, "shards": len(shards), "outputs": outputs, "arms": rows}
json.dump(summary, open(os.path.join(out, "summary.json"), "w"), indent=2)
print(f"\nmodel {total} bytes in {len(shards)} shards = {total / mem:.2f} x the {mem} bytes of memory; no cgroup cap")
print(f"{'arm':<14}{'prefill tok/s':>14}{'decode tok/s':>14}{'major faults':>14}{'host peak':>14}{'wall s':>9}  exact")
for r in rows:
    exact = "oracle" if r["exact"] is None else str(r["exact"]).lower()
    print(f"{r['arm']:<14}{r['prefill_tok_s']:>14.2f}{r['decode_tok_s']:>14.3f}{r['major_faults']:>14}{r['host_peak_bytes']:>14}{r['wall_s']:>9.1f}  {exact}")
bad = [r["arm"] for r in rows if r["outcome"] != "completed" or r["exact"] is False]
if bad:
    sys.exit(f"bench-big: {', '.join(bad)} not completed and exact")
PY

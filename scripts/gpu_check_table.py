"""The bench table of scripts/gpu-check.sh: one row per arm, from its record.

Usage: gpu_check_table.py WORKDIR ARM...   (records in WORKDIR/bench-ARM.rec/record.json)
"""
import json
import sys


def get(d, *path):
    for p in path:
        if not isinstance(d, dict) or p not in d:
            return None
        d = d[p]
    return d


def mib(b):
    return "-" if b is None else f"{b / 2**20:.0f}"


def main():
    work, arms = sys.argv[1], sys.argv[2:]
    rows, walls, ref = [], {}, None
    for a in arms:
        try:
            r = json.load(open(f"{work}/bench-{a}.rec/record.json"))
        except Exception as e:
            rows.append([a, f"no record ({e.__class__.__name__})"] + ["-"] * 9)
            continue
        lg = get(r, "surfaces", "logits", "sha256")
        if a == "resident":
            ref = lg
        wall = get(r, "resources", "wall_s")
        walls[a] = wall
        gpu = get(r, "resources", "gpu")
        dev = get(gpu, "run_used_peak") if isinstance(gpu, dict) else None
        adm = get(r, "resources", "admission")
        adm_s = "-" if adm is None else ("admitted" if adm["admitted"] else "no: " + "; ".join(f.split(":")[0] for f in adm["failed"]))
        rows.append([
            a,
            r.get("outcome", "?"),
            f"{get(r, 'timing', 'decode_tokens_per_s') or 0:.1f}",
            "-" if wall is None else f"{wall:.2f}",
            mib(get(r, "experts", "telemetry", "bytes_copied")),
            "-" if get(r, "experts", "exposed_source_wait_s") is None else f"{get(r, 'experts', 'exposed_source_wait_s'):.3f}",
            mib(dev),
            mib(get(r, "resources", "host", "kernel_peak")),
            adm_s,
            "ref" if a == "resident" else ("-" if ref is None or lg is None else ("equal" if lg == ref else "DIFFERENT")),
        ])
    head = ["arm", "outcome", "decode tok/s", "wall s", "H2D MiB", "exposed wait s", "dev peak MiB", "host peak MiB", "admission", "logits vs resident"]
    w = [max(len(str(x[i])) for x in rows + [head]) for i in range(len(head))]
    for x in [head] + rows:
        print("  ".join(str(v).ljust(w[i]) for i, v in enumerate(x)))
    f, d = walls.get("plan-F"), walls.get("plan-D")
    print("F/D complete-wall ratio:", "-" if not f or not d else f"{f / d:.3f}")


main()

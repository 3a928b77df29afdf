"""Reads a bench run's records and prints one table (also written as CSV) with the ratios."""
import csv, json, os, subprocess, sys

out = sys.argv[1]
arms = ["stock", "P", "D", "F", "F-LRU"]
env = json.load(open(os.path.join(out, "envelope.json")))
ceiling = env["ceiling"]["mib_per_s"]
rows = []
for a in arms:
    p = os.path.join(out, a, "record.json")
    if not os.path.exists(p):
        continue
    r = json.load(open(p))
    res, t, e = r.get("resources", {}), r.get("timing", {}), r.get("experts") or {}
    tel = e.get("telemetry", {})
    gen = r.get("counts", {}).get("generated_tokens", 0)
    phys = tel.get("q_run", {}).get("physical_bytes")
    wait = e.get("exposed_source_wait_s")
    rows.append({
        "arm": a,
        "outcome": r.get("outcome"),
        "wall_s": round(res.get("wall_s", 0), 3),
        "prefill_tok_s": round(t.get("prefill_tokens_per_s", 0), 2),
        "decode_tok_s": round(t.get("decode_tokens_per_s", 0), 2),
        "host_peak_bytes": res.get("host", {}).get("kernel_peak"),
        "limit_events": res.get("host", {}).get("limit_events"),
        "admitted": res.get("admission", {}).get("admitted"),
        "exposed_source_wait_s": round(wait, 3) if wait is not None else "",
        "physical_bytes_per_output": int(phys / gen) if phys and gen else "",
        "read_mib_s_while_waiting": round(phys / wait / 2**20, 1) if phys and wait else "",
    })
by = {r["arm"]: r for r in rows}
def ratio(a, b, k="wall_s"):
    try:
        return round(by[a][k] / by[b][k], 4)
    except Exception:
        return ""
exact = {}
for a in arms[1:]:
    if a in by and by[a]["outcome"] == "completed" and by.get("stock", {}).get("outcome") == "completed":
        rc = subprocess.run(["target/release/sovereign", "compare", os.path.join(out, "stock"), os.path.join(out, a)],
                            capture_output=True).returncode
        exact[a] = "exact" if rc == 0 else "DIFFERS"
for r in rows:
    r["exact_vs_stock"] = exact.get(r["arm"], "-" if r["arm"] == "stock" else "n/a")
cols = list(rows[0].keys()) if rows else []
with open(os.path.join(out, "bench.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    w.writerows(rows)
widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
print("  ".join(c.ljust(widths[c]) for c in cols))
for r in rows:
    print("  ".join(str(r[c]).ljust(widths[c]) for c in cols))
print(f"device ceiling: {ceiling:.1f} MiB/s (block {env['ceiling']['block_bytes']}, depth {env['ceiling']['depth']})")
print(f"F/D complete-wall ratio: {ratio('F', 'D')}   (seed 000: 0.323)")
print(f"F+LRU/stock complete-wall ratio: {ratio('F-LRU', 'stock')}")
if "F" in by and by["F"]["read_mib_s_while_waiting"]:
    print(f"F read rate while the engine waited: {by['F']['read_mib_s_while_waiting']} MiB/s = "
          f"{by['F']['read_mib_s_while_waiting'] / ceiling:.1%} of the device ceiling")
print(f"table: {os.path.join(out, 'bench.csv')}")

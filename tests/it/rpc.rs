//! A real non-host device in every test run: ggml's RPC backend, served by `sovereign device
//! serve` in its own process on 127.0.0.1. Layers and their slot pools live in its buffers, so
//! every expert byte goes window → copy; each run is bitwise equal to the RPC-resident run of the
//! same build, and a server that dies mid-run fails the run closed.

use crate::common;

use common::*;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const PROMPT: &str = "Experts move from storage into bounded slots; every output byte must match the resident run.";
const OUTPUTS: u32 = 24;

/// A device server on an ephemeral loopback port, killed and reaped when dropped (`Reaped`).
struct Server {
    child: Reaped,
    endpoint: String,
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[], Stdio::null())
    }

    fn start_with(extra: &[&str], stderr: Stdio) -> Server {
        // A port the kernel just gave out and took back: free unless another process races us.
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let endpoint = format!("127.0.0.1:{port}");
        let child = Reaped::new(
            bin()
                .args(["device", "serve", "--listen", &endpoint, "--threads", "2"])
                .args(extra)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .expect("spawn the device server"),
        );
        let addr: SocketAddr = endpoint.parse().unwrap();
        let start = Instant::now();
        while TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err() {
            assert!(start.elapsed() < Duration::from_secs(20), "the device server did not listen on {endpoint}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Server { child, endpoint }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then the server's own account of its end.
    fn terminate(&mut self) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

fn record(rec: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
}

fn gen_on(s: &Server, model: &Path, rec: &Path, extra: &[&str]) -> serde_json::Value {
    let mut args = vec!["--rpc", &s.endpoint, "--gpu-layers", "all"];
    args.extend_from_slice(extra);
    let r = generate(model, PROMPT, OUTPUTS, rec, &args);
    assert_eq!(r.code, 0, "{} {extra:?}: {}{}", model.display(), r.stdout, r.stderr);
    record(rec)
}

fn assert_exact(a: &Path, b: &Path) {
    let r = run(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{} vs {}:\n{}", a.display(), b.display(), r.stdout);
}

#[test]
fn resident_on_the_rpc_device_equals_the_cpu_and_names_the_device() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 41, &[]);
    let cpu = dir.path().join("cpu");
    let r = generate(&m, PROMPT, OUTPUTS, &cpu, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let rpc = dir.path().join("rpc");
    let v = gen_on(&s, &m, &rpc, &[]);
    // The server computes with the CPU backend's kernels: the same bits as this process.
    assert_exact(&cpu, &rpc);
    let p = &v["params"]["placement"];
    assert_eq!(p["gpu_devices"], serde_json::json!(["RPC0"]), "{p}");
    assert!(p["effective"].as_str().unwrap().contains("RPC0"), "{p}");
    assert_eq!(p["rpc_protocol"], "7.0.0", "{p}");
    let dev = v["build"]["devices"].as_array().unwrap().iter().find(|d| d["name"] == "RPC0").expect("the record names the device");
    assert_eq!(dev["description"], s.endpoint.as_str());
    assert!(dev["memory_total"].as_u64().unwrap() > 0, "{dev}");
    assert!(v["build"]["libraries"].as_array().unwrap().iter().any(|l| l["name"] == "libggml-rpc.so"), "the RPC module is named by digest");
}

/// A shard set on the device: resident and streamed through F (token passes) and P, each
/// bitwise equal to the same model in one file on the device, and fault cells through F on the
/// set pass their validators.
#[test]
fn a_shard_set_on_the_rpc_device_is_exact_against_its_one_file() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let m = forge(d, "m.gguf", 43, &[]);
    ok(&["model", "split", m.to_str().unwrap(), d.join("m").to_str().unwrap(), "--max-tensors", "8"]);
    let set = d.join("m-00003-of-00005.gguf");
    let one = d.join("one");
    gen_on(&s, &m, &one, &[]);
    let resident = d.join("set-resident");
    let v = gen_on(&s, &set, &resident, &[]);
    assert_exact(&one, &resident);
    assert_eq!(v["model"]["shards"].as_array().map(Vec::len), Some(5), "{}", v["model"]);
    for (name, flags) in [("f-pass", &["--source", "f", "--token-pass", "2"][..]), ("p-lru", &["--source", "p", "--policy", "lru:3"])] {
        let rec = d.join(format!("set-{name}"));
        let mut args = vec!["--experts", "plan", "--slots", "5"];
        args.extend_from_slice(flags);
        let v = gen_on(&s, &set, &rec, &args);
        assert_exact(&one, &rec);
        assert_eq!(v["experts"]["clean_closure"], true, "{name}");
        assert_eq!(v["experts"]["copy"]["asynchronous"], serde_json::json!(["RPC0"]), "{name}");
    }
    let control = d.join("set-none");
    gen_on(&s, &set, &control, &["--experts", "plan", "--slots", "5", "--source", "f", "--fault", "none"]);
    for cell in ["short_read", "wrong_object", "corrupt_byte"] {
        let rec = d.join(format!("set-{cell}"));
        let args = ["--rpc", &s.endpoint, "--gpu-layers", "all", "--experts", "plan", "--slots", "5", "--source", "f", "--fault", cell];
        let _ = generate(&set, PROMPT, OUTPUTS, &rec, &args);
        let check = run(&["fault-check", "--cell", cell, rec.to_str().unwrap(), "--control", control.to_str().unwrap()]);
        assert_eq!(check.code, 0, "{cell} on a set: {}{}", check.stdout, check.stderr);
    }
}

/// F32, F16, Q8_0 and Q4_K_M × P, D, F × zero, LRU, prefetch and token passes, on the device:
/// every byte read goes through a window and a copy into the device's slot pools.
#[test]
fn plan_on_the_rpc_device_is_exact_and_copies_every_byte() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 42, &[]);
    for ty in ["f32", "f16", "q8_0", "q4_k_m"] {
        let model = quantized(dir.path(), &m, ty);
        let resident = dir.path().join(format!("{ty}-resident"));
        gen_on(&s, &model, &resident, &[]);
        let arms: [(&str, &[&str]); 7] = [
            ("p-zero", &["--source", "p", "--policy", "zero"]),
            ("p-pass2", &["--source", "p", "--token-pass", "2"]),
            ("d-lru3", &["--source", "d", "--policy", "lru:3"]),
            ("f-zero", &["--source", "f", "--policy", "zero"]),
            ("f-lru5", &["--source", "f", "--policy", "lru:5"]),
            ("f-prefetch", &["--source", "f", "--policy", "zero+prefetch"]),
            ("f-pass2", &["--source", "f", "--depth", "3", "--token-pass", "2"]),
        ];
        for (name, flags) in arms {
            let rec = dir.path().join(format!("{ty}-{name}"));
            let mut args = vec!["--experts", "plan", "--slots", "5"];
            args.extend_from_slice(flags);
            let v = gen_on(&s, &model, &rec, &args);
            assert_exact(&resident, &rec);
            let e = &v["experts"];
            assert_eq!(e["clean_closure"], true, "{ty} {name}: {}", e["closure"]);
            let mv = &e["telemetry"]["movement"];
            let logical = e["telemetry"]["q_run"]["logical_bytes"].as_u64().unwrap();
            // Device slots cannot be read into: nothing lands directly, every byte is copied.
            assert_eq!(mv["direct_bytes"].as_u64(), Some(0), "{ty} {name}: {mv}");
            assert_eq!(e["copy"]["bytes"].as_u64(), Some(logical), "{ty} {name}: copies {} of {logical} bytes read", e["copy"]);
            // The RPC device has asynchronous sets and events: every extent's copy was queued
            // on its copy stream with an event.
            let c = &e["copy"];
            assert_eq!(c["asynchronous"], serde_json::json!(["RPC0"]), "{ty} {name}: {c}");
            // The RPC device has no pinned host memory to offer: windows stay aligned mappings.
            assert_eq!(e["m_source_bound"]["windows_memory"], "aligned mapping (RPC0 offers no host buffer type)");
            assert!(c["synchronous"].is_null(), "{ty} {name}: {c}");
            assert_eq!(c["async_copies"], e["telemetry"]["q_run"]["reads"], "{ty} {name}: {c}");
            assert!(e["telemetry"]["copies_abandoned"].is_null(), "none abandoned");
            if name == "p-pass2" {
                // The later groups' reads landed before the pass returned: their copies were in
                // flight on the copy stream while the engine computed the earlier group.
                let t = &e["timeline"]["total"];
                assert!(t["copy_overlap_compute_ns"].as_u64().unwrap() > 0, "{ty} {name}: {t}");
                assert!(e["telemetry"]["harvested"].as_u64().unwrap() > 0, "{ty} {name}");
                let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("timeline.json")).unwrap()).unwrap();
                let events = f["events"].as_array().unwrap();
                let queued = events.iter().filter(|x| x["kind"] == "copy" && x["window"].is_u64()).count();
                let done = events.iter().filter(|x| x["kind"] == "copy_done").count();
                assert!(queued > 0 && queued == done, "{ty} {name}: {queued} copies queued, {done} seen complete");
            }
        }
    }
}

#[test]
fn the_device_budget_sizes_the_plan_on_the_rpc_device() {
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    // 4 layers x 32 experts of 768 KiB: a slot in every layer is 3 MiB on the device. The device
    // margin is 768 MiB at these budgets, so 800 MiB holds some of the 32 experts per layer.
    let m = forge(dir.path(), "m.gguf", 43, &["--layers", "4", "--experts", "32"]);
    let resident = dir.path().join("resident");
    gen_on(&s, &m, &resident, &[]);
    let rec = dir.path().join("sized");
    let v = gen_on(&s, &m, &rec, &["--experts", "plan", "--gpu-budget", "800M"]);
    assert_exact(&resident, &rec);
    let (e, n) = (&v["params"]["experts"], |v: &serde_json::Value| v.as_u64().unwrap());
    let b = &e["budget"];
    assert_eq!((&b["tier"], n(&b["budget"]), n(&b["logits"])), (&serde_json::json!("device"), 800 << 20, 0), "{b}");
    // The probe measured the device's buffers as the run then held them; the slots are what the
    // budget holds beyond them and the margin, and the run's pools on the device are those slots.
    let before = &v["params"]["placement"]["device_before_decode"];
    let rpc0 = before["buffers"].as_array().unwrap().iter().find(|x| x["device"] == "RPC0").expect("RPC0's buffers");
    assert_eq!(
        (n(&b["weights"]), n(&b["context"]), n(&b["compute"])),
        (n(&rpc0["model"]), n(&rpc0["context"]), n(&rpc0["compute"])),
        "{b} {rpc0}"
    );
    let need: u64 = ["weights", "context", "compute", "margin"].iter().map(|k| n(&b[*k])).sum();
    let slots = (n(&b["budget"]) - need) / n(&b["per_slot"]);
    assert!(slots > 1 && slots < 32, "{b}");
    assert_eq!((n(&e["slots"]), e["policy"].as_str()), (slots, Some(format!("lru:{slots}").as_str())), "{e}");
    assert_eq!(n(&rpc0["pools"]), slots * n(&b["per_slot"]), "{rpc0}");
    // A device budget below one slot per layer: one line naming the least budget, no record.
    let small = dir.path().join("small");
    let r =
        generate(&m, PROMPT, OUTPUTS, &small, &["--rpc", &s.endpoint, "--gpu-layers", "all", "--experts", "plan", "--gpu-budget", "770M"]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(
        lines[0].contains("--gpu-budget 807403520: too small")
            && lines[0].contains(&format!("the least budget that would is {} bytes", n(&b["least_budget"]))),
        "{}",
        lines[0]
    );
    assert!(!small.exists() && !dir.path().join("small.partial").exists());
}

#[test]
fn no_server_and_a_server_killed_mid_run_fail_closed_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 43, &[]);
    // Nothing listens: refused before the engine starts, with the fix named.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let none = format!("127.0.0.1:{port}");
    let r = generate(&m, PROMPT, 4, &dir.path().join("none"), &["--rpc", &none, "--gpu-layers", "all"]);
    assert_one_line_error(&r, &[&none, "device serve"]);
    assert!(!dir.path().join("none").exists() && !dir.path().join("none.partial").exists());
    // Offload asked for with no device at all (no GPU backend module is loaded unless
    // SOVEREIGN_BACKEND_DIR names one): refused, naming the devices found and the fixes,
    // rather than run on the CPU as if placed.
    if std::env::var_os("SOVEREIGN_BACKEND_DIR").is_none() {
        let r = generate(&m, PROMPT, 4, &dir.path().join("nodev"), &["--gpu-layers", "all"]);
        assert_one_line_error(&r, &["no GPU device is loaded", "devices found: CPU", "--rpc", "--backend-dir"]);
        assert!(!dir.path().join("nodev").exists());
    }
    // And without --gpu-layers the same run is fine.
    assert_eq!(generate(&m, PROMPT, 4, &dir.path().join("cpu"), &[]).code, 0);

    // The server dies while the run decodes: the run fails closed on record, nothing partial.
    let mut s = Server::start();
    let rec = dir.path().join("killed");
    let endpoint = s.endpoint.clone();
    let run = std::thread::spawn({
        let (m, rec) = (m.clone(), rec.clone());
        move || {
            generate(
                &m,
                PROMPT,
                3000,
                &rec,
                &["--rpc", &endpoint, "--gpu-layers", "all", "--experts", "plan", "--slots", "5", "--ignore-eos"],
            )
        }
    });
    std::thread::sleep(Duration::from_millis(1500));
    s.kill();
    let r = run.join().unwrap();
    assert_ne!(r.code, 0, "the run survived its device: {}", r.stdout);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains(rec.to_str().unwrap()), "{}", lines[0]);
    assert!(!dir.path().join("killed.partial").exists());
    assert_eq!(record(&rec)["outcome"], "failed");
}

/// Every deterministic fault cell through F with the slot pools on the device: fatal cells fail
/// closed, recoverable ones stay exact against the device's no-fault control.
#[test]
fn fault_cells_through_f_on_the_rpc_device_pass_their_validators() {
    const CELLS: &[&str] = FAULT_CELLS;
    let s = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 44, &[]);
    let cell_run = |rec: &Path, cell: &str| {
        let args = ["--rpc", &s.endpoint, "--gpu-layers", "all", "--experts", "plan", "--slots", "5", "--source", "f", "--fault", cell];
        generate(&m, "Deterministic faults, fail closed or stay exact.", 24, rec, &args)
    };
    let control = dir.path().join("none");
    assert_eq!(cell_run(&control, "none").code, 0);
    assert_eq!(record(&control)["experts"]["copy"]["devices"], serde_json::json!(["RPC0"]));
    for cell in CELLS {
        let rec = dir.path().join(cell);
        let r = cell_run(&rec, cell);
        let check = run(&["fault-check", "--cell", cell, rec.to_str().unwrap(), "--control", control.to_str().unwrap(), "--json"]);
        assert_eq!(check.code, 0, "{cell}: {}\n{}", check.stdout, r.stderr);
        let v: serde_json::Value = serde_json::from_str(&check.stdout).unwrap();
        if v["expect"] == "fatal" {
            assert_ne!(r.code, 0, "{cell}: a fatal cell must not report success");
            assert!(r.stderr.contains("failed closed"), "{cell}: rejects, not crashes: {}", r.stderr);
        } else {
            assert_eq!(r.code, 0, "{cell}: {}", r.stderr);
        }
    }
}

/// A campaign arm with `rpc: local` and `gpu_layers: all`: the runner starts a device server for
/// each of its cells and stops it after; the streamed cells on the device are exact against the
/// resident oracle on the CPU, and no server outlives the campaign.
#[test]
fn a_campaign_arm_on_a_local_rpc_device_runs_exact_and_leaves_no_server() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("campaigns");
    std::fs::create_dir_all(&dir).unwrap();
    let model = forge(tmp.path(), "tiny.gguf", 45, &[]);
    let prompt = dir.join("prompt.txt");
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("campaigns/prompts/demo.txt"), &prompt).unwrap();
    let (tree, patches) = build_identity();
    let sha = |p: &Path| sovereign::util::sha256_file(p).unwrap();
    let text = r#"id: rpc-local-1
model:
  path: ../tiny.gguf
  sha256: MODEL_SHA
workload:
  prompt_file: prompt.txt
  prompt_sha256: PROMPT_SHA
  prompt_tokens: 181
  outputs: 8
  ignore_eos: true
build:
  engine_tree_sha256: TREE
PATCHESarms:
  - id: oracle
    experts: resident
    threads: 2
  - id: device-F
    experts: plan
    slots: 5
    policy: "lru:3"
    source: f
    gpu_layers: all
    rpc: local
    threads: 2
  - id: device-F-capped
    experts: plan
    slots: 5
    policy: zero
    source: f
    gpu_layers: all
    rpc: local
    device_memory_cap_bytes: 167772160
    memory_cap_bytes: 2147483648
    threads: 2
schedule:
  lead: [oracle]
  blocks:
    preordered:
      - [device-F, device-F-capped]
      - [device-F-capped, device-F]
oracle:
  arm: oracle
  relation: all_surfaces
  horizon: 8
admission:
  require_exact: true
  min_headroom_bytes: 0
  max_limit_events: 0
stop:
  arm_after_admission_failure: true
  campaign_after_oracle_failure: true
repetition:
  outcome_selected_reruns: none
  max_interrupted_attempts: 3
"#
    .replace("MODEL_SHA", &sha(&model))
    .replace("PROMPT_SHA", &sha(&prompt))
    .replace("TREE", &tree)
    .replace("PATCHES", &patches);
    let file = dir.join("rpc.yaml");
    std::fs::write(&file, &text).unwrap();
    let results = tmp.path().join("results");
    // The runner's servers inherit this mark from its environment: any process still holding
    // it after the run is a server left running.
    let mark = format!("SOVEREIGN_TEST_MARK={}", tmp.path().display());
    let marked = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| std::fs::read(e.path().join("environ")).ok())
            .filter(|env| env.split(|&b| b == 0).any(|kv| kv == mark.as_bytes()))
            .count()
    };
    let r = bin()
        .env("SOVEREIGN_TEST_MARK", tmp.path())
        .args(["campaign", "run", file.to_str().unwrap(), "--results", results.to_str().unwrap(), "--no-progress"])
        .output()
        .unwrap();
    assert!(r.status.success(), "{}{}", String::from_utf8_lossy(&r.stdout), String::from_utf8_lossy(&r.stderr));
    assert_eq!(marked(), 0, "a device server outlived its cell");
    let out = tmp.path().join("export");
    ok(&["export", "--campaign", "rpc-local-1", "--results", results.to_str().unwrap(), "--out", out.to_str().unwrap()]);
    let mut rows = csv::Reader::from_path(out.join("cells.csv")).unwrap();
    let h = rows.headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    let rows: Vec<csv::StringRecord> = rows.records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 5);
    for r in rows.iter().filter(|r| r[col("arm")].starts_with("device-F")) {
        assert_eq!((&r[col("status")], &r[col("exact")]), ("completed", "true"), "{r:?}");
        let rec: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(results.join(&r[col("record")]).join("record.json")).unwrap()).unwrap();
        let p = &rec["params"]["placement"];
        assert_eq!(p["gpu_devices"], serde_json::json!(["RPC0"]), "{p}");
        assert_eq!(rec["experts"]["copy"]["devices"], serde_json::json!(["RPC0"]));
        if &r[col("arm")] == "device-F-capped" {
            // The device cap is the cell's budget: its buffers were checked against it before
            // decoding, and the server's own cgroup audited it hard; admission's device margin
            // holds on that audit.
            assert_eq!(p["gpu_budget"], 167772160u64, "{p}");
            assert!(p["device_before_decode"]["device_bytes"].as_u64().unwrap() <= 167772160, "{p}");
            assert_eq!(p["device_audit"]["limit"], 167772160u64, "{p}");
            let conj = rec["resources"]["admission"]["conjuncts"].as_array().unwrap();
            let margin = conj.iter().find(|c| c["name"] == "device margin").unwrap_or_else(|| panic!("{conj:?}"));
            assert_eq!(margin["passed"], true, "{margin}");
            assert!(margin["value"].as_str().unwrap().contains("device server cgroup peak, hard"), "{margin}");
        } else {
            assert!(p["device_audit"].is_null(), "{p}");
        }
    }
    // `rpc` without `gpu_layers` is refused by the check, with its position.
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, text.replace("    gpu_layers: all\n", "").replace("id: rpc-local-1", "id: rpc-local-bad")).unwrap();
    let r = run(&["campaign", "check", bad.to_str().unwrap()]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("`rpc` needs `gpu_layers`"), "{}", r.stderr);
    // A device cap needs a device server to cap.
    let bad = dir.join("bad-cap.yaml");
    std::fs::write(
        &bad,
        text.replacen(
            "    rpc: local
    device_memory_cap_bytes",
            "    device_memory_cap_bytes",
            1,
        )
        .replace("id: rpc-local-1", "id: rpc-local-bad-cap"),
    )
    .unwrap();
    let r = run(&["campaign", "check", bad.to_str().unwrap()]);
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("`device_memory_cap_bytes` caps the `rpc: local` device server"), "{}", r.stderr);
}

/// A device with a hard memory bound: a server in its own memory cgroup. Pools that fit run
/// exactly with its peak under the cap; a cap they do not fit kills the device (OOM) and the run
/// fails closed with one line, a failed record and nothing partial.
#[test]
fn a_capped_device_bounds_its_memory_and_a_cap_too_small_fails_the_run_closed() {
    if !cgroups_usable() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 46, &[]);
    let cpu = dir.path().join("cpu");
    // A context of 4096 puts tens of MiB of KV cache on the device: the caps below are sized
    // against it (a context sized to this short work would fit them).
    assert_eq!(generate(&m, PROMPT, OUTPUTS, &cpu, &["--ctx", "4096"]).code, 0);
    let plan = ["--experts", "plan", "--slots", "5", "--source", "f", "--ctx", "4096"];
    // Runs on a server capped at `cap`; with a budget, the run checks its buffers against it
    // before decoding and audits the server's cgroup (the path the server prints) after.
    // `audit`: None runs without telling the run about the cap; Some(budget) passes the server's
    // cgroup (and the budget, if any).
    let capped = |cap: &str, rec: &Path, audit: Option<Option<&str>>| {
        let log = dir.path().join(format!("server-{cap}-{}.log", rec.file_name().unwrap().to_str().unwrap()));
        let mut s = Server::start_with(&["--memory-max", cap], Stdio::from(std::fs::File::create(&log).unwrap()));
        let started = std::fs::read_to_string(&log).unwrap();
        let cgroup =
            started.split("--device-cgroup ").nth(1).map(|t| t.trim().to_string()).unwrap_or_else(|| panic!("no cgroup in {started}"));
        let mut args = vec!["--rpc", s.endpoint.as_str(), "--gpu-layers", "all"];
        args.extend_from_slice(&plan);
        if let Some(budget) = audit {
            args.extend_from_slice(&["--device-cgroup", cgroup.as_str()]);
            if let Some(b) = budget {
                args.extend_from_slice(&["--gpu-budget", b]);
            }
        }
        let r = generate(&m, PROMPT, OUTPUTS, rec, &args);
        s.terminate();
        (r, std::fs::read_to_string(&log).unwrap())
    };
    let number = |log: &str, what: &str| -> u64 {
        let at = log.find(what).unwrap_or_else(|| panic!("no {what:?} in {log}")) + what.len();
        log[at..].split(|c: char| !c.is_ascii_digit()).next().unwrap().parse().unwrap()
    };
    let fits = dir.path().join("fits");
    let (r, log) = capped("160M", &fits, Some(Some("160M")));
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert_exact(&cpu, &fits);
    let limit = number(&log, "memory limit ");
    assert_eq!(limit, 160 << 20, "{log}");
    let peak = number(&log, "peak ");
    assert!(peak > 0 && peak <= limit, "{log}");
    assert_eq!(number(&log, "OOM kills "), 0, "{log}");
    // Admitted: its buffers on the device fit the budget before decoding, and the device
    // server's own cgroup, read by the run, puts the kernel's peak on record under it.
    let p = &record(&fits)["params"]["placement"];
    let before = &p["device_before_decode"];
    let on_device = before["device_bytes"].as_u64().unwrap();
    let rpc0 = before["buffers"].as_array().unwrap().iter().find(|b| b["device"] == "RPC0").expect("RPC0's buffers");
    let parts: u64 = ["model", "context", "compute", "pools"].iter().map(|k| rpc0[*k].as_u64().unwrap()).sum();
    assert!(on_device > 0 && on_device == parts && on_device <= limit && rpc0["pools"].as_u64().unwrap() > 0, "{before}");
    let audit = &p["device_audit"];
    assert_eq!((audit["limit"].as_u64(), audit["oom_kills"].as_u64()), (Some(limit), Some(0)), "{audit}");
    assert!(audit["peak"].as_u64().unwrap() > 0 && audit["peak"].as_u64().unwrap() <= limit, "{audit}");
    let cert = run(&["certificate", "show", fits.to_str().unwrap(), "--json"]);
    let cert: serde_json::Value = serde_json::from_str(&cert.stdout).unwrap_or_else(|e| panic!("{e}: {}{}", cert.stdout, cert.stderr));
    let device = &cert["certificate"]["boundaries"]["device"];
    assert_eq!((device["grade"].as_str(), device["bytes"].as_u64()), (Some("hard_limit"), Some(limit)), "{device}");

    // A budget the buffers do not fit: refused before decoding, with one line, nothing on record.
    let over = dir.path().join("over");
    let (r, _) = capped("160M", &over, Some(Some("16M")));
    assert_ne!(r.code, 0, "{}", r.stdout);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("--gpu-budget 16777216") && lines[0].contains("RPC0") && lines[0].contains("refused"), "{}", lines[0]);
    assert!(!over.exists() && !dir.path().join("over.partial").exists());

    // A cap the buffers do not fit, told to the run: refused before decoding from the buffers'
    // sizes, and the device is never pushed into its limit.
    let told = dir.path().join("told");
    let (r, log) = capped("24M", &told, Some(None));
    assert_ne!(r.code, 0, "{}", r.stdout);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.starts_with("error")).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("memory cap is 25165824 bytes") && lines[0].contains("refused"), "{}", lines[0]);
    assert!(!told.exists() && !dir.path().join("told.partial").exists());
    assert_eq!((number(&log, "OOM kills "), number(&log, "limit events ")), (0, 0), "{log}");

    // The same cap, not told to the run: the kernel stops the device, and the run fails closed.
    let small = dir.path().join("small");
    let (r, log) = capped("24M", &small, None);
    assert_ne!(r.code, 0, "{}", r.stdout);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains(small.to_str().unwrap()), "{}", lines[0]);
    assert!(number(&log, "OOM kills ") >= 1 || number(&log, "limit events ") >= 1, "{log}");
    assert!(!dir.path().join("small.partial").exists());
    assert_eq!(record(&small)["outcome"], "failed");
}

//! The Plan through the real engine: every surface exact against resident weights, for several
//! weight types, sources, slot counts below a prefill's distinct experts, and LRU sizes from 0
//! to all experts; LRU exact against zero; clean closure; less peak memory than resident.

use crate::common;

use common::*;
use std::path::Path;

const PROMPT: &str = "Experts move from storage into bounded slots; every output byte must match the resident run.";
const OUTPUTS: u32 = 64;

fn gen(model: &Path, rec: &Path, extra: &[&str]) -> serde_json::Value {
    gen_n(model, rec, OUTPUTS, extra)
}

fn gen_n(model: &Path, rec: &Path, outputs: u32, extra: &[&str]) -> serde_json::Value {
    let r = generate(model, PROMPT, outputs, rec, extra);
    assert_eq!(r.code, 0, "generate {extra:?}: {}{}", r.stdout, r.stderr);
    serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
}

fn assert_exact(a: &Path, b: &Path) {
    let r = run(&["compare", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_eq!(r.code, 0, "{} vs {}:\n{}", a.display(), b.display(), r.stdout);
}

fn assert_clean(rec: &serde_json::Value) {
    let e = &rec["experts"];
    assert_eq!(e["clean_closure"], true, "{}", e["closure"]);
    assert_eq!(e["closure"]["active_tickets"], 0);
    assert_eq!(e["closure"]["windows_free"], e["closure"]["windows_total"]);
    let t = &e["telemetry"];
    assert_eq!(t["u_sem_lb"]["duplicates"], 0);
    assert_eq!(t["u_sem_lb"]["overlaps"], 0);
}

#[test]
fn plan_is_exact_for_every_type_and_source() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 31, &[]);
    for ty in ["f32", "f16", "q8_0", "q4_k_m"] {
        let model = quantized(dir.path(), &m, ty);
        let resident = dir.path().join(format!("{ty}-resident"));
        gen(&model, &resident, &[]);
        // tiny: 16 experts, top-4; the prompt's prefill selects all 16 in every layer, so 5 slots
        // serve it in 4 passes and each decode step in one or two.
        for (source, policy) in [("p", "zero"), ("d", "lru:3"), ("f", "lru:5"), ("f", "zero+prefetch")] {
            let rec = dir.path().join(format!("{ty}-{source}-{}", policy.replace(':', "")));
            let r = gen(&model, &rec, &["--experts", "plan", "--slots", "5", "--source", source, "--policy", policy]);
            assert_exact(&resident, &rec);
            assert_clean(&r);
            let t = &r["experts"]["telemetry"];
            assert_eq!(t["u_sem_lb"]["objects"], 48, "every expert of the 3 layers was selected");
            assert!(t["q_run"]["logical_bytes"].as_u64().unwrap() > t["u_sched"]["bytes"].as_u64().unwrap(), "rereads counted");
        }
    }
}

#[test]
fn lru_sizes_from_zero_to_all_experts_are_exact_against_zero() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 32, &[]);
    let zero = dir.path().join("zero");
    let z = gen(&m, &zero, &["--experts", "plan", "--slots", "16", "--policy", "zero"]);
    assert_eq!(z["experts"]["telemetry"]["hits"], 0, "zero never reuses across events");
    let mut last_misses = u64::MAX;
    for k in [1, 4, 8, 16] {
        let rec = dir.path().join(format!("lru{k}"));
        let r = gen(&m, &rec, &["--experts", "plan", "--slots", "16", "--policy", &format!("lru:{k}")]);
        assert_exact(&zero, &rec);
        assert_clean(&r);
        let misses = r["experts"]["telemetry"]["misses"].as_u64().unwrap();
        assert!(misses <= last_misses, "a larger LRU never misses more ({k}: {misses} > {last_misses})");
        last_misses = misses;
        if k == 16 {
            // Everything fits: each object is loaded once.
            assert_eq!(r["experts"]["telemetry"]["loads"], 48);
        }
    }
}

#[test]
fn plan_peak_memory_is_below_resident_by_the_unheld_expert_bytes() {
    let dir = tempfile::tempdir().unwrap();
    // 4 layers x 32 experts of 768 KiB: 96 MiB of experts, 4 slots per layer hold 12 MiB.
    let m = forge(dir.path(), "m.gguf", 33, &["--layers", "4", "--experts", "32"]);
    let resident = gen(&m, &dir.path().join("resident"), &[]);
    let plan = gen(&m, &dir.path().join("plan"), &["--experts", "plan", "--slots", "4", "--source", "d"]);
    let hwm = |r: &serde_json::Value| r["process"]["vm_hwm_bytes"].as_u64().unwrap();
    let expert_bytes = plan["model"]["expert_bytes"].as_u64().unwrap();
    let pools = plan["experts"]["manifest"]["slot_pool_bytes"].as_u64().unwrap();
    let windows = plan["experts"]["m_source_bound"]["windows_bytes"].as_u64().unwrap();
    // Expert bytes outside the Plan's own bounded memory (slot pools and windows), less an
    // allowance of 12 MiB for M_meta: the larger graph of the passes (llama.cpp sizes graph
    // metadata by node count), tickets, telemetry, allocator rounding and arenas (seed 000 eq.
    // (5)). The plan run's peak was seen 52 MiB on a quiet machine and 60 MiB under a parallel
    // test load, against 80 MiB unheld.
    let unheld = expert_bytes - pools - windows;
    let m_meta = 12 << 20;
    assert!(
        hwm(&resident) + m_meta >= hwm(&plan) + unheld,
        "resident peak {} should exceed plan peak {} by at least {unheld} - {m_meta}",
        hwm(&resident),
        hwm(&plan)
    );
}

#[test]
fn many_passes_per_layer_fit_the_graph_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    // 6 layers x 64 small experts and 2 slots: up to 32 passes per prefill layer, far more
    // graph nodes than the resident graph is sized for.
    let m = forge(dir.path(), "m.gguf", 34, &["--layers", "6", "--experts", "64", "--expert-ff", "64"]);
    let resident = dir.path().join("resident");
    gen(&m, &resident, &[]);
    let rec = dir.path().join("plan");
    let r = gen(&m, &rec, &["--experts", "plan", "--slots", "2", "--source", "f"]);
    assert_exact(&resident, &rec);
    assert_clean(&r);
    // The prompt's share of the steps: its ubatch, tokens and bytes; every byte read falls in
    // some step, and each step after the prompt is one token.
    let (steps, pre) = (&r["experts"]["steps"], &r["experts"]["prefill"]);
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    let bytes: Vec<u64> = steps["read_bytes"].as_array().unwrap().iter().map(n).collect();
    let tokens: Vec<u64> = steps["tokens"].as_array().unwrap().iter().map(n).collect();
    assert_eq!(bytes.len(), steps["per_step"].as_array().unwrap().len());
    assert_eq!(bytes.iter().sum::<u64>(), n(&r["experts"]["telemetry"]["q_run"]["logical_bytes"]));
    assert_eq!(n(&pre["tokens"]), n(&r["counts"]["prompt_tokens"]), "{pre}");
    assert_eq!((n(&pre["steps"]), n(&pre["read_bytes"])), (1, bytes[0]));
    assert!(bytes[0] > 0 && tokens[0] > 1 && tokens[1..].iter().all(|&t| t == 1), "{tokens:?}");
    let per_token = pre["bytes_per_token"].as_f64().unwrap();
    assert_eq!(per_token, bytes[0] as f64 / tokens[0] as f64);
}

#[test]
fn prompt_passes_read_the_next_group_under_compute_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    // 64 experts: the prompt selects far more than the slots hold, so its ubatch runs in
    // passes, each group read while the one before it computes.
    let m = forge(dir.path(), "m.gguf", 35, &["--layers", "4", "--experts", "64", "--expert-ff", "64"]);
    let resident = dir.path().join("resident");
    gen(&m, &resident, &[]);
    let n = |v: &serde_json::Value| v.as_u64();
    let from = |v: &serde_json::Value| v.as_str().map(str::to_string);
    // (flags, prompt pass, where it came from): the default at 32 slots (half of them), given,
    // given with LRU, off, and none by default where half the slots is a small pass.
    type PassCell<'a> = (&'a str, &'a [&'a str], Option<u64>, Option<&'a str>);
    let cells: [PassCell; 5] = [
        ("sized", &["--slots", "32"], Some(16), Some("manifest")),
        ("given", &["--slots", "8", "--prompt-pass", "3"], Some(3), Some("flags")),
        ("lru", &["--slots", "8", "--prompt-pass", "4", "--policy", "lru:8"], Some(4), Some("flags")),
        ("off", &["--slots", "8", "--prompt-pass", "0"], None, Some("flags")),
        ("small", &["--slots", "8"], None, None),
    ];
    let mut passes = Vec::new();
    for (name, flags, pass, source) in cells {
        let rec = dir.path().join(name);
        let mut args = vec!["--experts", "plan", "--source", "f"];
        args.extend_from_slice(flags);
        let r = gen(&m, &rec, &args);
        assert_exact(&resident, &rec);
        assert_clean(&r);
        let (p, sizing) = (&r["params"]["experts"], &r["params"]["experts"]["sizing"]);
        assert_eq!(
            (n(&p["prompt_pass"]), n(&sizing["prompt_pass"]), from(&sizing["prompt_pass_from"]).as_deref()),
            (pass, pass, source),
            "{name}: {p}"
        );
        passes.push(r["experts"]["selections"]["layers"][0]["passes"].as_u64().unwrap());
        // The timeline sums the prompt: its reads are the prefill's, every pass it acquired was
        // released, and busy and idle split its wall time exactly.
        let pt = &r["experts"]["timeline"]["prompt"];
        assert_eq!(n(&pt["read_bytes"]), n(&r["experts"]["prefill"]["read_bytes"]), "{name}: {pt}");
        assert!(n(&pt["acquires"]).unwrap() >= 4 && pt["acquires"] == pt["releases"], "{name}: {pt}");
        assert_eq!(n(&pt["busy_ns"]).unwrap() + n(&pt["idle_ns"]).unwrap(), n(&pt["wall_ns"]).unwrap(), "{name}: {pt}");
    }
    // Passes of 3 experts take more engine passes than passes of the 8 slots.
    assert!(passes[1] > passes[3], "{passes:?}");
    // A prompt pass over the slots, or beside a fault cell, is refused in one line.
    let bad = dir.path().join("bad");
    let r = generate(&m, PROMPT, OUTPUTS, &bad, &["--experts", "plan", "--source", "f", "--slots", "8", "--prompt-pass", "9"]);
    assert_one_line_error(&r, &["prompt pass of 9"]);
    let r = generate(
        &m,
        PROMPT,
        OUTPUTS,
        &bad,
        &["--experts", "plan", "--source", "f", "--slots", "8", "--prompt-pass", "2", "--fault", "eio"],
    );
    assert_one_line_error(&r, &["prompt passes are not combined with fault cells"]);
}

#[test]
fn two_shared_layer_buffers_stream_layer_by_layer_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    // Four layers: layers 0 and 2 share buffer 0, layers 1 and 3 buffer 1.
    let m = forge(dir.path(), "m.gguf", 33, &["--layers", "4"]);
    let resident = dir.path().join("resident");
    gen(&m, &resident, &[]);
    let own = dir.path().join("own");
    let o = gen(&m, &own, &["--experts", "plan", "--slots", "16", "--policy", "zero"]);
    for (name, policy, slots) in [("whole", "zero+prefetch", "16"), ("groups", "zero", "6"), ("lru", "lru:8+prefetch", "16")] {
        let rec = dir.path().join(name);
        let r = gen(&m, &rec, &["--experts", "plan", "--slots", slots, "--policy", policy, "--layer-buffers", "2"]);
        assert_exact(&resident, &rec);
        assert_clean(&r);
        let man = &r["experts"]["manifest"];
        assert_eq!(man["layer_buffers"], 2);
        // Two layers' pools instead of four, each of exactly its slots; a pool laid out for direct
        // reads holds a page of head room and tail per slot at most.
        let n = |v: &serde_json::Value| v.as_u64().unwrap();
        let per_slot = n(&man["managed_bytes"]) / n(&man["objects"]);
        let slots: u64 = slots.parse().unwrap();
        let (got, packed) = (man["slot_pool_bytes"].as_u64().unwrap(), 2 * per_slot * slots);
        assert!(got >= packed && got <= packed + 2 * 3 * (slots + 1) * 4096, "{name}: {got} for {packed} packed");
        assert!(o["experts"]["manifest"]["slot_pool_bytes"].as_u64().unwrap() >= 2 * packed, "{}", o["experts"]["manifest"]);
        if name == "lru" {
            // Cached experts of a layer are evicted when the layer sharing its buffer loads.
            assert!(r["experts"]["telemetry"]["buffer_evictions"].as_u64().unwrap() > 0);
        }
    }
    // Nothing may be pinned in shared memory, and one buffer cannot overlap loading and compute.
    let bad = dir.path().join("bad");
    let r = generate(&m, PROMPT, OUTPUTS, &bad, &["--experts", "plan", "--layer-buffers", "2", "--policy", "pin:0/1"]);
    assert_one_line_error(&r, &["pinned"]);
    let r = generate(&m, PROMPT, OUTPUTS, &bad, &["--experts", "plan", "--layer-buffers", "1"]);
    assert_one_line_error(&r, &["layer buffers"]);
}

#[test]
fn manifest_sized_f_with_coalesced_and_direct_reads_is_exact() {
    let dir = tempfile::tempdir().unwrap();
    // Every F32 expert extent (256 KiB) of a tensor starts at one offset within a page, at any
    // tensor alignment (4096, 64, and 32 as downloaded GGUFs have): the engine's host slots are
    // laid out at that offset, so F reads each extent's covering range straight into its slot;
    // neighbours in a tensor go out as one read where they abut. Q8_0 experts of an FFN of 256
    // are 17 pages each and read straight in too; of 288 they are not whole pages, their
    // offsets vary, and they go through windows.
    let aligned = forge(dir.path(), "a.gguf", 35, &["--alignment", "4096"]);
    let a64 = forge(dir.path(), "a64.gguf", 35, &["--alignment", "64"]);
    let unaligned = forge(dir.path(), "u.gguf", 35, &[]);
    let sub = |d: &str| {
        let p = dir.path().join(d);
        std::fs::create_dir_all(&p).unwrap();
        p
    };
    let q8 = quantized(&sub("q"), &unaligned, "q8_0");
    let ff288 = forge(dir.path(), "ff288.gguf", 35, &["--expert-ff", "288"]);
    let odd = quantized(&sub("odd"), &ff288, "q8_0");
    for (name, m) in [("aligned", &aligned), ("a64", &a64), ("unaligned", &unaligned), ("q8_0", &q8), ("odd", &odd)] {
        let resident = dir.path().join(format!("{name}-resident"));
        gen(m, &resident, &[]);
        for (source, policy) in [("f", "zero"), ("f", "lru:3+prefetch"), ("d", "zero")] {
            let rec = dir.path().join(format!("{name}-{source}-{}", policy.replace([':', '+'], "")));
            let r = gen(m, &rec, &["--experts", "plan", "--slots", "5", "--source", source, "--policy", policy]);
            assert_exact(&resident, &rec);
            assert_clean(&r);
            let sizing = &r["params"]["experts"]["sizing"];
            let mv = &r["experts"]["telemetry"]["movement"];
            let t = &r["experts"]["telemetry"];
            let n = |v: &serde_json::Value| v.as_u64().unwrap();
            // The CPU's pools are plain host memory: copies are synchronous, and the record says so.
            let c = &r["experts"]["copy"];
            assert_eq!(r["experts"]["m_source_bound"]["windows_memory"], "aligned mapping (every layer on the CPU)");
            assert_eq!(
                (&c["synchronous"], &c["asynchronous"], &c["async_copies"]),
                (&serde_json::json!(["CPU"]), &serde_json::Value::Null, &serde_json::Value::Null),
                "{c}"
            );
            if source == "d" {
                // D stays the one-window synchronous baseline: one read per extent, via its window.
                assert_eq!(
                    (n(&sizing["windows"]), n(&mv["sqes"]), n(&mv["coalesced_sqes"]), n(&mv["direct_bytes"])),
                    (1, n(&t["q_run"]["reads"]), 0, 0),
                    "{mv}"
                );
                continue;
            }
            // Sized from the manifest: one window per slot (a pass's misses), one bundle's 3
            // extents in flight, and a decode token in passes of a quarter of its 4 experts.
            assert_eq!(sizing["from"], "manifest", "{sizing}");
            assert_eq!((n(&sizing["windows"]), n(&sizing["depth"])), (5, 3), "{sizing}");
            assert_eq!((n(&sizing["token_pass"]), &sizing["token_pass_from"]), (1, &serde_json::json!("manifest")), "{sizing}");
            assert_eq!(
                (&r["params"]["experts"]["depth"], &r["params"]["experts"]["token_pass"]),
                (&serde_json::json!(3), &serde_json::json!(1))
            );
            assert_eq!(r["experts"]["m_source_bound"]["n_windows"], 5);
            assert_eq!(n(&mv["direct_bytes"]) + n(&mv["window_bytes"]), n(&t["q_run"]["logical_bytes"]), "{mv}");
            if name == "odd" {
                assert_eq!((n(&mv["direct_bytes"]), n(&mv["host_pools_direct"]), n(&mv["host_pools_windowed"])), (0, 0, 9), "{mv}");
            } else {
                assert_eq!(
                    (n(&mv["window_bytes"]), n(&r["experts"]["copy"]["bytes"])),
                    (0, 0),
                    "every extent went straight to its slot: {mv}"
                );
                assert_eq!((n(&mv["host_pools_direct"]), n(&mv["host_pools_windowed"])), (9, 0), "{mv}");
            }
        }
    }
    // Flags still win, and the record says so; with a whole token in one pass and a layer's
    // reads in flight together, neighbours in a tensor go out as one read.
    let rec = dir.path().join("flags");
    let r = gen(
        &aligned,
        &rec,
        &["--experts", "plan", "--slots", "5", "--source", "f", "--windows", "5", "--depth", "15", "--token-pass", "4"],
    );
    let sizing = &r["params"]["experts"]["sizing"];
    assert_eq!((&sizing["from"], &sizing["token_pass_from"]), (&serde_json::json!("flags"), &serde_json::json!("flags")), "{sizing}");
    assert_eq!((r["params"]["experts"]["windows"].as_u64(), r["params"]["experts"]["depth"].as_u64()), (Some(5), Some(15)));
    let (mv, reads) = (&r["experts"]["telemetry"]["movement"], r["experts"]["telemetry"]["q_run"]["reads"].as_u64().unwrap());
    assert!(mv["coalesced_sqes"].as_u64().unwrap() > 0 && mv["sqes"].as_u64().unwrap() < reads, "{mv}");
    assert_exact(&dir.path().join("aligned-resident"), &rec);
}

#[test]
fn token_passes_stream_a_layer_in_groups_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "a.gguf", 36, &["--alignment", "4096"]);
    let resident = dir.path().join("resident");
    gen(&m, &resident, &[]);
    let one = dir.path().join("one");
    let o = gen(&m, &one, &["--experts", "plan", "--slots", "5", "--source", "f", "--depth", "3", "--token-pass", "4"]);
    // tiny: top-4, so a decode step is served in 4 passes of one expert or 2 of two, the
    // later groups read while the engine computes the first ones.
    for (pass, source, policy) in [("1", "f", "zero"), ("2", "f", "lru:5"), ("2", "d", "zero")] {
        let rec = dir.path().join(format!("t{pass}-{source}-{}", policy.replace(':', "")));
        let r = gen(
            &m,
            &rec,
            &["--experts", "plan", "--slots", "5", "--source", source, "--depth", "3", "--token-pass", pass, "--policy", policy],
        );
        assert_exact(&resident, &rec);
        assert_clean(&r);
        assert_eq!(r["params"]["experts"]["token_pass"], pass.parse::<u32>().unwrap());
        let per_step = 4 / pass.parse::<u64>().unwrap();
        let calls = |v: &serde_json::Value| v["experts"]["acquire_calls"].as_u64().unwrap();
        // Every decode step of every layer takes per_step acquires instead of one.
        let decode_events = u64::from(OUTPUTS - 1) * 3;
        if policy == "zero" && source == "f" {
            assert_eq!(calls(&r) - calls(&o), decode_events * (per_step - 1), "{}", r["experts"]);
        }
    }
    for bad in ["0", "6"] {
        let r = generate(&m, PROMPT, OUTPUTS, &dir.path().join("bad"), &["--experts", "plan", "--slots", "5", "--token-pass", bad]);
        assert_one_line_error(&r, &["token pass"]);
    }
}

#[test]
fn default_threads_decode_streamed_on_every_core_and_stay_exact() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 36, &[]);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    // No --threads: what each run decodes and takes its prompt on, as its record names them.
    let bare = |name: &str, extra: &[&str]| {
        let rec = dir.path().join(name);
        let mut args =
            vec!["generate", "--model", m.to_str().unwrap(), "--prompt", PROMPT, "--n-predict", "16", "--record", rec.to_str().unwrap()];
        args.extend_from_slice(extra);
        let r = run(&args);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        let p = serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()["params"]
            .clone();
        let decode = p["threads"].as_u64().unwrap();
        (rec, decode, p.get("threads_batch").map(|b| b.as_u64().unwrap()))
    };
    let plan = ["--experts", "plan", "--slots", "5", "--source", "f", "--policy", "zero"];
    let (resident, t, b) = bare("resident", &[]);
    assert_eq!((t, b), (cores, None));
    let (streamed, t, b) = bare("streamed", &plan);
    assert_eq!((t, b), (cores, None));
    assert_exact(&resident, &streamed);
    // Named counts win, and a named --threads sets the prompt's too.
    let (named, t, b) = bare("named", &[&plan[..], &["--threads", "2"]].concat());
    assert_eq!((t, b), (2, None));
    assert_exact(&resident, &named);
    let (apart, t, b) = bare("apart", &[&plan[..], &["--threads", "1", "--threads-batch", "2"]].concat());
    assert_eq!((t, b), (1, Some(2)));
    assert_exact(&resident, &apart);
    let r = run(&[
        "generate",
        "--model",
        m.to_str().unwrap(),
        "--prompt",
        PROMPT,
        "--threads-batch",
        "0",
        "--record",
        dir.path().join("bad").to_str().unwrap(),
    ]);
    assert_one_line_error(&r, &["--threads-batch 0 is out of range"]);
}

/// `model split` of `m` into a set of about `n` shards by tensor count; its first file.
fn split(m: &Path, prefix: &Path, max_tensors: u32) -> std::path::PathBuf {
    let r = ok(&["model", "split", m.to_str().unwrap(), prefix.to_str().unwrap(), "--max-tensors", &max_tensors.to_string(), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    let shards = v["shards"].as_array().unwrap();
    assert!(shards.len() >= 3, "{} shards", shards.len());
    std::path::PathBuf::from(shards[0]["path"].as_str().unwrap())
}

/// Outputs of each shard-set run: the prompt's prefill already selects every expert.
const SET_OUTPUTS: u32 = 16;

/// A model split into a shard set runs, resident and through every source, bitwise as the same
/// model in one file: four families, alignments 32 and 4096, F32, Q8_0 and Q4_K_M, the set
/// named by its first shard or by another. Its records name the set and each shard's SHA-256.
#[test]
fn a_shard_set_is_exact_against_its_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases: [(&str, &str, &str, &[&[&str]]); 5] = [
        (
            "qwen3moe",
            "32",
            "f32",
            &[
                &["--source", "p"],
                &["--source", "d", "--policy", "lru:3"],
                &["--source", "f", "--policy", "lru:5"],
                &["--source", "f", "--policy", "zero+prefetch"],
                &["--source", "f", "--token-pass", "2"],
            ],
        ),
        ("qwen3next", "32", "q8_0", &[&["--source", "f"], &["--source", "p", "--policy", "lru:3"]]),
        ("gemma4", "4096", "f32", &[&["--source", "f"], &["--source", "d"]]),
        ("deepseek2", "32", "q4_k_m", &[&["--source", "f", "--policy", "lru:5"]]),
        ("qwen3moe", "4096", "f32", &[&["--source", "f"]]),
    ];
    for (i, (arch, align, ty, arms)) in cases.into_iter().enumerate() {
        let name = format!("{arch}-{align}-{ty}");
        let m = forge(d, &format!("{name}.gguf"), 60 + i as u64, &["--arch", arch, "--alignment", align]);
        std::fs::create_dir_all(d.join(&name)).unwrap();
        let file = quantized(&d.join(&name), &m, ty);
        let first = split(&file, &d.join(format!("{name}-set")), 9);
        let one = d.join(format!("{name}-one"));
        let v1 = gen_n(&file, &one, SET_OUTPUTS, &[]);
        // Named by its first shard, and by its second.
        let second = first.to_str().unwrap().replace("-00001-of-", "-00002-of-");
        for (tag, model) in [("first", first.clone()), ("second", second.into())] {
            let rec = d.join(format!("{name}-set-resident-{tag}"));
            let v = gen_n(&model, &rec, SET_OUTPUTS, &[]);
            assert_exact(&one, &rec);
            let shards =
                v["model"]["shards"].as_array().unwrap_or_else(|| panic!("{name}: the record names the set's shards: {}", v["model"]));
            assert!(shards.len() >= 3 && shards.iter().all(|s| s["sha256"].as_str().is_some_and(|h| h.len() == 64)), "{name}: {shards:?}");
            assert_ne!(v["model"]["sha256"], v1["model"]["sha256"], "a set is named by its own digest");
            assert_eq!(v["model"]["file"], first.file_name().unwrap().to_str().unwrap(), "{name}: named by its first file");
            assert_eq!(v["model"]["t_repr_bytes"], v1["model"]["t_repr_bytes"], "{name}");
        }
        for (j, flags) in arms.iter().enumerate() {
            let rec = d.join(format!("{name}-set-{j}"));
            let mut args = vec!["--experts", "plan", "--slots", "5"];
            args.extend_from_slice(flags);
            let v = gen_n(&first, &rec, SET_OUTPUTS, &args);
            assert_exact(&one, &rec);
            assert_clean(&v);
            let t = &v["experts"]["telemetry"];
            // Every extent read was verified against the set's manifest, the one the record names.
            assert!(t["digests"]["extents"].as_u64().unwrap() > 0, "{name} {flags:?}: {}", t["digests"]);
            assert_eq!(t["digests"]["manifest_sha256"], v["model"]["digests"]["manifest_sha256"], "{name} {flags:?}");
        }
    }
}

#[test]
fn f_takes_its_depth_from_the_device_profile_and_the_record_says_where_it_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let m = dir.path().join("small.gguf");
    ok(&["model", "forge", "--preset", "small", "--seed", "7", "--out", m.to_str().unwrap()]);
    // A cache of its own: the first F run on this device measures its profile.
    let cache = dir.path().join("cache");
    let gen_in = |rec: &str, extra: &[&str]| {
        let rec = dir.path().join(rec);
        let mut args = vec!["generate", "--model", m.to_str().unwrap(), "--prompt", PROMPT, "--n-predict", "4", "--threads", "2"];
        args.extend_from_slice(&["--experts", "plan", "--slots", "8", "--record", rec.to_str().unwrap()]);
        args.extend_from_slice(extra);
        let out = bin().env("SOVEREIGN_CACHE", &cache).args(&args).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_str::<serde_json::Value>(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap()
    };
    let r = gen_in("profiled", &[]);
    let sizing = &r["params"]["experts"]["sizing"];
    let d = &sizing["depth_device"];
    let n = |v: &serde_json::Value| v.as_u64().unwrap_or_else(|| panic!("{sizing}"));
    assert!(d["device"].as_str().is_some_and(|s| !s.is_empty()), "{sizing}");
    assert!(n(&d["block_bytes"]).is_power_of_two() && [1, 2, 4, 8, 16, 32].contains(&n(&d["depth"])), "{sizing}");
    assert!(n(&d["mib_per_s"]) > 0 && n(&d["mib_per_s"]) <= n(&d["best_mib_per_s"]), "{sizing}");
    // Read as a decode layer is: the experts a token selects, one read per extent (each role
    // is a tensor of its own in this layout, so an expert's extents are not neighbours).
    let inv: serde_json::Value = serde_json::from_str(&ok(&["inventory", m.to_str().unwrap(), "--json"]).stdout).unwrap();
    let extents = inv["objects"][0]["extents"].as_array().unwrap().len() as u64;
    assert_eq!((n(&d["burst_reads"]), n(&d["vector_blocks"])), (n(&inv["expert_used_count"]) * extents, 1), "{sizing}");
    assert_eq!(n(&sizing["depth"]), n(&d["depth"]).max(n(&sizing["extents_per_bundle"])), "{sizing}");
    assert_eq!(r["params"]["experts"]["depth"], sizing["depth"]);
    let profiles: Vec<_> = std::fs::read_dir(cache.join("devices"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(profiles.len(), 1, "one device, one block: one profile");
    let measured = std::fs::read_to_string(profiles[0].path()).unwrap();
    // Measured once: the next run reads it, the same figures on record.
    let again = gen_in("again", &[]);
    assert_eq!(again["params"]["experts"]["sizing"]["depth_device"], *d);
    assert_eq!(std::fs::read_to_string(profiles[0].path()).unwrap(), measured);
    // A depth given is the run's own, and no profile is named.
    let given = gen_in("given", &["--depth", "2"]);
    let s = &given["params"]["experts"]["sizing"];
    assert_eq!((n(&s["depth"]), s.get("depth_device")), (2, None), "{s}");
    assert_exact(&dir.path().join("profiled"), &dir.path().join("given"));
}

//! The bench as a campaign, scaled down to a forged tiny model: the shipped bench campaign's
//! arms and schedule run envelope and read_replay cells between the arms; each replay's reads
//! are F's own (count and bytes of its Plan's q_run), a replay derived with another arm's
//! settings or another run's routes fails that check, and the floor ratio is recomputed here
//! from the sealed records.

use crate::common;

use common::*;
use serde_json::Value;
use sovereign::cell::ReadReplayCell;
use sovereign::plan::{PlanOptions, SourceKind};
use sovereign::source::fault::FaultCell;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn json(p: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(p).unwrap()).unwrap()
}

/// `DIR/models/bench.gguf` (a forged tiny model) and `DIR/campaigns/bench.yaml`: the shipped
/// bench campaign on it with no caps, 4 slots, small envelope reads, the first two blocks, and
/// this build's identity.
fn scaled_bench(outputs: u32) -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let (dir, models) = (t.path(), t.path().join("models"));
    fs::create_dir_all(&models).unwrap();
    let model = &forge(&models, "bench.gguf", 1, &["--alignment", "4096"]);
    let mut text = fs::read_to_string(root().join("campaigns/bench.yaml")).unwrap();
    let subs = [
        ("971ca7bfa1e0d9df8942bb2e6645e8df78e8620ccfb6e68a1c04dbb790049aea", sovereign::util::sha256_file(model).unwrap()),
        // The stand-in model is forged here, not by the bench's recipe.
        ("  forge: { preset: bench, seed: 1 }\n", String::new()),
        ("slots: 16", "slots: 4".into()),
        ("token_pass: 8", "token_pass: 4".into()),
        ("\"lru:16\"", "\"lru:4\"".into()),
        ("outputs: 32", format!("outputs: {outputs}")),
        ("horizon: 32", format!("horizon: {outputs}")),
        ("block_bytes: 1048576", "block_bytes: 262144".into()),
        ("bytes_per_depth: 268435456", "bytes_per_depth: 4194304".into()),
        (
            concat!(
                "      - [envelope, compute, F, replay-F, D]\n      - [envelope, compute, D, F, replay-F]\n",
                "      - [envelope, compute, D, F, replay-F]\n      - [envelope, compute, F, replay-F, D]\n",
                "      - [envelope, compute, F, replay-F, D]\n      - [envelope, compute, D, F, replay-F]\n"
            ),
            String::new(),
        ),
        ("id: bench-5", "id: bench-tiny".into()),
    ];
    for (from, to) in subs {
        assert!(text.contains(from), "campaigns/bench.yaml no longer holds {from:?}");
        text = text.replacen(from, &to, 1);
    }
    text = text.lines().filter(|l| !l.trim_start().starts_with("memory_cap_bytes:")).collect::<Vec<_>>().join("\n") + "\n";
    let text = with_this_build(&text);
    let c = dir.join("campaigns");
    fs::create_dir_all(c.join("prompts")).unwrap();
    fs::copy(root().join("campaigns/prompts/demo.txt"), c.join("prompts/demo.txt")).unwrap();
    let file = c.join("bench.yaml");
    fs::write(&file, text).unwrap();
    (t, file)
}

/// A campaign's text with its `build:` block naming this build's engine tree and patches.
pub fn with_this_build(text: &str) -> String {
    let v: Value = serde_json::from_str(&ok(&["build-info", "--json"]).stdout).unwrap();
    let e = &v["engine"];
    let mut build = format!("build:\n  engine_tree_sha256: {}\n  patches:", e["tree_sha256"].as_str().unwrap());
    for p in e["patches"].as_array().unwrap() {
        build += &format!("\n    - {{ name: {}, sha256: {} }}", p["name"].as_str().unwrap(), p["sha256"].as_str().unwrap());
    }
    let (start, end) = (text.find("\nbuild:\n").unwrap() + 1, text.find("\narms:\n").unwrap());
    format!("{}{build}{}", &text[..start], &text[end..])
}

/// Decode seconds per decode token of a generate record.
fn s_per_token(rec: &Value) -> f64 {
    rec["timing"]["decode_s"].as_f64().unwrap() / (rec["counts"]["generated_tokens"].as_u64().unwrap() - 1) as f64
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * a.abs().max(b.abs())
}

#[test]
fn bench_campaign_interleaves_envelope_and_read_replay_and_reports_the_floor() {
    let (t, file) = scaled_bench(6);
    let results = t.path().join("results");
    ok(&["campaign", "run", s(&file), "--results", s(&results), "--no-progress"]);
    let out = t.path().join("export");
    let r = run(&["export", "--campaign", "bench-tiny", "--results", s(&results), "--out", s(&out)]);
    assert!(r.stdout.contains("replay-F") && r.stdout.contains("decode tok/s"), "{}", r.stdout);
    // On a shared 2-core machine a tiny model's resident cell can decode slower than F, and a
    // replay of reads just made can beat the envelope (the host caches them): then the floor
    // is mismeasured, and the analysis must say so instead of giving a ratio.
    let floor_valid = match r.code {
        0 => {
            assert!(r.stdout.contains("ratio to floor:"), "{}", r.stdout);
            true
        }
        1 => {
            let why = ["faster than the floor's", "faster than the envelope's", "more than the envelope's", "plus its device idle"];
            assert!(r.stderr.contains("ratio to floor: invalid measurement") && why.iter().any(|w| r.stderr.contains(w)), "{}", r.stderr);
            assert!(!r.stdout.contains("ratio to floor:") && !out.join("floor_summary.csv").exists(), "no ratio over a broken floor");
            false
        }
        c => panic!("export exited {c}: {}{}", r.stdout, r.stderr),
    };

    // Every cell sealed; records by cell key.
    let cells: Vec<csv::StringRecord> = csv::Reader::from_path(out.join("cells.csv")).unwrap().records().map(Result::unwrap).collect();
    let h = csv::Reader::from_path(out.join("cells.csv")).unwrap().headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    assert_eq!(cells.len(), 16);
    let dir_of = |key: &str| -> PathBuf {
        let row = cells.iter().find(|r| &r[col("cell")] == key).unwrap_or_else(|| panic!("no cell {key}"));
        assert_eq!(&row[col("status")], "completed", "{key}: {}", &row[col("error")]);
        results.join(&row[col("record")])
    };
    for row in &cells {
        assert_eq!(&row[col("status")], "completed", "{}: {}", &row[col("cell")], &row[col("error")]);
        // Every run is exact against the oracle; measurements compare nothing.
        let expect = match &row[col("measure")] {
            "" if &row[col("arm")] != "resident" => "true",
            _ => "",
        };
        assert_eq!(&row[col("exact")], expect, "{}", &row[col("cell")]);
    }

    // F names no tuning flag: its token pass is derived (tiny: top-4, passes of one expert),
    // the comparison arms keep theirs.
    let experts = |key: &str| json(&dir_of(key).join("record.json"))["params"]["experts"].clone();
    let f = experts("b01-p3-F");
    assert_eq!(
        (&f["token_pass"], &f["sizing"]["token_pass_from"], &f["sizing"]["from"]),
        (&Value::from(1), &Value::from("manifest"), &Value::from("manifest")),
        "{f}"
    );
    assert_eq!(
        (experts("b00-p4-F-deep")["token_pass"].clone(), experts("b00-p5-F-tuned")["token_pass"].clone()),
        (Value::from(4), Value::from(2))
    );
    // Nor threads: F and the warm resident compute decode and take their prompts on every core
    // of the machine that ran them, F-tuned on the two it names.
    let threads = |key: &str| {
        let p = json(&dir_of(key).join("record.json"))["params"].clone();
        let decode = p["threads"].as_u64().unwrap();
        (decode, p.get("threads_batch").map_or(decode, |b| b.as_u64().unwrap()))
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(threads("b01-p3-F"), (cores, cores));
    assert_eq!((threads("b00-p5-F-tuned"), threads("b01-p1-compute")), ((2, 2), (cores, cores)));
    // The compute term: each block's warm resident cell, its model read into the page cache
    // first (outside the cell's wall time).
    let model_bytes = fs::metadata(t.path().join("models/bench.gguf")).unwrap().len();
    let mut envelope_best = 0.0f64;
    let (mut ratios, mut reads, mut rates, mut idles, mut layered) = (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut plan_idles = Vec::new();
    let mut busies = Vec::new();
    let mut phases = Vec::new();
    for (block, f_key, replay_key, env_key, compute_key) in [
        (1, "b01-p3-F", "b01-p4-replay-F", "b01-p0-envelope", "b01-p1-compute"),
        (2, "b02-p2-F", "b02-p3-replay-F", "b02-p0-envelope", "b02-p1-compute"),
    ] {
        let warm = json(&dir_of(compute_key).join("cell.json"));
        assert_eq!(warm["outcome"]["warmed_bytes"], model_bytes, "{warm}");
        let compute = s_per_token(&json(&dir_of(compute_key).join("record.json")));
        let f = json(&dir_of(f_key).join("record.json"));
        let rep = json(&dir_of(replay_key).join("record.json"));
        let env = json(&dir_of(env_key).join("record.json"));
        assert_eq!(rep["format"], "sovereign.read_replay/1");
        assert_eq!(env["format"], "sovereign.envelope/1");
        // The replay names its block's F record, and reads at the deeper of the envelope's best
        // depth and F's own.
        let f_digest = dir_of(f_key).file_name().unwrap().to_str().unwrap().to_string();
        assert_eq!(rep["params"]["of_record"], f_digest.as_str());
        assert_eq!(rep["params"]["of_arm"], "F");
        let env_digest = dir_of(env_key).file_name().unwrap().to_str().unwrap().to_string();
        let best = env["cells"]
            .as_array()
            .unwrap()
            .iter()
            .max_by(|a, b| a["mib_per_s"].as_f64().unwrap().total_cmp(&b["mib_per_s"].as_f64().unwrap()))
            .unwrap();
        assert_eq!(env["best"]["depth"], best["depth"]);
        let (best, own) = (best["depth"].as_u64().unwrap(), f["params"]["experts"]["depth"].as_u64().unwrap());
        assert_eq!(rep["params"]["depth"].as_u64(), Some(best.max(own)), "{}", rep["params"]);
        let from = rep["params"]["depth_from"].as_str().unwrap();
        if own > best {
            assert_eq!(from, format!("arm F's own (record {f_digest}), deeper than envelope {env_digest}'s best"));
        } else {
            assert_eq!(from, format!("envelope {env_digest}"));
        }
        // Each depth submitted each way F submits reads (single reads, no field; vectored;
        // linked), each region read twice: the second read a cell of its own, marked.
        let cells = env["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 5 * 3 * 2);
        let patterns: Vec<Option<&str>> = cells.iter().step_by(2).map(|c| c.get("pattern").and_then(Value::as_str)).collect();
        assert_eq!(patterns, [None, Some("vectored"), Some("linked")].repeat(5));
        for pair in cells.chunks(2) {
            assert_eq!(
                (pair[0]["depth"].clone(), pair[0].get("pattern"), pair[0].get("reread"), &pair[1]["reread"]),
                (pair[1]["depth"].clone(), pair[1].get("pattern"), None, &Value::Bool(true))
            );
            for c in pair {
                assert_eq!(c["bytes"], 4194304u64, "{c}");
            }
        }
        // The replayed sequence is F's own reads: count and bytes of its Plan's q_run, prefill
        // and decode together, and one decode step per decode token.
        let q = &f["experts"]["telemetry"]["q_run"];
        let (pre, dec) = (&rep["prefill"], &rep["decode"]);
        let sum = |k: &str| pre[k].as_u64().unwrap() + dec[k].as_u64().unwrap();
        assert_eq!(sum("reads"), q["reads"].as_u64().unwrap(), "block {block}");
        assert_eq!(sum("logical_bytes"), q["logical_bytes"].as_u64().unwrap(), "block {block}");
        assert_eq!(sum("physical_bytes"), q["physical_bytes"].as_u64().unwrap(), "block {block}");
        assert!(dec["reads"].as_u64().unwrap() > 0);
        assert_eq!(dec["steps"].as_u64().unwrap(), f["counts"]["generated_tokens"].as_u64().unwrap() - 1);
        assert_eq!(rep["check"]["equal"], true);
        let per: Vec<f64> = dec["per_step_s"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let read = dec["seconds_per_step"].as_f64().unwrap();
        assert!(close(read, per.iter().sum::<f64>() / per.len() as f64));
        // Each phase is the fastest of the rounds that read the whole sequence.
        for ph in [pre, dec] {
            let rounds: Vec<f64> = ph["rounds_s"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
            assert_eq!(rounds.len(), sovereign::measure::REPLAY_ROUNDS, "{ph}");
            assert_eq!(ph["seconds"].as_f64().unwrap(), rounds.iter().copied().fold(f64::INFINITY, f64::min), "{ph}");
        }
        // The decode again with a barrier after every layer event: the same reads and steps,
        // its own times.
        let by_layer = &rep["decode_by_layer"];
        for k in ["steps", "reads", "logical_bytes", "physical_bytes"] {
            assert_eq!(by_layer[k], dec[k], "block {block}: {k}");
        }
        let per_layer: Vec<f64> = by_layer["per_step_s"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        assert_eq!(per_layer.len(), per.len());
        assert!(per_layer.iter().all(|&t| t > 0.0), "{per_layer:?}");
        let read_by_layer = by_layer["seconds_per_step"].as_f64().unwrap();
        // The floor, recomputed from the records: its read term the faster decode phase.
        let (read, phase) = if read_by_layer < read { (read_by_layer, "by_layer") } else { (read, "ubatch") };
        phases.push(phase);
        let arm = s_per_token(&f);
        let floor = read.max(compute);
        ratios.push((arm, floor, compute));
        reads.push(read);
        // Bytes per second: the replay's decode bytes per token over the arm's time per token,
        // and over the read term's.
        let bpt = dec["physical_bytes"].as_f64().unwrap() / dec["steps"].as_f64().unwrap();
        rates.push((bpt / arm, bpt / read));
        envelope_best = envelope_best.max(env["best"]["mib_per_s"].as_f64().unwrap() * 1048576.0);
        // F's device idle per decode token, from its timeline: no read in flight while the
        // engine computed (the bound's), and while the Plan worked (outside it).
        let tl = &f["experts"]["timeline"];
        let tokens = tl["tokens"].as_u64().unwrap();
        assert_eq!(tokens + 1, f["counts"]["generated_tokens"].as_u64().unwrap());
        let per =
            |keys: &[&str]| keys.iter().map(|k| tl["total"]["idle"][*k].as_u64().unwrap_or(0)).sum::<u64>() as f64 / 1e9 / tokens as f64;
        let idle = per(&["between_ns", "compute_ns", "expert_compute_ns"]);
        let plan_idle = per(&["plan_ns", "copy_ns", "submit_ns", "wait_ns"]);
        assert!(close(idle + plan_idle, tl["total"]["idle_ns"].as_u64().unwrap() as f64 / 1e9 / tokens as f64));
        assert!(idle > 0.0 && idle + plan_idle < arm, "block {block}: idle {idle} s and {plan_idle} s of {arm} s per token");
        // And with reads in flight: all of it, and the Plan's own work within it.
        let total = &tl["total"];
        let busy = total["busy_ns"].as_u64().unwrap() as f64 / 1e9 / tokens as f64;
        let plan_busy = total["busy"]["plan_ns"].as_u64().unwrap() as f64 / 1e9 / tokens as f64;
        assert!(close(busy + idle + plan_idle, total["wall_ns"].as_u64().unwrap() as f64 / 1e9 / tokens as f64), "{total}");
        assert!(plan_busy > 0.0 && plan_busy < busy, "block {block}: the Plan worked {plan_busy} s of {busy} s busy per token");
        busies.push((busy, plan_busy));
        plan_idles.push(plan_idle);
        idles.push((idle, (read + idle).max(compute)));
        layered.push((read_by_layer, (read_by_layer + idle).max(compute)));
    }
    let rows: Vec<csv::StringRecord> = csv::Reader::from_path(out.join("floor.csv")).unwrap().records().map(Result::unwrap).collect();
    assert_eq!(rows.len(), 2);
    let fh = csv::Reader::from_path(out.join("floor.csv")).unwrap().headers().unwrap().clone();
    let fcol = |n: &str| fh.iter().position(|c| c == n).unwrap_or_else(|| panic!("floor.csv has no {n}"));
    for (row, (&(by_layer, bound), &(arm, _, _))) in rows.iter().zip(layered.iter().zip(&ratios)) {
        assert!(close(row[fcol("read_by_layer_s_per_token")].parse().unwrap(), by_layer), "{row:?}");
        let shown = &row[fcol("layer_bound_s_per_token")];
        if &row[fcol("valid")] == "true" && arm >= bound {
            assert!(close(shown.parse().unwrap(), bound), "{row:?}");
        } else {
            assert_eq!(shown, "", "no layer bound an arm beat or over a broken floor: {row:?}");
        }
    }
    for (row, phase) in rows.iter().zip(&phases) {
        assert_eq!(&row[fcol("replay_phase")], *phase, "{row:?}");
    }
    for (row, &(busy, plan_busy)) in rows.iter().zip(&busies) {
        assert!(close(row[fcol("arm_busy_s_per_token")].parse().unwrap(), busy), "{row:?}");
        assert!(close(row[fcol("arm_plan_busy_s_per_token")].parse().unwrap(), plan_busy), "{row:?}");
    }
    for ((row, ((idle, bound), (_, floor, _))), plan_idle) in rows.iter().zip(idles.iter().zip(&ratios)).zip(&plan_idles) {
        assert!(close(row[fcol("arm_idle_s_per_token")].parse().unwrap(), *idle), "{row:?}");
        assert!(close(row[fcol("arm_plan_idle_s_per_token")].parse().unwrap(), *plan_idle), "{row:?}");
        assert!(close(row[fcol("idle_bound_s_per_token")].parse().unwrap(), *bound), "{row:?}");
        let over = &row[fcol("idle_bound_over_floor")];
        if &row[fcol("valid")] == "true" {
            assert!(close(over.parse().unwrap(), bound / floor), "{row:?}");
        } else {
            assert_eq!(over, "", "no bound over a broken floor: {row:?}");
        }
    }
    for (((row, (arm, floor, compute)), (arm_rate, replay_rate)), (_, bound)) in rows.iter().zip(&ratios).zip(&rates).zip(&idles) {
        assert!(close(row[8].parse().unwrap(), *arm), "{row:?}");
        assert!(close(row[11].parse().unwrap(), *floor), "{row:?}");
        assert!(close(row[17].parse::<f64>().unwrap() * 1048576.0, *arm_rate), "{row:?}");
        assert!(close(row[20].parse::<f64>().unwrap() * 1048576.0, envelope_best), "{row:?}");
        // A block is invalid exactly when its arm beat a term of its floor or its replay plus
        // its idle, or a rate beat the envelope's best cell by more than its resolution, and
        // then has no ratio.
        let ceiling = envelope_best * (1.0 + sovereign::export::ENVELOPE_RESOLUTION);
        let beaten =
            *arm < *compute || *arm < row[9].parse::<f64>().unwrap() || *arm < *bound || *arm_rate > ceiling || *replay_rate > ceiling;
        assert_eq!(&row[15] == "true", !beaten, "{row:?}");
        if beaten {
            assert_eq!((&row[13], &row[21]), ("", ""), "{row:?}");
        } else {
            assert!(close(row[13].parse().unwrap(), arm / floor), "{row:?}");
            assert!(close(row[21].parse().unwrap(), arm_rate / envelope_best), "{row:?}");
        }
    }
    assert_eq!(floor_valid, rows.iter().all(|r| &r[15] == "true"));
    if floor_valid {
        let geo = (ratios.iter().map(|(a, f, _)| (a / f).ln()).sum::<f64>() / 2.0).exp();
        let summary = csv::Reader::from_path(out.join("floor_summary.csv")).unwrap().records().next().unwrap().unwrap();
        assert!(close(summary[6].parse().unwrap(), geo), "{summary:?} vs {geo}");
        let r = ok(&["stats", "pairs", "--csv", s(&out.join("floor.csv")), "--a", "floor_s_per_token", "--b", "arm_s_per_token", "--json"]);
        let v: Value = serde_json::from_str(&r.stdout).unwrap();
        assert!(close(v["ratio"].as_f64().unwrap(), geo));
        assert!(v["lo"].as_f64().unwrap() <= geo && geo <= v["hi"].as_f64().unwrap());
    }

    // Complete wall time against stock mmap, from the cells' own wall times.
    let j: Value =
        serde_json::from_str(&run(&["export", "--campaign", "bench-tiny", "--results", s(&results), "--out", s(&out), "--json"]).stdout)
            .unwrap();
    {
        let wall = |key: &str| json(&dir_of(key).join("cell.json"))["outcome"]["wall_s"].as_f64().unwrap();
        let walls = j["walls"].as_array().unwrap();
        assert_eq!(walls.len(), 2, "{j}");
        let lru = walls.iter().find(|w| w["arm"] == "F-LRU").unwrap();
        assert!(close(lru["speedup"].as_f64().unwrap(), wall("b00-p1-stock") / wall("b00-p3-F-LRU")), "{lru}");
        let f = walls.iter().find(|w| w["arm"] == "F").unwrap();
        assert_eq!((f["arm_cells"].as_u64(), f["baseline_cells"].as_u64()), (Some(2), Some(1)));
        assert!(close(f["arm_wall_s"].as_f64().unwrap(), (wall("b01-p3-F") + wall("b02-p2-F")) / 2.0), "{f}");
    }
    if floor_valid {
        let e = &j["envelope"];
        let geo = (rates.iter().map(|(a, _)| (a / envelope_best).ln()).sum::<f64>() / 2.0).exp();
        assert!(close(e["ratio"].as_f64().unwrap(), geo), "{e} vs {geo}");
    }

    // The bench table: F exact in both blocks; the replay's tok/s is its read floor.
    let arms: Vec<csv::StringRecord> = csv::Reader::from_path(out.join("arms.csv")).unwrap().records().map(Result::unwrap).collect();
    let f = arms.iter().find(|r| &r[0] == "F").unwrap();
    assert_eq!((&f[2], &f[3], &f[7], &f[8]), ("2", "2", "2", "2"));
    let rep = arms.iter().find(|r| &r[0] == "replay-F").unwrap();
    assert_eq!(&rep[1], "read_replay");
    let floor_tps = reads.iter().map(|r| 1.0 / r).sum::<f64>() / reads.len() as f64;
    assert!(close(rep[4].parse().unwrap(), floor_tps), "{rep:?}");

    // The draft ledger names every record and still verifies and replays.
    let ledger = out.join("claims.json");
    let claim = j["claims"][0].as_str().unwrap();
    assert!(claim.starts_with("bench-tiny@"), "{claim}");
    ok(&["verify", "--claim", claim, "--ledger", s(&ledger), "--results", s(&results)]);
    ok(&["replay", "--claim", claim, "--ledger", s(&ledger), "--results", s(&results)]);
}

fn plan(policy: &str) -> PlanOptions {
    PlanOptions {
        slots: 4,
        policy: policy.parse().unwrap(),
        source: SourceKind::F,
        windows: Some(8),
        depth: Some(8),
        layer_buffers: 0,
        fault: FaultCell::None,
        timeline_token: None,
        token_pass: None,
        prompt_pass: None,
        budget: None,
        verify: None,
    }
}

#[test]
fn a_replay_from_the_wrong_arm_or_routes_fails_its_check() {
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "tiny.gguf", 1, &[]);
    let run = |name: &str, prompt: &str, policy: &str| {
        let rec = t.path().join(name);
        let r = generate(&model, prompt, 6, &rec, &["--experts", "plan", "--slots", "4", "--policy", policy, "--source", "f"]);
        assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
        rec
    };
    let f = run("f", "Experts stream from storage.", "zero");
    let other = run("other", "A different prompt routes to different experts, surely.", "zero");
    let q = |rec: &Path| -> sovereign::plan::Traffic { sovereign::record::load_generate(rec).unwrap().plan().unwrap().telemetry.q_run };

    // F's own settings and routes: its reads.
    let (seq, check, decode) = sovereign::measure::sequence_of_record(&f, &model, &plan("zero")).unwrap();
    assert!(check.equal, "{check:?}");
    assert_eq!(decode, 5);
    assert_eq!(seq.steps.len() - seq.prefill_steps, 5);
    assert_eq!(seq.traffic, q(&f));
    // Another arm's settings (an LRU cache where F had none): other reads, refused.
    let (_, check, _) = sovereign::measure::sequence_of_record(&f, &model, &plan("lru:4")).unwrap();
    assert!(!check.equal && check.replayed.reads < check.run.reads, "{check:?}");
    // Another run's routes against F's traffic: refused.
    let routes = sovereign::oracle::routes::load(&other, Some(&model)).unwrap();
    let seq = sovereign::measure::sequence(&routes.inventory, &plan("zero"), &routes.events, 1).unwrap();
    let check = sovereign::measure::check(&seq, q(&f));
    assert!(!check.equal, "{check:?}");

    // The cell fails closed on it, and its record says why.
    let record = t.path().join("replay");
    let cell = ReadReplayCell {
        model: model.clone(),
        of: f.clone(),
        of_arm: "F".into(),
        of_record: "f".into(),
        plan: plan("lru:4"),
        depth: 4,
        depth_from: "fixed".into(),
        record: record.clone(),
    };
    let e = sovereign::measure::run_read_replay(&cell).unwrap_err();
    assert!(format!("{e:#}").contains("not the run's own"), "{e:#}");
    let rec = sovereign::record::load_read_replay(&record).unwrap();
    assert_eq!(rec.outcome, sovereign::record::format::Outcome::Failed);
    assert_eq!(rec.check.map(|c| c.equal), Some(false));
    assert!(rec.decode.is_none());

    // With the right settings it reads every byte it derived.
    let ok_cell = ReadReplayCell { plan: plan("zero"), record: t.path().join("replay-ok"), ..cell };
    let rec = sovereign::measure::run_read_replay(&ok_cell).unwrap();
    let (pre, dec) = (rec.prefill.unwrap(), rec.decode.unwrap());
    assert_eq!(pre.reads + dec.reads, q(&f).reads);
    assert_eq!(pre.physical_bytes + dec.physical_bytes, q(&f).physical_bytes);
    assert_eq!(dec.per_step_s.len(), 5);
}

#[test]
fn measurement_arms_are_checked_in_one_line() {
    let (t, file) = scaled_bench(6);
    let text = fs::read_to_string(&file).unwrap();
    ok(&["campaign", "check", s(&file)]);
    let cases = [
        ("read_replay: { of: F }", "read_replya: { of: F }", "unknown variant `read_replya`"),
        ("read_replay: { of: F }", "read_replay: { of: resident }", "must be a Plan arm"),
        ("depths: [1, 4, 8, 16, 32]", "depths: [1, 4, 100000]", "depth 100000"),
        ("  - id: replay-F\n", "  - id: replay-F\n    threads: 2\n", "`threads` does not apply"),
        ("      - [envelope, compute, D, F, replay-F]\n", "      - [compute, D, F, replay-F]\n", "runs none before it"),
        (
            "      - [envelope, compute, D, F, replay-F]\n",
            "      - [envelope, compute, D, replay-F, F]\n",
            "where `F` does not run before it",
        ),
        ("    warm: true\n", "    warm: true\n    memory_cap_bytes: 2147483648\n", "`warm` applies to resident generate arms"),
        ("    envelope: envelope\n", "    envelope: D\n", "must be an envelope arm"),
    ];
    let bad = t.path().join("campaigns/bad.yaml");
    for (from, to, want) in cases {
        assert!(text.contains(from), "{from}");
        fs::write(&bad, text.replacen(from, to, 1)).unwrap();
        let r = run(&["campaign", "check", s(&bad)]);
        assert_eq!(r.code, 1, "{to}: {}{}", r.stdout, r.stderr);
        // One line per problem, each at its place in the file (`of: resident` also leaves
        // analysis.floor without a replay of F: a second problem, a second line).
        let lines: Vec<&str> = r.stderr.lines().collect();
        assert!(lines.len() <= 2 && lines.iter().all(|l| l.starts_with(s(&bad))), "{to}: {}", r.stderr);
        assert!(lines[0].contains(want), "{to}: {}", r.stderr);
        if !to.contains("resident") {
            assert_eq!(lines.len(), 1, "{to}: {}", r.stderr);
        }
    }
}

/// `DIR/campaigns/bench-prefill.yaml`: the shipped prefill bench on a forged tiny model, its
/// 181-token demo prompt, 4 slots, a 300 MiB cap (the tiny model's budget sizes all of it),
/// small envelope reads, its first two blocks and this build's identity.
fn scaled_prefill() -> (tempfile::TempDir, PathBuf) {
    let t = tempfile::tempdir().unwrap();
    let models = t.path().join("models");
    fs::create_dir_all(&models).unwrap();
    let model = &forge(&models, "wide.gguf", 3, &["--alignment", "4096"]);
    let mut text = fs::read_to_string(root().join("campaigns/bench-prefill.yaml")).unwrap();
    let subs = [
        ("4f9bfdfc0aedb65c6f94eee3f70c4adf7658c606a074cc7000186419988a8b49", sovereign::util::sha256_file(model).unwrap()),
        ("  forge: { preset: small, seed: 3, layers: 24, experts: 256, expert_ff: 128, context: 8192 }\n", String::new()),
        ("prompt_file: prompts/long.txt", "prompt_file: prompts/demo.txt".into()),
        (
            "5ae4fcc41b3bd6469130a18df5b2c920047350aaed63a9ea107c7beecc86e6b6",
            "50aea977f3e69bc7dd10066229a42b9a6aa124647907f1a09b7ccaa524456eb2".into(),
        ),
        ("prompt_tokens: 4244", "prompt_tokens: 181".into()),
        ("outputs: 16", "outputs: 4".into()),
        ("horizon: 16", "horizon: 4".into()),
        ("block_bytes: 1048576", "block_bytes: 262144".into()),
        ("bytes_per_depth: 268435456", "bytes_per_depth: 4194304".into()),
        ("      - [envelope, compute, F, stock, F-budget]\n      - [envelope, compute, F-budget, stock, F]\n", String::new()),
        ("id: bench-prefill-1", "id: bench-prefill-tiny".into()),
    ];
    for (from, to) in subs {
        assert!(text.contains(from), "campaigns/bench-prefill.yaml no longer holds {from:?}");
        text = text.replacen(from, &to, 1);
    }
    text = text.replace("slots: 32", "slots: 4").replace("\"lru:32\"", "\"lru:4\"").replace("838860800", "314572800");
    let text = with_this_build(&text);
    let c = t.path().join("campaigns");
    fs::create_dir_all(c.join("prompts")).unwrap();
    fs::copy(root().join("campaigns/prompts/demo.txt"), c.join("prompts/demo.txt")).unwrap();
    let file = c.join("bench-prefill.yaml");
    fs::write(&file, text).unwrap();
    (t, file)
}

#[test]
fn the_prefill_bench_gives_each_arms_prefill_over_its_floor_and_stock_over_it() {
    // The prefill bench caps every arm but the oracle in a memory cgroup.
    if !cgroups_usable() {
        return;
    }
    let (t, file) = scaled_prefill();
    let results = t.path().join("results");
    ok(&["campaign", "run", s(&file), "--results", s(&results), "--no-progress"]);
    let out = t.path().join("export");
    let r = run(&["export", "--campaign", "bench-prefill-tiny", "--results", s(&results), "--out", s(&out)]);
    // A tiny model's resident prefill can be slower than F's on a shared machine, and reads just
    // made can come back faster than the envelope: then the floor was mismeasured and the
    // analysis says so instead of giving a ratio.
    let valid = match r.code {
        0 => true,
        1 => {
            assert!(r.stderr.contains("prefill over its floor: invalid measurement"), "{}", r.stderr);
            false
        }
        c => panic!("export exited {c}: {}{}", r.stdout, r.stderr),
    };
    let cells: Vec<csv::StringRecord> = csv::Reader::from_path(out.join("cells.csv")).unwrap().records().map(Result::unwrap).collect();
    let h = csv::Reader::from_path(out.join("cells.csv")).unwrap().headers().unwrap().clone();
    let col = |n: &str| h.iter().position(|c| c == n).unwrap();
    assert_eq!(cells.len(), 3 + 2 * 5);
    let record = |key: &str| -> Value {
        let row = cells.iter().find(|r| &r[col("cell")] == key).unwrap_or_else(|| panic!("no cell {key}"));
        assert_eq!(&row[col("status")], "completed", "{key}: {}", &row[col("error")]);
        json(&results.join(&row[col("record")]).join("record.json"))
    };
    // The budget sized F-budget: no Plan flag, slots and LRU from the cap.
    let b = record("b01-p4-F-budget");
    assert_eq!(b["params"]["experts"]["sizing"]["slots_from"], "budget", "{}", b["params"]["experts"]);

    // Every row recomputed from the records: floor = max(least resident prefill of the block,
    // prefill bytes / the campaign's best envelope cell).
    let env_best = ["b01-p0-envelope", "b02-p0-envelope"]
        .iter()
        .map(|k| {
            let e = record(k);
            e["best"]["mib_per_s"].as_f64().unwrap_or_else(|| panic!("{k}: {e}")) * 1048576.0
        })
        .fold(0.0, f64::max);
    let rows: Vec<csv::StringRecord> =
        csv::Reader::from_path(out.join("prefill_floor.csv")).unwrap().records().map(Result::unwrap).collect();
    let fh = csv::Reader::from_path(out.join("prefill_floor.csv")).unwrap().headers().unwrap().clone();
    let f = |row: &csv::StringRecord, n: &str| {
        row[fh.iter().position(|c| c == n).unwrap_or_else(|| panic!("prefill_floor.csv has no {n}"))].to_string()
    };
    assert_eq!(rows.len(), 4, "two arms in two blocks");
    for row in &rows {
        let arm = record(&f(row, "arm_cell"));
        let compute = record(&f(row, "compute_cell"));
        let stock = record(&f(row, "baseline_cell"));
        let arm_s = arm["timing"]["prefill_s"].as_f64().unwrap();
        let bytes = arm["experts"]["prefill"]["read_bytes"].as_u64().unwrap();
        assert_eq!(f(row, "read_bytes"), bytes.to_string());
        assert!(bytes > 0, "{row:?}");
        let floor = compute["timing"]["prefill_s"].as_f64().unwrap().max(bytes as f64 / env_best);
        assert!(close(f(row, "floor_s").parse().unwrap(), floor), "{row:?} against {floor}");
        let base = stock["timing"]["prefill_s"].as_f64().unwrap();
        assert!(close(f(row, "baseline_over_arm").parse().unwrap(), base / arm_s), "{row:?}");
        match f(row, "valid").as_str() {
            "yes" => assert!(close(f(row, "ratio_to_floor").parse().unwrap(), arm_s / floor), "{row:?}"),
            why => {
                assert!(!valid && f(row, "ratio_to_floor").is_empty(), "{row:?}");
                assert!(why.contains("faster than"), "{why}");
            }
        }
    }
    let summary = fs::read_to_string(out.join("prefill_floor_summary.csv")).unwrap();
    let arm_valid = |arm: &str| rows.iter().filter(|r| f(r, "arm") == arm).all(|r| f(r, "valid") == "yes");
    // The export fails closed when any arm's floor is broken; each arm's ratio stands on its own rows.
    assert_eq!(valid, arm_valid("F-budget") && arm_valid("F"));
    for arm in ["F-budget", "F"] {
        assert!(summary.lines().any(|l| l.starts_with(&format!("{arm},baseline_over_arm,2,"))), "{summary}");
        assert_eq!(summary.lines().any(|l| l.starts_with(&format!("{arm},ratio_to_floor,2,"))), arm_valid(arm), "{summary}");
        assert!(r.stdout.contains(&format!("prefill of {arm} over its floor: ")), "{}", r.stdout);
    }
    // The decode pair: F-budget over the hand-sized F, in both blocks.
    let pairs: Vec<csv::StringRecord> = csv::Reader::from_path(out.join("pairs.csv")).unwrap().records().map(Result::unwrap).collect();
    assert_eq!(pairs.len(), 2);
}

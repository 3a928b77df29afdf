//! Sessions: a request decoded after others in the same context, once the context is cleared,
//! is bitwise the request decoded in a new context.

use crate::common::ok;
use sovereign::engine::{Context, ExpertSource, Model};
use sovereign::exec::ExecParams;
use sovereign::inventory::Inventory;
use sovereign::plan::report::{PlanReport, SourceReport};
use sovereign::plan::PlanOptions;
use sovereign::routes::RouteEvent;
use sovereign::service::PlanSource;
use sovereign::session::Between;
use sovereign::source::fault::FaultCell;
use std::path::{Path, PathBuf};

fn forge_arch(dir: &Path, arch: &str) -> PathBuf {
    let out = dir.join(format!("{arch}.gguf"));
    ok(&["model", "forge", "--arch", arch, "--preset", "tiny", "--seed", "3", "--out", out.to_str().unwrap()]);
    out
}

/// What one request leaves: every logits row (as bits), each recurrent state after prefill and
/// after every step, and the routes.
#[derive(Debug, PartialEq)]
struct Served {
    logits: Vec<u32>,
    states: Vec<Vec<u8>>,
    routes: Vec<RouteEvent>,
}

/// Prefill (a ubatch of several tokens) and `n` greedy steps, as `generate` decodes.
fn serve(model: &Model, ctx: &mut Context, prompt: &str, n: usize) -> Served {
    let toks = model.tokenize(prompt.as_bytes(), true).unwrap();
    let mut rows = Vec::new();
    let mut states = Vec::new();
    ctx.decode(&toks, true, &mut rows).unwrap();
    states.extend(ctx.recurrent_state().unwrap());
    for _ in 0..n {
        let last = &rows[rows.len() - model.n_vocab()..];
        let next = sovereign::generate::argmax(last) as i32;
        ctx.decode(&[next], true, &mut rows).unwrap();
        states.extend(ctx.recurrent_state().unwrap());
    }
    Served { logits: rows.iter().map(|x| x.to_bits()).collect(), states, routes: ctx.take_routes() }
}

#[test]
fn a_cleared_context_serves_a_request_as_a_new_one_would() {
    let dir = tempfile::tempdir().unwrap();
    sovereign::engine::init();
    let exec = exec();
    let (a, b) = ("an earlier request, longer than the one after it, fills the cache", "the request that follows");
    // Attention only, hybrid (recurrent state per position of a ubatch) and recurrent with
    // snapshots.
    for arch in ["qwen3moe", "qwen35moe", "qwen3next"] {
        let model = Model::load(&forge_arch(dir.path(), arch)).unwrap();
        let alone = serve(&model, &mut Context::new(&model, exec, true).unwrap(), b, 6);
        assert!(
            !alone.routes.is_empty() && alone.logits.len() == (model.tokenize(b.as_bytes(), true).unwrap().len() + 6) * model.n_vocab()
        );
        assert_eq!(!alone.states.is_empty(), model.has_recurrent_state(), "{arch}");

        let mut ctx = Context::new(&model, exec, true).unwrap();
        let first = serve(&model, &mut ctx, a, 9);
        ctx.clear();
        assert_eq!(ctx.n_past(), 0);
        let after = serve(&model, &mut ctx, b, 6);
        assert!(after == alone, "{arch}: a request after a cleared one differs from it alone");
        // The same request twice in a row, cleared between: the same bytes again.
        ctx.clear();
        assert!(serve(&model, &mut ctx, b, 6) == alone, "{arch}: the second repeat differs");
        // And the earlier request was itself what it is alone (nothing of the test is vacuous).
        assert!(first != alone);
    }
}

fn exec() -> ExecParams {
    ExecParams { n_ctx: 256, n_batch: 64, n_ubatch: 64, threads: 2, threads_batch: None, flash_attn: false }
}

/// The model with its experts served by a new Plan through F (`policy` over `slots` slots).
fn served(path: &Path, policy: &str, slots: u32) -> Model {
    let inv = Inventory::of(path).unwrap();
    let source = PlanSource::new(path, &inv, crate::common::plan_options(policy, slots)).unwrap();
    Model::load_with(path, Some(Box::new(source) as Box<dyn ExpertSource>)).unwrap()
}

fn end_request(model: &Model) -> PlanReport {
    match model.with_source(|s| s.end_request()) {
        Some(Ok(SourceReport::Plan(r))) => *r,
        other => panic!("no Plan report: {:?}", other.map(|r| r.map(|_| ()))),
    }
}

fn finish(model: &Model) -> PlanReport {
    match model.with_source(|s| s.finish()) {
        Some(Ok(SourceReport::Plan(r))) => *r,
        other => panic!("no Plan report: {:?}", other.map(|r| r.map(|_| ()))),
    }
}

#[test]
fn each_request_through_one_plan_is_the_request_alone_warm_or_cold() {
    let dir = tempfile::tempdir().unwrap();
    sovereign::engine::init();
    let (a, b) = ("an earlier request, longer than the one after it, fills the cache", "the request that follows");
    for (arch, policy) in [("qwen3moe", "lru:6"), ("qwen35moe", "lru:6+prefetch"), ("qwen3next", "pin:0/1+lru:5")] {
        let path = forge_arch(dir.path(), arch);
        let resident = Model::load(&path).unwrap();
        let alone = serve(&resident, &mut Context::new(&resident, exec(), true).unwrap(), b, 6);
        // The request alone through a new Plan: its bytes, and what its Plan saw.
        let fresh = served(&path, policy, 6);
        let mut ctx = Context::new(&fresh, exec(), true).unwrap();
        assert!(serve(&fresh, &mut ctx, b, 6) == alone, "{arch}: served alone");
        drop(ctx);
        let first = finish(&fresh);

        let model = served(&path, policy, 6);
        let mut ctx = Context::new(&model, exec(), true).unwrap();
        serve(&model, &mut ctx, a, 9);
        let r = end_request(&model);
        assert!(r.clean_closure && r.selections.complete, "{arch}: {:?}", r.closure);
        for between in [Between::Reset, Between::Cold, Between::Reset] {
            ctx.clear();
            model.with_source(|s| s.between(between, 6)).unwrap().unwrap();
            assert!(serve(&model, &mut ctx, b, 6) == alone, "{arch}: after {between:?}");
            // The request's own report, its Plan at rest.
            let r = end_request(&model);
            let (t, f) = (&r.telemetry, &first.telemetry);
            assert!(r.clean_closure && r.selections == first.selections, "{arch}: {:?}", r.closure);
            assert_eq!((t.acquires, t.object_requests, t.resets), (f.acquires, f.object_requests, 1), "{arch}");
            match between {
                // Cold: exactly what a new Plan reads and loads for it.
                Between::Cold => {
                    assert_eq!((&t.q_run, t.misses, t.hits, t.cold_resets), (&f.q_run, f.misses, f.hits, 1), "{arch}");
                }
                // Warm after itself: fewer bytes read.
                Between::Reset => assert!(t.q_run.physical_bytes < f.q_run.physical_bytes && t.hits > f.hits, "{arch}: {t:?}"),
                Between::Separate => unreachable!("not asked of one source"),
            }
        }
        drop(ctx);
        // Nothing ran after the last request ended: the last report counts nothing, and the
        // ledger closes clean after three resets.
        // Separate requests are processes of their own: one source refuses to serve them so.
        assert!(model.with_source(|s| s.between(Between::Separate, 6)).unwrap().is_err(), "{arch}");
        let last = finish(&model);
        assert!(last.clean_closure, "{arch}: {:?}", last.closure);
        assert_eq!((last.telemetry.acquires, last.closure.epoch), (0, 3), "{arch}");
    }
}

/// A source that serves one request: the trait's own `between`.
struct OneRequest;

impl ExpertSource for OneRequest {
    fn n_slots(&self) -> u32 {
        1
    }
    fn pool(&mut self, _: u32, _: &str, _: usize, _: u32, _: sovereign::engine::SlotPool) -> anyhow::Result<u32> {
        anyhow::bail!("no pools")
    }
    fn acquire(&mut self, _: u32, _: u32, _: &[i32], _: &mut [i32]) -> anyhow::Result<()> {
        anyhow::bail!("nothing to serve")
    }
    fn release(&mut self, _: u32, _: u32) -> anyhow::Result<()> {
        Ok(())
    }
    fn describe(&self) -> sovereign::plan::report::SourceDescription {
        sovereign::plan::report::SourceDescription::Other(sovereign::plan::report::OtherSource::new("one", &[]))
    }
    fn finish(&mut self) -> anyhow::Result<SourceReport> {
        Ok(SourceReport::Other(sovereign::plan::report::OtherSource::new("one", &[])))
    }
}

#[test]
fn a_source_of_one_request_refuses_a_second_and_a_failed_plan_cannot_go_on() {
    for between in [Between::Reset, Between::Cold] {
        let e = OneRequest.between(between, 4).unwrap_err();
        assert!(format!("{e}").contains("serves one request"), "{e}");
    }
    let e = OneRequest.end_request().unwrap_err();
    assert!(format!("{e}").contains("serves one request"), "{e}");
    // A Plan that failed closed refuses to go on: the session fails closed with it.
    let dir = tempfile::tempdir().unwrap();
    sovereign::engine::init();
    let path = forge_arch(dir.path(), "qwen3moe");
    let inv = Inventory::of(&path).unwrap();
    let mut source =
        PlanSource::new(&path, &inv, PlanOptions { fault: FaultCell::ShortRead, ..crate::common::plan_options("lru:6", 6) }).unwrap();
    let unused = source.between(Between::Reset, 4);
    assert!(unused.is_ok(), "an unused Plan resets: {unused:?}");
    let model = Model::load_with(&path, Some(Box::new(source) as Box<dyn ExpertSource>)).unwrap();
    let mut ctx = Context::new(&model, exec(), true).unwrap();
    let toks = model.tokenize(b"a request the fault fails", true).unwrap();
    assert!(ctx.decode(&toks, true, &mut Vec::new()).is_err(), "the fault fails the decode");
    ctx.clear();
    for between in [Between::Reset, Between::Cold] {
        let e = model.with_source(|s| s.between(between, 4)).unwrap().unwrap_err();
        assert!(format!("{e:#}").contains("failed"), "{between:?}: {e:#}");
    }
}

fn request(id: &str, prompt: &str, n_predict: u32, expected: &[&str]) -> sovereign::session::Request {
    sovereign::session::Request {
        id: id.into(),
        prompt: prompt.as_bytes().to_vec(),
        prompt_file: None,
        n_predict,
        expected: expected.iter().map(|s| s.to_string()).collect(),
        fault: FaultCell::None,
    }
}

/// F with LRU over 6 slots, with `fault` where given.
fn plan_source(path: &Path, inv: &Inventory, fault: Option<FaultCell>) -> anyhow::Result<Option<Box<dyn ExpertSource>>> {
    let options = PlanOptions { fault: fault.unwrap_or_default(), ..crate::common::plan_options("lru:6", 6) };
    Ok(Some(Box::new(PlanSource::new(path, inv, options)?) as Box<dyn ExpertSource>))
}

/// The surfaces a run's record certifies (the timeline, which holds times, left out).
fn surfaces(dir: &Path) -> Vec<(String, String)> {
    let r = sovereign::record::format::load_generate(dir).unwrap();
    r.surfaces.into_iter().filter(|(k, _)| k != "timeline").map(|(k, s)| (k, s.sha256)).collect()
}

#[test]
fn a_session_through_f_with_lru_is_each_request_alone_and_its_ledger_balances() {
    use sovereign::generate::session::{run_with, SessionLedger, SessionSpec};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Hybrid: the recurrent state is cleared between requests too.
    let path = forge_arch(d, "qwen35moe");
    let requests = vec![
        request("q1", "the first question of the session, a longer one than the rest", 5, &["whatever it says"]),
        request("q2", "a second, different question", 4, &[]),
        request("q1-again", "the first question of the session, a longer one than the rest", 5, &[]),
        request("q4", "the last question", 6, &[]),
    ];
    let exec = crate::common::generate_spec(&path, d, "", 0).exec;
    // Each request alone, through a new Plan.
    let alone: Vec<(Vec<(String, String)>, u64)> = requests
        .iter()
        .map(|r| {
            let rec = d.join(format!("alone-{}", r.id));
            let spec = sovereign::generate::GenerateSpec {
                ignore_eos: true,
                ..crate::common::generate_spec(&path, &rec, std::str::from_utf8(&r.prompt).unwrap(), r.n_predict)
            };
            sovereign::generate::run_with(&spec, |inv| plan_source(&path, inv, None)).unwrap();
            let g = sovereign::record::format::load_generate(&rec).unwrap();
            let read = g.experts().and_then(|e| match e {
                sovereign::record::format::ExpertsReport::Plan(p) => Some(p.telemetry.q_run.physical_bytes),
                _ => None,
            });
            (surfaces(&rec), read.unwrap())
        })
        .collect();
    for between in [Between::Reset, Between::Cold] {
        let root = d.join(format!("session-{between:?}"));
        let spec = SessionSpec {
            model: path.clone(),
            requests: requests.clone(),
            between,
            exec,
            ignore_eos: true,
            record: root.clone(),
            seal: true,
        };
        let s = run_with(&spec, |inv, fault, _| plan_source(&path, inv, fault)).unwrap();
        assert_eq!(s.outcome, sovereign::record::format::Outcome::Completed);
        assert!(s.closure.as_ref().is_some_and(|c| c.is_clean()), "{:?}", s.closure);
        let cold = if between == Between::Cold { 3 } else { 0 };
        let ledger = sovereign::generate::session::SessionLedger {
            requests: 4,
            resets: 3,
            cold_resets: cold,
            renewals: 0,
            plan_resets: 3,
            epoch: 3,
            balanced: true,
        };
        assert_eq!(s.ledger, Some(ledger));
        assert_eq!(ledger.unbalanced(between), None);
        // Each way it could fail to close is said.
        for (broken, says) in [
            (SessionLedger { balanced: false, ..ledger }, "did not balance"),
            (SessionLedger { resets: 2, plan_resets: 2, epoch: 2, ..ledger }, "not one reset or renewal before each request"),
            (SessionLedger { renewals: 1, ..ledger }, "not one reset or renewal before each request"),
            (SessionLedger { cold_resets: 3 - cold, ..ledger }, "cold resets do not match"),
            (SessionLedger { epoch: 4, ..ledger }, "the epoch is not the number of resets"),
        ] {
            assert!(broken.unbalanced(between).is_some_and(|e| e.contains(says)), "{broken:?}");
        }
        assert_eq!(s.requests.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["q1", "q2", "q1-again", "q4"]);
        // Only q1 named an answer: one scored request.
        assert_eq!(s.scores.map(|a| a.scored), Some(1));
        for (i, (e, (want, read))) in s.requests.iter().zip(&alone).enumerate() {
            let rec = root.join(&e.record);
            assert_eq!(&surfaces(&rec), want, "{between:?} {}: every surface is the request alone's", e.id);
            assert_eq!(sovereign::util::sha256_file(&rec.join("record.json")).unwrap(), e.record_sha256);
            let served = e.served.unwrap();
            assert_eq!(served.epoch, i as u64, "one reset before each request after the first");
            match (between, e.id.as_str()) {
                (Between::Cold, _) | (_, "q1") => assert_eq!(served.read_bytes, *read, "{between:?} {}: as a new Plan", e.id),
                (Between::Reset, "q1-again") => assert!(served.read_bytes < *read, "warm after itself: {} of {read}", served.read_bytes),
                _ => {}
            }
        }
        // The session's record is sealed around its requests'.
        assert!(root.join("record.json").exists() && root.join("manifest.json").exists());
    }
}

/// A request that fails closed (its own fault cell) fails the session, and the session goes on:
/// a new Plan takes the failed one's place, and the requests after it are bitwise what they are
/// alone, reading what a new Plan reads; a recoverable fault's request is exact too.
#[test]
fn a_session_goes_on_after_a_request_that_failed_closed_each_later_request_as_alone() {
    use sovereign::generate::session::{run_with, SessionSpec};
    use sovereign::record::format::Outcome;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let path = forge_arch(d, "qwen3moe");
    let (first, other) = ("the first question of the session, a longer one than the rest", "another question");
    let exec = crate::common::generate_spec(&path, d, "", 0).exec;
    let alone = |name: &str, prompt: &str, n: u32| -> (Vec<(String, String)>, u64) {
        let rec = d.join(name);
        let spec = sovereign::generate::GenerateSpec { ignore_eos: true, ..crate::common::generate_spec(&path, &rec, prompt, n) };
        sovereign::generate::run_with(&spec, |inv| plan_source(&path, inv, None)).unwrap();
        let g = sovereign::record::format::load_generate(&rec).unwrap();
        (surfaces(&rec), g.plan().unwrap().telemetry.q_run.physical_bytes)
    };
    let (a, b) = (alone("alone-a", first, 5), alone("alone-b", other, 4));
    let faulted = |cell: FaultCell| sovereign::session::Request { fault: cell, ..request("faulted", first, 5, &[]) };
    for between in [Between::Reset, Between::Cold] {
        let requests = vec![
            request("a", first, 5, &[]),
            faulted(FaultCell::CorruptByte),
            request("b", other, 4, &[]),
            faulted(FaultCell::OutOfOrder),
            request("a again", first, 5, &[]),
        ];
        let root = d.join(format!("session-{between:?}"));
        let spec = SessionSpec { model: path.clone(), requests, between, exec, ignore_eos: true, record: root.clone(), seal: true };
        let e = run_with(&spec, |inv, fault, _| plan_source(&path, inv, fault)).unwrap_err();
        assert!(format!("{e:#}").contains("request \"faulted\" failed"), "{e:#}");
        let s = match sovereign::record::format::load_typed(&root).unwrap() {
            sovereign::record::format::TypedRecord::Session(s) => *s,
            other => panic!("{}", other.format()),
        };
        assert_eq!(s.outcome, Outcome::Failed);
        let outcomes: Vec<Outcome> = s.requests.iter().map(|r| r.outcome).collect();
        assert_eq!(outcomes, [Outcome::Completed, Outcome::Failed, Outcome::Completed, Outcome::Completed, Outcome::Completed]);
        // A new Plan around each faulted request and after the one that failed.
        let renewed: Vec<(usize, FaultCell, bool)> = s.renewals.iter().map(|r| (r.before_request, r.fault, r.replaced_clean)).collect();
        assert!(s.renewals.iter().all(|r| r.replaced_epoch == Some(0)), "{:?}", s.renewals);
        assert_eq!(
            renewed,
            [(1, FaultCell::CorruptByte, true), (2, FaultCell::None, false), (3, FaultCell::OutOfOrder, true), (4, FaultCell::None, true)],
            "{between:?}"
        );
        let ledger = s.ledger.unwrap();
        assert_eq!((ledger.renewals, ledger.resets, ledger.plan_resets, ledger.epoch, ledger.balanced), (4, 0, 0, 0, true), "{ledger:?}");
        assert_eq!(ledger.unbalanced(between), None);
        let rec = |i: usize| root.join(&s.requests[i].record);
        let read = |i: usize| s.requests[i].served.unwrap().read_bytes;
        // The failed request's record says it failed closed and shows nothing of its outputs.
        let failed = sovereign::record::format::load_generate(&rec(1)).unwrap();
        assert_eq!(failed.outcome, Outcome::Failed);
        assert!(!failed.surfaces.contains_key("tokens"), "{:?}", failed.surfaces.keys());
        // Before it, after it, after the recoverable fault, and the recoverable request itself:
        // each as alone, the later ones through a new Plan (its bytes read as a new Plan's).
        for (i, (want, bytes)) in [(0, &a), (2, &b), (3, &a), (4, &a)] {
            assert_eq!(&surfaces(&rec(i)), want, "{between:?}: request {i}");
            assert_eq!(read(i), *bytes, "{between:?}: request {i} reads as a new Plan");
        }
    }
}

/// Separate processes go on after a request that failed closed, as a session in one process
/// does: the session fails, the failed request's record says so, and every later request is
/// served and bitwise what the reset session served.
#[test]
fn separate_requests_go_on_after_one_that_failed_closed() {
    use crate::common::run;
    use sovereign::record::format::{load_typed, Outcome, TypedRecord};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = forge_arch(d, "qwen3moe");
    let requests = d.join("requests.jsonl");
    std::fs::write(
        &requests,
        [
            r#"{"id": "a", "prompt": "the first question of the session", "n_predict": 4}"#,
            r#"{"id": "faulted", "prompt": "the first question of the session", "n_predict": 4, "fault": "corrupt_byte"}"#,
            r#"{"id": "b", "prompt": "another question", "n_predict": 3}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let mut served = Vec::new();
    for between in ["auto", "separate"] {
        let rec = d.join(between);
        let (m, q, r) = (model.to_str().unwrap(), requests.to_str().unwrap(), rec.to_str().unwrap());
        let args = ["generate", "--model", m, "--requests", q, "--ignore-eos", "--record", r, "--experts", "plan", "--policy", "lru:4"];
        let out = run(&[&args[..], &["--slots", "4", "--between", between]].concat());
        assert_ne!(out.code, 0, "{between}: a session with a failed request fails: {}", out.stderr);
        assert!(out.stderr.contains("request \"faulted\" failed"), "{between}: {}", out.stderr);
        let TypedRecord::Session(s) = load_typed(&rec).unwrap() else { panic!("{between}: not a session record") };
        assert_eq!(s.outcome, Outcome::Failed, "{between}");
        let outcomes: Vec<Outcome> = s.requests.iter().map(|q| q.outcome).collect();
        assert_eq!(outcomes, [Outcome::Completed, Outcome::Failed, Outcome::Completed], "{between}");
        assert!(!load_typed(&rec.join(&s.requests[1].record)).unwrap().surfaces().contains_key("tokens"), "{between}");
        served.push([0, 2].map(|i| surfaces(&rec.join(&s.requests[i].record))));
    }
    assert_eq!(served[0], served[1], "each request served alone, wherever it ran");
}

/// `generate --requests` as a user runs it: a session of requests through F with LRU, reset or
/// cold, and the same requests as separate processes, each request bitwise the resident
/// session's (compared request by request through the session records' surfaces); a contained
/// session is admitted with its ledger; a bad line is refused before anything runs.
#[test]
fn generate_requests_serves_a_session_that_compares_request_by_request() {
    use crate::common::{assert_one_line_error, run};
    use sovereign::record::format::{load_typed, TypedRecord};
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let model = forge_arch(d, "qwen3moe");
    std::fs::write(d.join("long.txt"), "a prompt kept in a file of its own, longer than the others are").unwrap();
    let requests = d.join("requests.jsonl");
    std::fs::write(
        &requests,
        [
            r#"{"id": "q1", "prompt": "the first question of the session", "n_predict": 5, "expected": ["the first answer", "an answer"]}"#,
            r#"{"id": 2, "prompt_file": "long.txt"}"#,
            r#"{"id": "q1 again", "prompt": "the first question of the session", "n_predict": 5}"#,
        ]
        .join("\n"),
    )
    .unwrap();
    let session = |name: &str, extra: &[&str]| -> (PathBuf, sovereign::record::format::SessionRecord) {
        let rec = d.join(name);
        let (m, q, r) = (model.to_str().unwrap(), requests.to_str().unwrap(), rec.to_str().unwrap());
        let mut args = vec!["generate", "--model", m, "--requests", q, "--n-predict", "4", "--ignore-eos", "--record", r, "--json"];
        args.extend_from_slice(extra);
        let out = ok(&args);
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        match load_typed(&rec).unwrap() {
            TypedRecord::Session(s) => {
                // A contained run's summary holds the session's under `session`.
                let listed = v.pointer("/requests").or(v.pointer("/session/requests"));
                assert_eq!(listed.and_then(|l| l.as_array()).map(Vec::len), Some(3), "{}", out.stdout);
                (rec, *s)
            }
            other => panic!("{name}: not a session record: {}", other.format()),
        }
    };
    let plan = ["--experts", "plan", "--policy", "lru:4", "--slots", "4"];
    let (resident, r) = session("resident", &[]);
    assert_eq!(r.counts.map(|c| (c.requests, c.generated_tokens)), Some((3, 14)));
    assert_eq!(r.requests.iter().map(|q| q.id.as_str()).collect::<Vec<_>>(), ["q1", "2", "q1 again"]);
    assert!(r.scores.is_some_and(|a| a.scored == 1), "{:?}", r.scores);
    sovereign::record::verify_sealed(&resident).unwrap();
    for (name, between) in [("reset", "auto"), ("cold", "cold"), ("separate", "separate")] {
        let (rec, s) = session(name, &[&plan[..], &["--between", between]].concat());
        assert_eq!(s.outcome, sovereign::record::format::Outcome::Completed, "{name}: {:?}", s.error);
        sovereign::record::verify_sealed(&rec).unwrap();
        // Every request's every output surface, compared through the two sessions' records.
        let cmp = sovereign::oracle::compare(&resident, &rec).unwrap();
        assert_eq!(cmp.len(), 12, "{name}: four surfaces of three requests: {cmp:?}");
        assert!(cmp.iter().all(|c| c.is_exact()), "{name}: {cmp:?}");
        for q in &s.requests {
            assert_eq!(sovereign::util::sha256_file(&rec.join(&q.record).join("record.json")).unwrap(), q.record_sha256);
        }
        let read: Vec<u64> = s.requests.iter().map(|q| q.served.unwrap().read_bytes).collect();
        match name {
            "reset" => {
                assert_eq!(s.ledger.map(|l| (l.resets, l.cold_resets, l.balanced)), Some((2, 0, true)));
                assert!(read[2] < read[0], "{name}: the repeated request is served warm: {read:?}");
            }
            "cold" => {
                assert_eq!(s.ledger.map(|l| (l.resets, l.cold_resets, l.balanced)), Some((2, 2, true)));
                assert_eq!(read[2], read[0], "{name}: the repeated request reads as a new Plan: {read:?}");
            }
            _ => {
                assert_eq!(s.ledger, None, "separate processes share no Plan");
                assert_eq!(read[2], read[0]);
            }
        }
    }
    // A session is a different record from a single run: not exact against one.
    let single = d.join("single");
    crate::common::generate(&model, "the first question of the session", 5, &single, &["--ignore-eos"]);
    assert!(sovereign::oracle::compare(&single, &resident).unwrap().iter().any(|c| !c.is_exact()));
    // A bad line: one line naming the file and line, and nothing written.
    std::fs::write(d.join("bad.jsonl"), "{\"id\": 1, \"prompt\": \"a\"}\n{\"id\": 2, \"promt\": \"b\"}\n").unwrap();
    let bad = d.join("bad-session");
    let (m, q, b) = (model.to_str().unwrap(), d.join("bad.jsonl"), bad.to_str().unwrap().to_string());
    let r = run(&["generate", "--model", m, "--requests", q.to_str().unwrap(), "--record", &b]);
    assert_one_line_error(&r, &["bad.jsonl:2", "promt"]);
    assert!(!bad.exists());
    let r = run(&["generate", "--model", m, "--prompt", "p", "--between", "cold", "--record", &b]);
    assert_eq!(r.code, 2, "--between without --requests: {}", r.stderr);
    if crate::common::cgroups_usable() {
        let (rec, s) = session("contained", &[&plan[..], &["--memory-max", "1G"]].concat());
        let res = s.resources.expect("a contained session states its resources");
        assert!(res.admission.admitted, "{:?}", res.admission);
        assert!(sovereign::oracle::compare(&resident, &rec).unwrap().iter().all(|c| c.is_exact()));
    }
}

/// `DIR/campaigns/bench-session.yaml`: the shipped session campaign on a forged stand-in for
/// its model, 4 slots and 4 outputs a request, with this build's identity.
fn session_campaign(dir: &Path) -> PathBuf {
    use crate::common::forge;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let model = forge(&models, "bench.gguf", 1, &["--alignment", "4096"]);
    let mut text = std::fs::read_to_string(root.join("campaigns/bench-session.yaml")).unwrap();
    let subs = [
        ("971ca7bfa1e0d9df8942bb2e6645e8df78e8620ccfb6e68a1c04dbb790049aea", sovereign::util::sha256_file(&model).unwrap()),
        ("  forge: { preset: bench, seed: 1 }\n", String::new()),
        ("outputs: 16", "outputs: 4".into()),
        ("horizon: 16", "horizon: 4".into()),
        ("id: bench-session-1", "id: session-tiny".into()),
    ];
    for (from, to) in subs {
        assert!(text.contains(from), "campaigns/bench-session.yaml no longer holds {from:?}");
        text = text.replacen(from, &to, 1);
    }
    let text = text.replace("slots: 16", "slots: 4").replace("\"lru:16\"", "\"lru:4\"");
    let text = crate::bench::with_this_build(&text);
    let c = dir.join("campaigns");
    std::fs::create_dir_all(c.join("prompts")).unwrap();
    std::fs::copy(root.join("campaigns/prompts/session.jsonl"), c.join("prompts/session.jsonl")).unwrap();
    let file = c.join("bench-session.yaml");
    std::fs::write(&file, text).unwrap();
    file
}

/// A session campaign's requests are checked before anything runs: their digest, every line as
/// `generate --requests` reads it, and every prompt inline (a prompt file would escape the
/// pinned digest).
#[test]
fn a_session_campaign_refuses_requests_its_digest_does_not_cover() {
    use crate::common::run;
    let t = tempfile::tempdir().unwrap();
    let file = session_campaign(t.path());
    let f = file.to_str().unwrap();
    ok(&["campaign", "check", f]);
    let requests = t.path().join("campaigns/prompts/session.jsonl");
    let good = std::fs::read_to_string(&requests).unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    let pinned = sovereign::util::sha256(good.as_bytes());
    for (lines, says) in [
        (format!("{good}{{\"id\": \"extra\", \"prompt_file\": \"p.txt\"}}\n"), "names a prompt_file"),
        (format!("{good}{{\"id\": \"extra\", \"promt\": \"x\"}}\n"), "session.jsonl:9"),
        (format!("{good}{{\"id\": \"extra\", \"prompt\": \"x\", \"fault\": \"eio\"}}\n"), "names a fault cell"),
        (good.replacen("plan-1", "cgroup-1", 1), "session.jsonl:2: request id \"cgroup-1\" is already used on line 1"),
    ] {
        std::fs::write(t.path().join("campaigns/prompts/p.txt"), "a prompt").unwrap();
        std::fs::write(&requests, &lines).unwrap();
        // With the digest of the file as changed: the lines themselves are refused.
        std::fs::write(&file, text.replace(&pinned, &sovereign::util::sha256(lines.as_bytes()))).unwrap();
        let r = run(&["campaign", "check", f]);
        assert!(r.code != 0 && (r.stderr.contains(says) || r.stdout.contains(says)), "{says}: {}{}", r.stdout, r.stderr);
        // With the old digest: refused for the digest, naming the field.
        std::fs::write(&file, &text).unwrap();
        let r = run(&["campaign", "check", f]);
        assert!(r.code != 0 && (r.stderr + &r.stdout).contains("workload.requests_sha256"), "{says}");
    }
}

/// The shipped session campaign on a forged stand-in for its model (4 slots, 4 outputs a
/// request, this build's identity): every session (reset, cold, separate) is exact against the
/// resident session request by request; `requests.csv` has a row per request of every cell;
/// the pair is the sessions' request+reset wall time; the claim verifies and replays.
#[test]
fn the_shipped_session_campaign_runs_sessions_against_separate_runs_and_exports_each_request() {
    use crate::common::anchored_claim;
    if !crate::common::cgroups_usable() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let file = session_campaign(t.path());
    let (f, results, out) = (file.to_str().unwrap(), t.path().join("results"), t.path().join("export"));
    let (results, out) = (results.to_str().unwrap(), out.to_str().unwrap());
    ok(&["campaign", "run", f, "--results", results, "--no-progress"]);
    let exported = ok(&["export", "--campaign", "session-tiny", "--results", results, "--out", out]);
    let table = |name: &str| -> (csv::StringRecord, Vec<csv::StringRecord>) {
        let mut rd = csv::Reader::from_path(Path::new(out).join(name)).unwrap();
        (rd.headers().unwrap().clone(), rd.records().map(Result::unwrap).collect())
    };
    let (h, cells) = table("cells.csv");
    let col = |h: &csv::StringRecord, n: &str| h.iter().position(|c| c == n).unwrap_or_else(|| panic!("{n} in {h:?}"));
    assert_eq!(cells.len(), 10);
    for row in &cells {
        let arm = &row[col(&h, "arm")];
        assert_eq!(&row[col(&h, "status")], "completed", "{arm}: {}", &row[col(&h, "error")]);
        assert_eq!(&row[col(&h, "valid")], "true", "{arm}");
        assert_eq!(&row[col(&h, "requests")], "8", "{arm}");
        assert_eq!(&row[col(&h, "prompt_tokens")], "2784", "{arm}");
        assert_eq!(&row[col(&h, "generated_tokens")], "32", "{arm}");
        assert_eq!(&row[col(&h, "scored")], "8", "{arm}");
        if arm != "resident" {
            assert_eq!(&row[col(&h, "exact")], "true", "{arm}: every request, every surface");
            assert_eq!(&row[col(&h, "admission")], "true", "{arm}");
            assert_eq!(&row[col(&h, "between")], arm);
        }
    }
    let (rh, requests) = table("requests.csv");
    assert_eq!(requests.len(), 80, "eight requests of ten sessions");
    for arm in ["reset", "cold", "separate"] {
        let rows: Vec<&csv::StringRecord> = requests.iter().filter(|r| &r[col(&rh, "arm")] == arm).collect();
        assert_eq!(rows.len(), 24);
        let epochs: Vec<&str> = rows.iter().take(8).map(|r| &r[col(&rh, "epoch")]).collect();
        let want: Vec<String> = (0..8).map(|i| if arm == "separate" { "0".to_string() } else { i.to_string() }).collect();
        assert_eq!(epochs, want, "{arm}: one reset before each request after the first, in one Plan");
        assert!(rows.iter().all(|r| r[col(&rh, "read_bytes")].parse::<u64>().unwrap() > 0 && !r[col(&rh, "f1")].is_empty()));
    }
    // The pair: request+reset wall time of the session over the separate runs', per block.
    let (ph, pairs) = table("pairs_summary.csv");
    assert_eq!(&pairs[0][col(&ph, "metric_pointer")], "/timing/requests_wall_s");
    assert_eq!(&pairs[0][col(&ph, "n")], "3");
    // The criterion: the sessions' mean F1 against the separate runs', judged and stated.
    let (kh, k) = table("criterion.csv");
    assert_eq!((&k[0][col(&kh, "difference")], &k[0][col(&kh, "holds")], &k[0][col(&kh, "b_cells")]), ("0", "true", "3"));
    assert!(exported.stdout.contains("criterion mean record.json/scores/f1 of reset less separate's >= -0.01"), "{}", exported.stdout);
    let claim = anchored_claim(&exported.stdout, "session-tiny");
    let ledger = Path::new(out).join("claims.json");
    let l = ledger.to_str().unwrap();
    assert!(ok(&["verify", "--claim", &claim, "--ledger", l, "--results", results]).stdout.contains("verify passed"));
    let replayed = ok(&["replay", "--claim", &claim, "--ledger", l, "--results", results]).stdout;
    assert!(replayed.contains("replay passed") && replayed.contains("criterion record.json/scores/f1"), "{replayed}");
    // Reproduced from the claim's pinned identity: every session again, bitwise, request by
    // request; the criterion, exactness and admission hold again (timings may move).
    let repro = t.path().join("repro");
    let (c, r) = (repro.to_str().unwrap(), file.to_str().unwrap());
    let args = ["reproduce", "--claim", &claim, "--ledger", l, "--results", results, "--out", c, "--campaign", r, "--json"];
    let v: serde_json::Value = serde_json::from_str(&crate::common::run(&args).stdout).unwrap();
    let report = &v["report"];
    let records = report["records"].as_array().unwrap();
    assert_eq!(records.len(), 10, "{report:#}");
    for p in records {
        let surfaces = p["surfaces"].as_object().unwrap();
        assert_eq!(surfaces.len(), 32, "four surfaces of eight requests: {p}");
        assert!(surfaces.values().all(|x| x == "exact"), "{p}");
    }
    for a in report["assertions"].as_array().unwrap().iter().filter(|a| a["kind"] != "timing") {
        assert_eq!(a["holds"], true, "{a}");
    }
    assert!(report["assertions"].as_array().unwrap().iter().any(|a| a["kind"] == "criterion"), "{report:#}");
    // A criterion stated otherwise than the records give fails the replay.
    let text = std::fs::read_to_string(&ledger).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let replay = v["claims"]["session-tiny"]["replay"].as_array_mut().unwrap();
    let k = replay.iter_mut().find_map(|r| r.get_mut("criterion")).expect("the claim states the criterion");
    k["expect"]["holds"] = false.into();
    let forged = Path::new(out).join("forged.json");
    std::fs::write(&forged, serde_json::to_string(&v).unwrap()).unwrap();
    let f = forged.to_str().unwrap();
    let r = crate::common::run(&["replay", "--claim", "session-tiny", "--unanchored", "--ledger", f, "--results", results]);
    assert!(r.code != 0 && r.stdout.contains("criterion"), "{}{}", r.stdout, r.stderr);
}

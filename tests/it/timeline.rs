//! The timeline of decode tokens through the real engine and sources: every token's busy and
//! idle time add up to its wall time, the kept token's events are ordered and complete and
//! agree with the Plan's own read counts, the record loads back to its own bytes, and the
//! figure draws one bar per read.

use crate::common;

use common::*;
use sovereign::export::timeline::{read, READ_COLOUR};
use sovereign::plan::timeline::{Kind, TimelineFile};
use sovereign::record::{load_generate, load_typed};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const PROMPT: &str = "Every read of a token has its time: submitted, taken back, copied, computed.";
/// 9 outputs: 8 decode tokens after the prompt, the middle one is token 4.
const OUTPUTS: u32 = 9;

fn plan_run(model: &Path, rec: &Path, extra: &[&str]) {
    let mut args = vec!["--experts", "plan", "--slots", "5", "--ignore-eos"];
    args.extend_from_slice(extra);
    let r = generate(model, PROMPT, OUTPUTS, rec, &args);
    assert_eq!(r.code, 0, "generate {extra:?}: {}{}", r.stdout, r.stderr);
}

/// The union of [submit, taken back] over the token's reads, apart from the record's sweep.
fn union_ns(f: &TimelineFile) -> u64 {
    let mut iv: Vec<(u64, u64)> = f.reads().into_iter().map(|r| (r.submit.t_ns, r.done_ns.expect("every read came back"))).collect();
    iv.sort();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (a, b) in iv {
        match merged.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => merged.push((a, b)),
        }
    }
    merged.iter().map(|(a, b)| b - a).sum()
}

fn check(rec: &Path, want_token: u32) -> TimelineFile {
    let r = load_generate(rec).unwrap();
    let plan = r.plan().expect("a Plan report");
    let tl = plan.timeline.as_ref().expect("the record states the timeline");
    assert_eq!(tl.tokens, OUTPUTS - 1, "one summary per decode token");
    assert_eq!(tl.events_token, Some(want_token));
    assert_eq!(tl.events_dropped, 0, "the buffer held every event");
    let res = tl.clock_resolution_ns.max(1);
    let mut decode_reads = 0;
    for (i, t) in tl.per_token.iter().enumerate() {
        let x = &t.times;
        assert_eq!(t.token, i as u32);
        assert!(x.busy_ns + x.idle_ns <= x.wall_ns + res && x.wall_ns <= x.busy_ns + x.idle_ns + res, "token {i}: {x:?}");
        assert_eq!(x.idle.sum(), x.idle_ns, "token {i}: idle split");
        assert_eq!(x.busy.sum(), x.busy_ns, "token {i}: busy split");
        assert_eq!(x.reads, x.plan_reads, "token {i}: read marks against the Plan's count");
        assert_eq!(x.completions, x.reads, "token {i}: every read came back within its token");
        assert_eq!(x.copies, x.publishes);
        assert_eq!(x.acquires, x.releases);
        assert!(x.idle.between_ns > 0 && x.idle.compute_ns > 0, "token {i}: {x:?}");
        decode_reads += x.plan_reads;
    }
    assert_eq!(tl.total.wall_ns, tl.per_token.iter().map(|t| t.times.wall_ns).sum::<u64>());
    assert_eq!(tl.total.reads, decode_reads);
    assert!(decode_reads > 0 && decode_reads < plan.telemetry.q_run.reads, "the prompt's reads are not a decode token's");

    let f = read(rec).unwrap();
    assert_eq!(f.token, want_token);
    assert_eq!(f.times, tl.per_token[want_token as usize].times);
    assert_eq!(f.events.first().map(|e| e.kind), Some(Kind::Begin));
    let end = f.events.last().unwrap();
    assert_eq!((end.kind, end.t_ns), (Kind::End, f.times.wall_ns));
    assert!(f.events.windows(2).all(|w| w[0].t_ns <= w[1].t_ns && w[0].end_ns() <= w[1].t_ns), "events ordered, none overlapping");
    let submitted: BTreeSet<u64> = f.events.iter().filter(|e| e.kind == Kind::Submit).map(|e| e.ticket.unwrap()).collect();
    let completed: BTreeSet<u64> = f.events.iter().filter(|e| e.kind == Kind::Complete).map(|e| e.ticket.unwrap()).collect();
    assert_eq!(submitted, completed, "every submitted ticket completes in the token");
    assert_eq!(submitted.len() as u64, f.times.plan_reads, "read events equal the Plan's reads of the token");
    let bytes: u64 = f.events.iter().filter(|e| e.kind == Kind::Submit).map(|e| e.bytes.unwrap()).sum();
    assert_eq!(bytes, f.times.read_bytes);
    assert_eq!(union_ns(&f), f.times.busy_ns, "busy is the union of the read intervals");
    // Every MoE layer's router ran and its acquire returned once per pass.
    let mut enters: BTreeMap<u32, u32> = BTreeMap::new();
    for e in f.events.iter().filter(|e| e.kind == Kind::AcquireEnter) {
        *enters.entry(e.layer.unwrap()).or_default() += 1;
    }
    assert_eq!(enters.keys().copied().collect::<Vec<_>>(), f.layers);
    f
}

fn assert_round_trip(dir: &Path) {
    let file = std::fs::read_to_string(dir.join("record.json")).unwrap();
    let typed = load_typed(dir).unwrap();
    let again = serde_json::to_string_pretty(&serde_json::to_value(&typed).unwrap()).unwrap() + "\n";
    assert!(again == file, "{}: the typed record does not write back its own bytes", dir.display());
}

#[test]
fn decode_tokens_have_their_time_and_one_bar_per_read() {
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 5, &[]);
    let resident = dir.path().join("resident");
    let r = generate(&m, PROMPT, OUTPUTS, &resident, &["--ignore-eos"]);
    assert_eq!(r.code, 0, "{}", r.stderr);

    // F with prefetch: reads of the next layer overlap this layer's compute.
    let f_rec = dir.path().join("f");
    plan_run(&m, &f_rec, &["--source", "f", "--policy", "zero+prefetch"]);
    let f = check(&f_rec, 4);
    assert!(f.times.busy.compute_ns + f.times.busy.expert_compute_ns > 0, "prefetch reads overlap compute: {:?}", f.times);
    // D, asked for token 2: a synchronous source stalls inside submit.
    let d_rec = dir.path().join("d");
    plan_run(&m, &d_rec, &["--source", "d", "--timeline-token", "2"]);
    let d = check(&d_rec, 2);
    assert!(d.times.busy.submit_ns > 0 && d.times.stalled_on_reads_ns >= d.times.busy.submit_ns, "{:?}", d.times);

    for rec in [&f_rec, &d_rec] {
        assert_round_trip(rec);
        ok(&["compare", resident.to_str().unwrap(), rec.to_str().unwrap()]);
    }
    assert!(!load_generate(&resident).unwrap().surfaces.contains_key("timeline"), "a resident run has no timeline");

    let svg = dir.path().join("f.svg");
    let out = ok(&["export", "timeline", "--record", f_rec.to_str().unwrap(), "--out", svg.to_str().unwrap()]);
    assert!(out.stdout.contains("decode token 4") && out.stdout.contains("idle"), "{}", out.stdout);
    let text = std::fs::read_to_string(&svg).unwrap();
    let colour = format!("fill=\"#{:02X}{:02X}{:02X}\"", READ_COLOUR.0, READ_COLOUR.1, READ_COLOUR.2);
    // One bar per read, and the legend's swatch.
    assert_eq!(text.matches(&colour).count() as u64, f.times.reads + 1, "read bars in {}", svg.display());
    let png = dir.path().join("d.png");
    ok(&["export", "timeline", "--record", d_rec.to_str().unwrap(), "--out", png.to_str().unwrap()]);
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));

    // A record without the surface, and a flag without the Plan, are one line each.
    let r = run(&["export", "timeline", "--record", resident.to_str().unwrap(), "--out", svg.to_str().unwrap()]);
    assert_one_line_error(&r, &["resident", "no timeline surface"]);
    let r = generate(&m, PROMPT, 2, &dir.path().join("x"), &["--timeline-token", "1"]);
    assert_one_line_error(&r, &["--timeline-token", "--experts plan"]);
}

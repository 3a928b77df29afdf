//! The CSV tables' rows: one struct per table, whose fields are its columns in order.

use super::{measure_name, s, ArmRow, FloorRow, Sealed, WallRow, MIB};
use crate::campaign::spec::Campaign;
use crate::campaign::CellSpec;
use crate::record::TypedRecord;
use anyhow::{Context, Result};
use serde::Serialize;
use std::path::Path;

/// Floats as Rust prints them (`1`, `0.0000001`): the csv crate's own form (`1.0`, `1e-7`)
/// would change the tables' bytes.
pub(super) mod shown {
    use serde::Serializer;

    pub fn f64<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn opt<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => s.collect_str(x),
            None => s.serialize_none(),
        }
    }
}

/// Writes `rows` under a header of `T`'s field names; an empty table still has its header.
pub(super) fn write_table<T: Serialize + Default>(path: &Path, rows: &[T]) -> Result<()> {
    let mut w = csv::Writer::from_path(path).with_context(|| format!("{}: cannot create", path.display()))?;
    if rows.is_empty() {
        // serde names the columns only while a row is written: write one to memory, keep its header.
        let mut probe = csv::Writer::from_writer(Vec::new());
        probe.serialize(T::default())?;
        let bytes = probe.into_inner().map_err(|e| anyhow::anyhow!("{e}"))?;
        w.write_record(csv::Reader::from_reader(&bytes[..]).headers()?)?;
    }
    for r in rows {
        w.serialize(r)?;
    }
    w.flush()?;
    Ok(())
}

/// `cells.csv`: one row per cell.
#[derive(Serialize, Default)]
pub(super) struct CellRow {
    campaign: String,
    campaign_sha256: String,
    index: usize,
    cell: String,
    arm: String,
    block: usize,
    position: usize,
    order: String,
    experts: Option<String>,
    source: Option<String>,
    policy: Option<String>,
    slots: Option<u32>,
    windows: Option<u32>,
    depth: Option<u32>,
    fault: Option<String>,
    threads: Option<u32>,
    memory_cap_bytes: Option<u64>,
    state: String,
    record: Option<String>,
    attempt: Option<u32>,
    status: Option<&'static str>,
    valid: Option<bool>,
    exact: Option<bool>,
    admission: Option<bool>,
    #[serde(serialize_with = "shown::opt")]
    wall_s: Option<f64>,
    // Record values, written as the record writes them.
    load_s: String,
    prefill_s: String,
    decode_s: String,
    prefill_tokens_per_s: String,
    decode_tokens_per_s: String,
    prompt_tokens: String,
    generated_tokens: String,
    model_sha256: String,
    binary_sha256: String,
    engine_tree_sha256: String,
    node: String,
    record_bytes: Option<u64>,
    logits_bytes: String,
    source_logical_bytes: String,
    source_physical_bytes: String,
    memory_peak_bytes: Option<u64>,
    memory_max_events: Option<u64>,
    oom_kill_events: Option<u64>,
    swap_peak_bytes: Option<u64>,
    child_max_rss_bytes: Option<u64>,
    error: Option<String>,
    fault_validated: Option<bool>,
    fault_failed_checks: Option<String>,
    measure: Option<&'static str>,
    #[serde(serialize_with = "shown::opt")]
    decode_s_per_token: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    read_s_per_decode_token: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    read_s_prefill: Option<f64>,
    replay_depth: Option<u32>,
    envelope_best_depth: Option<u32>,
    #[serde(serialize_with = "shown::opt")]
    envelope_best_mib_per_s: Option<f64>,
    // Temporal amortization (`draft` arms): the proposer, and the record's speculative report.
    draft: Option<String>,
    draft_max: Option<u32>,
    traversals: Option<u64>,
    #[serde(serialize_with = "shown::opt")]
    outputs_per_traversal: Option<f64>,
    drafted: Option<u64>,
    accepted: Option<u64>,
    #[serde(serialize_with = "shown::opt")]
    expert_bytes_per_output: Option<f64>,
    // Sessions (`workload.requests`): what carried between requests, how many ran, their
    // request+reset wall time and the mean task scores.
    between: Option<&'static str>,
    requests: Option<usize>,
    #[serde(serialize_with = "shown::opt")]
    requests_wall_s: Option<f64>,
    scored: Option<u64>,
    #[serde(serialize_with = "shown::opt")]
    f1: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    exact_match: Option<f64>,
}

/// `requests.csv` (session campaigns): one row per request of every sealed session.
#[derive(Serialize, Default)]
pub(super) struct RequestRow {
    cell: String,
    arm: String,
    block: usize,
    record: String,
    between: Option<&'static str>,
    place: usize,
    id: String,
    outcome: &'static str,
    n_predict: u32,
    prompt_tokens: usize,
    generated_tokens: usize,
    #[serde(serialize_with = "shown::f64")]
    between_s: f64,
    #[serde(serialize_with = "shown::f64")]
    wall_s: f64,
    read_bytes: Option<u64>,
    hits: Option<u64>,
    misses: Option<u64>,
    epoch: Option<u64>,
    #[serde(serialize_with = "shown::opt")]
    f1: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    exact_match: Option<f64>,
    request_record_sha256: String,
}

impl RequestRow {
    /// The rows of a sealed session's requests, in order.
    pub(super) fn of(cell: &CellSpec, sealed: &Sealed) -> Vec<RequestRow> {
        let Some(TypedRecord::Session(s)) = &sealed.record else { return Vec::new() };
        s.requests
            .iter()
            .enumerate()
            .map(|(place, r)| RequestRow {
                cell: cell.key.clone(),
                arm: cell.arm.id.value.clone(),
                block: cell.block,
                record: sealed.digest.clone(),
                between: s.between.map(crate::session::Between::name),
                place,
                id: r.id.clone(),
                outcome: r.outcome.name(),
                n_predict: r.n_predict,
                prompt_tokens: r.prompt_tokens,
                generated_tokens: r.generated_tokens,
                between_s: r.between_s,
                wall_s: r.wall_s,
                read_bytes: r.served.map(|v| v.read_bytes),
                hits: r.served.map(|v| v.hits),
                misses: r.served.map(|v| v.misses),
                epoch: r.served.map(|v| v.epoch),
                f1: r.score.map(|v| v.f1),
                exact_match: r.score.map(|v| v.exact_match),
                request_record_sha256: r.record_sha256.clone(),
            })
            .collect()
    }
}

impl CellRow {
    pub(super) fn new(
        c: &Campaign,
        digest: &str,
        cell: &CellSpec,
        state: &str,
        sealed: Option<&Sealed>,
        record_bytes: Option<u64>,
    ) -> CellRow {
        let a = &cell.arm;
        let rec = sealed.and_then(|x| x.record.as_ref());
        let doc = sealed.map(|x| &x.doc);
        let generate = sealed.and_then(Sealed::generate);
        let refine = sealed.and_then(Sealed::refine);
        let timing = generate.and_then(|r| r.timing.as_ref());
        let speculative = generate.and_then(|r| r.speculative.as_ref());
        let q_run = generate.and_then(|r| r.plan()).map(|p| &p.telemetry.q_run);
        let replay = sealed.and_then(Sealed::read_replay);
        let best = sealed.and_then(Sealed::envelope).and_then(|e| e.best.as_ref());
        let t = doc.map(|d| &d.outcome.telemetry);
        let fault = doc.and_then(|d| d.fault.as_ref()).map(|f| &f.validation);
        let session = match rec {
            Some(TypedRecord::Session(s)) => Some(s),
            _ => None,
        };
        let scores = session.and_then(|s| s.scores);
        CellRow {
            campaign: c.id.value.clone(),
            campaign_sha256: digest.to_string(),
            index: cell.index,
            cell: cell.key.clone(),
            arm: a.id.value.clone(),
            block: cell.block,
            position: cell.position,
            order: cell.order.clone(),
            experts: a.experts.map(|e| format!("{e:?}").to_lowercase()),
            source: a.source.map(|v| format!("{v:?}").to_lowercase()),
            policy: a.policy.as_ref().map(|p| p.to_string()),
            slots: a.slots,
            windows: a.windows,
            depth: a.depth,
            fault: a.fault.map(|f| f.name().to_string()),
            threads: a.threads,
            memory_cap_bytes: a.memory_cap_bytes,
            state: state.to_string(),
            record: sealed.map(|x| x.digest.clone()),
            attempt: doc.map(|d| d.attempt),
            status: doc.map(|d| d.outcome.status.name()),
            valid: doc.map(|d| d.validity.valid),
            exact: doc.and_then(|d| d.oracle.exact),
            admission: doc.and_then(|d| d.admission.passed),
            wall_s: doc.map(|d| d.outcome.wall_s),
            load_s: s(timing
                .map(|t| t.load_s)
                .or(refine.and_then(|r| r.timing.as_ref()).map(|t| t.load_s))
                .or(session.and_then(|s| s.timing).map(|t| t.load_s))),
            prefill_s: s(timing.map(|t| t.prefill_s)),
            decode_s: s(timing.map(|t| t.decode_s)),
            prefill_tokens_per_s: s(timing.map(|t| t.prefill_tokens_per_s)),
            decode_tokens_per_s: s(timing.map(|t| t.decode_tokens_per_s)),
            prompt_tokens: s(rec.and_then(TypedRecord::prompt_tokens)),
            generated_tokens: s(rec.and_then(TypedRecord::generated_tokens)),
            model_sha256: s(rec.and_then(|r| r.model()).map(|m| &m.sha256)),
            binary_sha256: s(rec.map(|r| &r.build().binary_sha256)),
            engine_tree_sha256: s(rec.map(|r| &r.build().engine.tree_sha256)),
            node: s(rec.and_then(|r| r.build().node.as_ref()).map(|n| &n.id)),
            record_bytes,
            logits_bytes: s(rec.and_then(|r| r.surfaces().get("logits")).map(|l| l.bytes)),
            // Plan arms report their source traffic (Q_run) in the Plan's telemetry.
            source_logical_bytes: s(q_run.map(|q| q.logical_bytes)),
            source_physical_bytes: s(q_run.map(|q| q.physical_bytes)),
            memory_peak_bytes: t.and_then(|t| t.memory_peak_bytes),
            memory_max_events: t.and_then(|t| t.memory_max_events),
            oom_kill_events: t.and_then(|t| t.oom_kill_events),
            swap_peak_bytes: t.and_then(|t| t.swap_peak_bytes),
            child_max_rss_bytes: t.and_then(|t| t.child_max_rss_bytes),
            error: doc.and_then(|d| d.outcome.error.clone()),
            fault_validated: fault.map(|f| f.passed),
            fault_failed_checks: fault.map(|f| f.failed.join(";")),
            measure: a.measure.as_ref().map(measure_name),
            decode_s_per_token: sealed.and_then(Sealed::decode_s_per_token),
            read_s_per_decode_token: replay.and_then(|r| r.decode_s_per_token()),
            read_s_prefill: replay.and_then(|r| r.prefill.as_ref()).map(|p| p.seconds),
            replay_depth: replay.and_then(|r| r.params.as_ref()).map(|p| p.depth),
            envelope_best_depth: best.map(|b| b.depth),
            envelope_best_mib_per_s: best.map(|b| b.mib_per_s),
            draft: a.draft.clone(),
            draft_max: a.draft_max,
            traversals: speculative.map(|r| r.traversals),
            outputs_per_traversal: speculative.map(|r| r.outputs_per_traversal),
            drafted: speculative.map(|r| r.drafted),
            accepted: speculative.map(|r| r.accepted),
            expert_bytes_per_output: speculative.and_then(|r| r.expert_bytes_per_output),
            between: session.and_then(|s| s.between).map(crate::session::Between::name),
            requests: session.map(|s| s.requests.len()),
            requests_wall_s: session.and_then(|s| s.timing).map(|t| t.requests_wall_s),
            scored: scores.map(|a| a.scored),
            f1: scores.map(|a| a.f1),
            exact_match: scores.map(|a| a.exact_match),
        }
    }
}

/// `pairs.csv`: a block holding both arms of `analysis.pairs`, both completed.
#[derive(Serialize, Default)]
pub(super) struct PairRow {
    pub block: usize,
    pub order: String,
    pub a_arm: String,
    pub b_arm: String,
    pub a_cell: String,
    pub b_cell: String,
    pub a_record: String,
    pub b_record: String,
    pub metric_file: String,
    pub metric_pointer: String,
    #[serde(serialize_with = "shown::f64")]
    pub a: f64,
    #[serde(serialize_with = "shown::f64")]
    pub b: f64,
    #[serde(serialize_with = "shown::f64")]
    pub ratio_b_over_a: f64,
    #[serde(serialize_with = "shown::f64")]
    pub log_ratio: f64,
    pub a_admission: Option<bool>,
    pub b_admission: Option<bool>,
    pub a_node: String,
    pub b_node: String,
}

/// One arm's side of a pair: its cell, record and metric value.
pub(super) struct PairSide<'a> {
    pub cell: &'a CellSpec,
    pub sealed: &'a Sealed,
    pub value: f64,
}

impl PairRow {
    pub(super) fn new(p: &crate::campaign::spec::PairAnalysis, block: usize, a: PairSide, b: PairSide) -> PairRow {
        PairRow {
            block,
            order: a.cell.order.clone(),
            a_arm: p.a.value.clone(),
            b_arm: p.b.value.clone(),
            a_cell: a.cell.key.clone(),
            b_cell: b.cell.key.clone(),
            a_record: a.sealed.digest.clone(),
            b_record: b.sealed.digest.clone(),
            metric_file: p.metric.file.clone(),
            metric_pointer: p.metric.pointer.clone(),
            a: a.value,
            b: b.value,
            ratio_b_over_a: b.value / a.value,
            log_ratio: (b.value / a.value).ln(),
            a_admission: a.sealed.doc.admission.passed,
            b_admission: b.sealed.doc.admission.passed,
            a_node: s(a.sealed.node()),
            b_node: s(b.sealed.node()),
        }
    }
}

/// `floor.csv`: one block of `analysis.floor`.
#[derive(Serialize, Default)]
pub(super) struct FloorLine {
    block: usize,
    order: String,
    arm_cell: String,
    replay_cell: String,
    compute_cell: String,
    arm_record: String,
    replay_record: String,
    compute_record: String,
    #[serde(serialize_with = "shown::f64")]
    arm_s_per_token: f64,
    #[serde(serialize_with = "shown::f64")]
    read_s_per_token: f64,
    #[serde(serialize_with = "shown::f64")]
    compute_s_per_token: f64,
    #[serde(serialize_with = "shown::f64")]
    floor_s_per_token: f64,
    bound: &'static str,
    /// Empty where the block's floor is broken.
    #[serde(serialize_with = "shown::opt")]
    ratio_to_floor: Option<f64>,
    replay_depth: Option<u32>,
    valid: String,
    #[serde(serialize_with = "shown::f64")]
    decode_bytes_per_token: f64,
    #[serde(serialize_with = "shown::f64")]
    arm_mib_per_s: f64,
    #[serde(serialize_with = "shown::f64")]
    replay_mib_per_s: f64,
    envelope_cell: String,
    #[serde(serialize_with = "shown::opt")]
    envelope_mib_per_s: Option<f64>,
    #[serde(serialize_with = "shown::opt")]
    arm_over_envelope: Option<f64>,
    /// Decode seconds per token with no read in flight while the engine computed (the arm's
    /// timeline); empty without one.
    #[serde(serialize_with = "shown::opt")]
    arm_idle_s_per_token: Option<f64>,
    /// Decode seconds per token with no read in flight while the Plan verified, copied or kept
    /// its books: the arm's own, outside every bound.
    #[serde(serialize_with = "shown::opt")]
    arm_plan_idle_s_per_token: Option<f64>,
    /// Decode seconds per token with a read in flight (the arm's timeline).
    #[serde(serialize_with = "shown::opt")]
    arm_busy_s_per_token: Option<f64>,
    /// Of those, the seconds the Plan verified, published or kept its books: CPU work its
    /// replay does not do.
    #[serde(serialize_with = "shown::opt")]
    arm_plan_busy_s_per_token: Option<f64>,
    /// The replay's time plus that idle: the least the arm could take with its idle unchanged.
    #[serde(serialize_with = "shown::opt")]
    idle_bound_s_per_token: Option<f64>,
    /// That bound over the floor; empty where the floor is broken.
    #[serde(serialize_with = "shown::opt")]
    idle_bound_over_floor: Option<f64>,
    /// The replay's reads again with every layer event drained before the next went out.
    #[serde(serialize_with = "shown::opt")]
    read_by_layer_s_per_token: Option<f64>,
    /// That replay plus the arm's idle: the idle bound under the router's own barriers. Empty
    /// where the floor is broken or the arm beat it (an instrument fault, not a result).
    #[serde(serialize_with = "shown::opt")]
    layer_bound_s_per_token: Option<f64>,
    /// The replay's decode phase whose time is `read_s_per_token`: the faster of `ubatch`
    /// (each token's reads at once) and `by_layer`.
    replay_phase: crate::record::ReplayDecode,
}

impl FloorLine {
    pub(super) fn new(r: &FloorRow) -> FloorLine {
        let broken = r.broken_term();
        let bound = r.idle_bound();
        FloorLine {
            block: r.block,
            order: r.order.clone(),
            arm_cell: r.arm.cell.key.clone(),
            replay_cell: r.replay.cell.key.clone(),
            compute_cell: r.compute.cell.key.clone(),
            arm_record: r.arm.sealed.digest.clone(),
            replay_record: r.replay.sealed.digest.clone(),
            compute_record: r.compute.sealed.digest.clone(),
            arm_s_per_token: r.arm.s_per_token,
            read_s_per_token: r.replay.s_per_token,
            compute_s_per_token: r.compute.s_per_token,
            floor_s_per_token: r.floor(),
            bound: if r.replay.s_per_token >= r.compute.s_per_token { "read" } else { "compute" },
            ratio_to_floor: broken.is_none().then(|| r.arm.s_per_token / r.floor()),
            replay_depth: r.replay.sealed.read_replay().and_then(|x| x.params.as_ref()).map(|p| p.depth),
            valid: match broken {
                None => "true".to_string(),
                Some(t @ ("read" | "compute")) => format!("false: faster than its {t} term"),
                Some("idle") => "false: faster than its replay plus its device idle".to_string(),
                Some(t) => format!("false: {t} faster than the envelope"),
            },
            decode_bytes_per_token: r.bytes_per_token,
            arm_mib_per_s: r.arm_bytes_per_s() / MIB,
            replay_mib_per_s: r.replay_bytes_per_s / MIB,
            envelope_cell: r.envelope.map(|(c, _)| c.key.clone()).unwrap_or_default(),
            envelope_mib_per_s: r.envelope.map(|(_, e)| e / MIB),
            arm_over_envelope: match (broken, r.envelope) {
                (None, Some((_, e))) => Some(r.arm_bytes_per_s() / e),
                _ => None,
            },
            arm_idle_s_per_token: r.arm.sealed.decode_idle_s_per_token(),
            arm_plan_idle_s_per_token: r.arm.sealed.decode_plan_idle_s_per_token(),
            arm_busy_s_per_token: r.arm.sealed.decode_busy_s_per_token(),
            arm_plan_busy_s_per_token: r.arm.sealed.decode_plan_busy_s_per_token(),
            idle_bound_s_per_token: bound,
            idle_bound_over_floor: bound.filter(|_| broken.is_none()).map(|b| b / r.floor()),
            read_by_layer_s_per_token: r.replay.sealed.read_replay().and_then(|x| x.decode_by_layer_s_per_token()),
            layer_bound_s_per_token: r.layer_bound().filter(|&b| broken.is_none() && r.arm.s_per_token >= b),
            replay_phase: r.replay_phase,
        }
    }
}

/// `wall.csv`: a [`WallRow`] with its floats written as the other tables write them.
#[derive(Serialize, Default)]
pub(super) struct WallLine<'a> {
    arm: &'a str,
    baseline: &'a str,
    #[serde(serialize_with = "shown::opt")]
    arm_wall_s: Option<f64>,
    arm_cells: usize,
    #[serde(serialize_with = "shown::opt")]
    baseline_wall_s: Option<f64>,
    baseline_cells: usize,
    #[serde(serialize_with = "shown::opt")]
    speedup: Option<f64>,
}

impl<'a> From<&'a WallRow> for WallLine<'a> {
    fn from(r: &'a WallRow) -> Self {
        let WallRow { arm, baseline, arm_wall_s, arm_cells, baseline_wall_s, baseline_cells, speedup } = r;
        WallLine {
            arm,
            baseline,
            arm_wall_s: *arm_wall_s,
            arm_cells: *arm_cells,
            baseline_wall_s: *baseline_wall_s,
            baseline_cells: *baseline_cells,
            speedup: *speedup,
        }
    }
}

/// `arms.csv`: an [`ArmRow`] with its floats written as the other tables write them.
#[derive(Serialize, Default)]
pub(super) struct ArmLine<'a> {
    arm: &'a str,
    kind: &'a str,
    cells: usize,
    completed: usize,
    #[serde(serialize_with = "shown::opt")]
    decode_tokens_per_s: Option<f64>,
    admitted: usize,
    admission_evaluated: usize,
    exact: usize,
    compared: usize,
    #[serde(serialize_with = "shown::opt")]
    read_mib_per_s: Option<f64>,
}

impl<'a> From<&'a ArmRow> for ArmLine<'a> {
    fn from(r: &'a ArmRow) -> Self {
        let ArmRow { arm, kind, cells, completed, decode_tokens_per_s, admitted, admission_evaluated, exact, compared, read_mib_per_s } = r;
        ArmLine {
            arm,
            kind,
            cells: *cells,
            completed: *completed,
            decode_tokens_per_s: *decode_tokens_per_s,
            admitted: *admitted,
            admission_evaluated: *admission_evaluated,
            exact: *exact,
            compared: *compared,
            read_mib_per_s: *read_mib_per_s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_keep_rust_float_text_and_an_empty_table_keeps_its_header() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("wall.csv");
        let r = WallRow {
            arm: "F".into(),
            baseline: "R".into(),
            arm_wall_s: Some(2.0),
            arm_cells: 3,
            baseline_wall_s: Some(1e-7),
            baseline_cells: 1,
            speedup: None,
        };
        write_table(&p, &[WallLine::from(&r)]).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "arm,baseline,arm_wall_s,arm_cells,baseline_wall_s,baseline_cells,speedup\nF,R,2,3,0.0000001,1,\n"
        );
        write_table::<WallLine>(&p, &[]).unwrap();
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "arm,baseline,arm_wall_s,arm_cells,baseline_wall_s,baseline_cells,speedup\n");
    }
}

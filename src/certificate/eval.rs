//! Predicates (1)–(3) in exact bytes with signed margins, and the claim classes.
//!
//! Every verdict is one of holds / fails (with the reason) / insufficient evidence (with what
//! is missing). Classes are reported dimension by dimension; nothing here adds them up.

use super::{Bytes, Certificate, Evidence, ExactResult, Grade, INSUFFICIENT};
use serde::Serialize;
use std::fmt::Write as _;

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
pub enum Verdict {
    Holds,
    Fails { reason: String },
    InsufficientEvidence { reason: String },
}

impl Verdict {
    pub fn holds(&self) -> bool {
        matches!(self, Verdict::Holds)
    }
    pub fn fails(&self) -> bool {
        matches!(self, Verdict::Fails { .. })
    }
    fn text(&self) -> String {
        match self {
            Verdict::Holds => "holds".into(),
            Verdict::Fails { reason } => format!("FAILS: {reason}"),
            Verdict::InsufficientEvidence { reason } => format!("insufficient evidence: {reason}"),
        }
    }
}

/// One operand of a predicate, by its name in the seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Operand {
    pub name: &'static str,
    pub bytes: Option<u64>,
    /// Why the operand is missing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub missing: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Predicate {
    /// `(1)`, `(2)`, `(3)`, and `(3d)`: (3) against G_decl instead of G_phys.
    pub id: &'static str,
    pub statement: &'static str,
    pub operands: Vec<Operand>,
    /// The right-hand side in bytes (may be negative for (1)).
    pub bound: Option<i128>,
    /// Left-hand side minus right-hand side: positive exactly when the predicate holds.
    pub margin: Option<i128>,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Class {
    /// `R`, `W`, `E[relation, h]`, `L[F]`.
    pub class: String,
    pub verdict: Verdict,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Classes {
    pub r: Class,
    pub w: Class,
    pub e: Class,
    pub l: Class,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Evaluation {
    pub predicates: Vec<Predicate>,
    pub classes: Classes,
    /// The resource (admission) predicate under the authority vector.
    pub resource: Verdict,
    /// R or W, a passing resource predicate, a named E that holds, clean L, one execution identity.
    pub sovereign_execution: Verdict,
    /// Every field the certificate marks `insufficient public evidence`, by path.
    pub insufficient_public_evidence: Vec<String>,
}

fn operand(name: &'static str, e: &Evidence<Bytes>, field: &str) -> Operand {
    match e.value() {
        Some(b) => Operand { name, bytes: Some(b.0), missing: None },
        None => Operand { name, bytes: None, missing: Some(format!("{field}: {INSUFFICIENT}")) },
    }
}

/// H_cap is an enforced allowance: only a hard-limit host boundary qualifies.
fn h_cap(c: &Certificate) -> Operand {
    let mut o = operand("H_cap", &c.boundaries.host.bytes, "boundaries.host.bytes");
    match c.boundaries.host.grade.value() {
        Some(Grade::HardLimit) => {}
        Some(g) => {
            o.bytes = None;
            o.missing = Some(format!("the host boundary is graded {}, not hard_limit: H_cap is an enforced allowance", g.name()));
        }
        None => {
            o.bytes = None;
            o.missing = Some(format!("boundaries.host.grade: {INSUFFICIENT}"));
        }
    }
    o
}

fn predicate(id: &'static str, statement: &'static str, lhs: Operand, a: Operand, b: Operand, minus: bool) -> Predicate {
    let ops = vec![lhs, a, b];
    let missing: Vec<String> = ops.iter().filter_map(|o| o.missing.clone()).collect();
    let (bound, margin, verdict) = if missing.is_empty() {
        let (l, x, y) = (ops[0].bytes.unwrap() as i128, ops[1].bytes.unwrap() as i128, ops[2].bytes.unwrap() as i128);
        let bound = if minus { x - y } else { x + y };
        let margin = l - bound;
        let verdict = if margin > 0 {
            Verdict::Holds
        } else {
            Verdict::Fails { reason: format!("{} = {l} does not exceed {bound}: margin {margin} bytes", ops[0].name) }
        };
        (Some(bound), Some(margin), verdict)
    } else {
        (None, None, Verdict::InsufficientEvidence { reason: missing.join("; ") })
    };
    Predicate { id, statement, operands: ops, bound, margin, verdict }
}

fn all_insufficient(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
    match v {
        serde_json::Value::String(s) if s == INSUFFICIENT => out.push(path.to_string()),
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                all_insufficient(x, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out);
            }
        }
        _ => {}
    }
}

/// Conjunction: any failure fails (all reasons), else any gap is insufficient, else holds.
fn conjunction(parts: &[(&str, Verdict)]) -> Verdict {
    let fails: Vec<String> = parts
        .iter()
        .filter_map(|(n, v)| match v {
            Verdict::Fails { reason } => Some(format!("{n}: {reason}")),
            _ => None,
        })
        .collect();
    if !fails.is_empty() {
        return Verdict::Fails { reason: fails.join("; ") };
    }
    let gaps: Vec<String> = parts
        .iter()
        .filter_map(|(n, v)| match v {
            Verdict::InsufficientEvidence { reason } => Some(format!("{n}: {reason}")),
            _ => None,
        })
        .collect();
    if !gaps.is_empty() {
        return Verdict::InsufficientEvidence { reason: gaps.join("; ") };
    }
    Verdict::Holds
}

fn gap(what: &str) -> Verdict {
    Verdict::InsufficientEvidence { reason: format!("{what}: {INSUFFICIENT}") }
}

pub fn evaluate(c: &Certificate) -> Evaluation {
    let [p1, p2, p3, p3d] = predicates(c);
    let r = Class { class: "R".into(), verdict: p2.verdict.clone() };
    let w = Class { class: "W".into(), verdict: p3.verdict.clone() };
    let e = exactness_class(c);
    let l = lifecycle_class(c);
    let resource = resource_verdict(c);
    let sovereign_execution = sovereign_execution(c, &r, &w, &resource, &e, &l);

    let mut insufficient = Vec::new();
    all_insufficient(&serde_json::to_value(c).expect("a certificate serializes"), "", &mut insufficient);

    Evaluation {
        predicates: vec![p1, p2, p3, p3d],
        classes: Classes { r, w, e, l },
        resource,
        sovereign_execution,
        insufficient_public_evidence: insufficient,
    }
}

/// Predicates (1), (2), (3), and (3d).
fn predicates(c: &Certificate) -> [Predicate; 4] {
    let i = &c.inventory;
    let b = &c.boundaries;
    let p1 = predicate(
        "(1)",
        "S > H_cap - R_policy",
        operand("S", &i.managed_bytes, "inventory.managed_bytes"),
        h_cap(c),
        operand("R_policy", &b.r_policy_bytes, "boundaries.r_policy_bytes"),
        true,
    );
    let p2 = predicate(
        "(2)",
        "T_repr > H_cap + G_decl",
        operand("T_repr", &i.t_repr_bytes, "inventory.t_repr_bytes"),
        h_cap(c),
        operand("G_decl", &b.gpu.bytes, "boundaries.gpu.bytes"),
        false,
    );
    let p3 = predicate(
        "(3)",
        "U_sem^LB > H_cap + G_phys",
        operand("U_sem^LB", &i.u_sem_lb_bytes, "inventory.u_sem_lb_bytes"),
        h_cap(c),
        operand("G_phys", &b.gpu_physical_bytes, "boundaries.gpu_physical_bytes"),
        false,
    );

    // The seed also states W's margin against the declared envelope (Table 5); W itself is (3).
    let p3d = predicate(
        "(3d)",
        "U_sem^LB > H_cap + G_decl",
        operand("U_sem^LB", &i.u_sem_lb_bytes, "inventory.u_sem_lb_bytes"),
        h_cap(c),
        operand("G_decl", &b.gpu.bytes, "boundaries.gpu.bytes"),
        false,
    );
    [p1, p2, p3, p3d]
}

/// E[relation, h]: the compared surfaces are exact against a named oracle.
fn exactness_class(c: &Certificate) -> Class {
    let x = &c.exactness;
    let e_name =
        format!("E[{}, {}]", x.relation.value().map_or("?", String::as_str), x.horizon.value().map_or("?".to_string(), u64::to_string));
    let e_verdict = match (x.relation.value(), x.horizon.value(), x.surfaces.value(), x.result.value()) {
        (_, _, _, Some(ExactResult::Differs)) => {
            Verdict::Fails { reason: x.detail.clone().unwrap_or_else(|| "the compared surfaces differ".into()) }
        }
        (None, ..) => gap("exactness.relation"),
        (_, None, ..) => gap("exactness.horizon"),
        (_, _, None, _) => gap("exactness.surfaces"),
        (_, _, _, None) => gap("exactness.result"),
        (Some(_), Some(_), Some(s), Some(ExactResult::Exact)) if s.is_empty() => {
            Verdict::InsufficientEvidence { reason: "exactness.surfaces names no surface".into() }
        }
        (Some(_), Some(_), Some(_), Some(ExactResult::Exact)) => match x.oracle.value() {
            Some(_) => Verdict::Holds,
            None => gap("exactness.oracle"),
        },
    };
    Class { class: e_name, verdict: e_verdict }
}

/// L[F]: the lifecycle's transitions were exercised and its closure is clean.
fn lifecycle_class(c: &Certificate) -> Class {
    let l = &c.lifecycle;
    let f = match (l.fault_cell.value().map(String::as_str), l.transitions.value()) {
        (Some("none") | None, Some(t)) => t.join(", "),
        (Some(cell), _) => format!("fault cell {cell}"),
        (None, None) => "?".into(),
    };
    let l_verdict = match (l.clean_closure.value(), l.transitions.value()) {
        (Some(false), _) => Verdict::Fails { reason: l.detail.clone().unwrap_or_else(|| "lifecycle closure is not clean".into()) },
        (None, _) => gap("lifecycle.clean_closure"),
        (Some(true), None) => gap("lifecycle.transitions"),
        (Some(true), Some(t)) if t.is_empty() => Verdict::InsufficientEvidence { reason: "no lifecycle transition was exercised".into() },
        (Some(true), Some(_)) => Verdict::Holds,
    };
    Class { class: format!("L[{f}]"), verdict: l_verdict }
}

/// The resource predicate: admitted, with both tiers' grades stated.
fn resource_verdict(c: &Certificate) -> Verdict {
    let b = &c.boundaries;
    match c.admission.admitted.value() {
        None => gap("admission.admitted"),
        Some(false) => Verdict::Fails {
            reason: if c.admission.failed.is_empty() {
                "not admitted".into()
            } else {
                format!("not admitted ({})", c.admission.failed.join("; "))
            },
        },
        Some(true) => match (b.host.grade.value(), b.gpu.grade.value()) {
            (None, _) => gap("boundaries.host.grade (the authority vector)"),
            (_, None) => gap("boundaries.gpu.grade (the authority vector)"),
            _ => Verdict::Holds,
        },
    }
}

/// Memory-sovereign execution: R or W, the resource predicate, E, L, and one build throughout.
fn sovereign_execution(c: &Certificate, r: &Class, w: &Class, resource: &Verdict, e: &Class, l: &Class) -> Verdict {
    let r_or_w = match (&r.verdict, &w.verdict) {
        (Verdict::Holds, _) | (_, Verdict::Holds) => Verdict::Holds,
        (Verdict::Fails { reason: a }, Verdict::Fails { reason: b }) => Verdict::Fails { reason: format!("neither R ({a}) nor W ({b})") },
        (Verdict::InsufficientEvidence { reason }, _) | (_, Verdict::InsufficientEvidence { reason }) => {
            Verdict::InsufficientEvidence { reason: reason.clone() }
        }
    };
    let identity = match c.exactness.same_build.value() {
        Some(true) => Verdict::Holds,
        Some(false) => Verdict::Fails { reason: "the oracle ran a different binary".into() },
        None => gap("exactness.same_build"),
    };
    conjunction(&[
        ("R or W", r_or_w),
        ("resource predicate", resource.clone()),
        (&e.class, e.verdict.clone()),
        (&l.class, l.verdict.clone()),
        ("one execution identity", identity),
    ])
}

fn ev_bytes(e: &Evidence<Bytes>) -> String {
    e.value().map_or(INSUFFICIENT.to_string(), |b| b.0.to_string())
}

fn ev<T: ToString>(e: &Evidence<T>) -> String {
    e.value().map_or(INSUFFICIENT.to_string(), |v| v.to_string())
}

/// The certificate and its evaluation for a person.
pub fn to_text(c: &Certificate, e: &Evaluation) -> String {
    let mut s = String::new();
    let i = &c.inventory;
    let b = &c.boundaries;
    let _ = writeln!(s, "certificate: {}", c.system);
    for src in &c.sources {
        let _ = writeln!(s, "  source: {src}");
    }
    let _ = writeln!(
        s,
        "I  T_repr {} | U_sem^LB {} | U_sched {} | Q_run {} logical, {} physical | S {}",
        ev_bytes(&i.t_repr_bytes),
        ev_bytes(&i.u_sem_lb_bytes),
        ev_bytes(&i.u_sched_bytes),
        ev_bytes(&i.q_run_logical_bytes),
        ev_bytes(&i.q_run_physical_bytes),
        ev_bytes(&i.managed_bytes)
    );
    let _ = writeln!(s, "   inclusion: {}", ev(&i.inclusion_rules));
    let _ = writeln!(s, "   model {} | binary {} | executable {}", ev(&*i.model_sha256), ev(&*i.binary_sha256), ev(&i.executable));
    let grade = |g: &Evidence<Grade>| g.value().map_or(INSUFFICIENT.to_string(), |g| g.name().to_string());
    let _ = writeln!(
        s,
        "B,A host {} bytes ({}) | gpu {} bytes ({}) | gpu physical {} | R_policy {}",
        ev_bytes(&b.host.bytes),
        grade(&b.host.grade),
        ev_bytes(&b.gpu.bytes),
        grade(&b.gpu.grade),
        ev_bytes(&b.gpu_physical_bytes),
        ev_bytes(&b.r_policy_bytes)
    );
    let x = &c.exactness;
    let surfaces = x.surfaces.value().map_or(INSUFFICIENT.to_string(), |v| v.join(", "));
    let result = x.result.value().map_or(INSUFFICIENT.to_string(), |r| format!("{r:?}").to_lowercase());
    let _ =
        writeln!(s, "E  {} over [{surfaces}] against {} (same build: {}): {result}", ev(&x.relation), ev(&x.oracle), ev(&*x.same_build));
    if let Some(d) = &x.detail {
        let _ = writeln!(s, "   {d}");
    }
    let l = &c.lifecycle;
    let list = |v: &Evidence<Vec<String>>| v.value().map_or(INSUFFICIENT.to_string(), |v| v.join(", "));
    let _ = writeln!(
        s,
        "L  invariants [{}] | transitions [{}] | clean closure {} | fault cell {}",
        list(&l.invariants),
        list(&l.transitions),
        ev(&l.clean_closure),
        ev(&l.fault_cell)
    );
    let _ = writeln!(s, "predicates:");
    for p in &e.predicates {
        let ops: Vec<String> = p.operands.iter().map(|o| format!("{}={}", o.name, o.bytes.map_or("?".into(), |b| b.to_string()))).collect();
        let margin = p.margin.map_or(String::new(), |m| format!(" margin {m}"));
        let _ = writeln!(s, "  {} {:<26} {}{margin}: {}", p.id, p.statement, ops.join(" "), p.verdict.text());
    }
    let _ = writeln!(s, "classes:");
    for k in [&e.classes.r, &e.classes.w, &e.classes.e, &e.classes.l] {
        let _ = writeln!(s, "  {:<12} {}", k.class, k.verdict.text());
    }
    let _ = writeln!(s, "resource predicate: {}", e.resource.text());
    let _ = writeln!(s, "memory-sovereign execution: {}", e.sovereign_execution.text());
    if !e.insufficient_public_evidence.is_empty() {
        let _ = writeln!(s, "insufficient public evidence: {}", e.insufficient_public_evidence.join(", "));
    }
    s
}

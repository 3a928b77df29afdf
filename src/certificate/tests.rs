use super::*;
use crate::certificate::eval::Predicate;

const GIB: u64 = 1 << 30;

fn seed(name: &str) -> Certificate {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("certificates").join(name);
    load(&path).unwrap_or_else(|e| panic!("{e:#}"))
}

fn pred<'a>(e: &'a Evaluation, id: &str) -> &'a Predicate {
    e.predicates.iter().find(|p| p.id == id).unwrap()
}

fn insufficient(v: &Verdict) -> bool {
    matches!(v, Verdict::InsufficientEvidence { .. })
}

/// Seed 000 §5.2: the three published C1 margins, to the byte, and R and W holding.
#[test]
fn seed_c1_reproduces_its_margins() {
    let c = seed("seed-c1.yaml");
    assert_eq!(c.boundaries.host.bytes, Evidence::Value(Bytes(11 * GIB)));
    let e = evaluate(&c);
    assert_eq!(pred(&e, "(2)").margin, Some(11_897_783_296));
    assert_eq!(pred(&e, "(3d)").margin, Some(10_301_210_624));
    assert_eq!(pred(&e, "(3)").margin, Some(9_227_468_800));
    assert_eq!(pred(&e, "(2)").bound, Some((11 + 23) * GIB as i128));
    assert_eq!(e.classes.r.verdict, Verdict::Holds);
    assert_eq!(e.classes.w.verdict, Verdict::Holds);
    assert_eq!(e.classes.e.class, "E[E_64-out, 64]");
    assert_eq!(e.classes.e.verdict, Verdict::Holds);
    assert_eq!(e.classes.l.verdict, Verdict::Holds);
    assert_eq!(e.resource, Verdict::Holds);
    assert_eq!(e.sovereign_execution, Verdict::Holds);
    // C1 publishes neither S nor R_policy: predicate (1) lacks evidence, it does not fail.
    assert!(insufficient(&pred(&e, "(1)").verdict), "{:?}", pred(&e, "(1)").verdict);
    assert!(e.insufficient_public_evidence.contains(&"inventory.managed_bytes".to_string()));
    assert!(e.insufficient_public_evidence.contains(&"boundaries.r_policy_bytes".to_string()));
}

/// Seed 000 §5.5: predicate (1) holds by 7,192,251,360 bytes; the unpublished rest is a gap.
#[test]
fn seed_c8_predicate_one_and_gaps() {
    let e = evaluate(&seed("seed-c8-gemma-direct.yaml"));
    let p1 = pred(&e, "(1)");
    assert_eq!(p1.bound, Some(5_654_130_720));
    assert_eq!(p1.margin, Some(7_192_251_360));
    assert_eq!(p1.verdict, Verdict::Holds);
    for v in [&e.classes.r.verdict, &e.classes.w.verdict, &e.classes.e.verdict, &e.resource, &e.sovereign_execution] {
        assert!(insufficient(v), "{v:?}");
    }
    assert!(e.insufficient_public_evidence.contains(&"exactness.horizon".to_string()));
}

const SMALL: &str = r#"
system: an external storage-offload artifact
inventory:
  t_repr_bytes: 20 GiB
  u_sem_lb_bytes: insufficient public evidence
  u_sched_bytes: insufficient public evidence
  q_run_logical_bytes: insufficient public evidence
  q_run_physical_bytes: insufficient public evidence
  managed_bytes: 18G
  inclusion_rules: all tensors
  model_sha256: insufficient public evidence
  binary_sha256: abababababababababababababababababababababababababababababababab
  executable: v1
boundaries:
  host: { bytes: 16 GiB, grade: hard_limit }
  gpu: { bytes: 8 GiB, grade: sampled_audit }
  gpu_physical_bytes: 8 GiB
  r_policy_bytes: 1 GiB
exactness:
  relation: E_tokens
  surfaces: [tokens]
  oracle: stock runtime
  same_build: true
  horizon: 32
  result: exact
lifecycle:
  invariants: insufficient public evidence
  transitions: insufficient public evidence
  clean_closure: insufficient public evidence
  fault_cell: none
admission:
  admitted: true
"#;

/// A hand-written certificate about another system: an `insufficient public evidence` field is
/// reported as such, never as a failure; a real shortfall is a failure with its margin.
#[test]
fn insufficient_is_not_failure() {
    let c = parse(SMALL).unwrap_or_else(|d| panic!("{d:?}"));
    let e = evaluate(&c);
    // W needs U_sem^LB, which nobody published.
    assert!(insufficient(&e.classes.w.verdict), "{:?}", e.classes.w.verdict);
    assert!(matches!(&e.classes.w.verdict, Verdict::InsufficientEvidence { reason } if reason.contains("inventory.u_sem_lb_bytes")));
    assert!(insufficient(&e.classes.l.verdict));
    // R: 20 GiB is below 16 + 8 GiB: fails with a negative margin.
    assert_eq!(pred(&e, "(2)").margin, Some(-4 * GIB as i128));
    assert!(e.classes.r.verdict.fails());
    // (1): 18 GiB > 16 - 1 GiB holds.
    assert_eq!(pred(&e, "(1)").margin, Some(3 * GIB as i128));
    // Neither R (fails) nor W (unknown): the composite lacks evidence for W and L, and R failing
    // alone does not decide it.
    assert!(insufficient(&e.sovereign_execution), "{:?}", e.sovereign_execution);
    assert!(e.insufficient_public_evidence.contains(&"lifecycle.clean_closure".to_string()));
    assert!(!e.insufficient_public_evidence.iter().any(|f| f.starts_with("boundaries")));
    // The certificate round-trips through JSON unchanged.
    let json = serde_json::to_string(&c).unwrap();
    let back = parse(&json).unwrap_or_else(|d| panic!("{d:?}"));
    assert_eq!(evaluate(&back), e);
}

#[test]
fn a_non_hard_host_boundary_is_not_h_cap() {
    let text = SMALL.replace("grade: hard_limit", "grade: high_water_mark");
    let e = evaluate(&parse(&text).unwrap());
    for p in &e.predicates {
        assert!(matches!(&p.verdict, Verdict::InsufficientEvidence { reason } if reason.contains("high_water_mark")), "{p:?}");
    }
}

#[test]
fn different_binaries_are_refused() {
    let text = SMALL.replace("  same_build: true\n", "  same_build: false\n");
    let d = parse(&text).unwrap_err();
    assert!(d[0].message.contains("different binaries"), "{d:?}");
    assert_eq!(d[0].line, 23, "{d:?}");

    let text = SMALL.replace(
        "  same_build: true\n",
        "  same_build: true\n  oracle_binary_sha256: cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd\n",
    );
    let d = parse(&text).unwrap_err();
    assert!(d[0].message.contains("refusing to pool evidence from different binaries"), "{d:?}");
    assert_eq!((d[0].line, d[0].column), (24, 25), "{d:?}");
}

#[test]
fn typos_and_bad_values_have_positions() {
    let d = parse(&SMALL.replace("  executable: v1\n", "  executable: v1\n  excutable: v2\n")).unwrap_err();
    assert_eq!(d.len(), 1);
    assert!(d[0].message.contains("excutable"), "{d:?}");
    assert_eq!(d[0].line, 14, "{d:?}");

    let d = parse(&SMALL.replace("managed_bytes: 18G", "managed_bytes: lots")).unwrap_err();
    assert!(d[0].message.contains("not a byte count") || d[0].message.contains("size suffix"), "{d:?}");
    assert_eq!(d[0].line, 9, "{d:?}");

    let d = parse(&SMALL.replace("grade: sampled_audit", "grade: audited")).unwrap_err();
    assert!(d[0].message.contains(INSUFFICIENT), "{d:?}");
    assert_eq!(d[0].line, 16, "{d:?}");

    let d = parse(&SMALL.replace("binary_sha256: abab", "binary_sha256: ab")).unwrap_err();
    assert!(d[0].message.contains("SHA-256"), "{d:?}");
    assert_eq!(d[0].line, 12, "{d:?}");
}

#[test]
fn byte_counts_are_exact() {
    assert_eq!(parse_bytes("11 GiB"), Ok(11 * GIB));
    assert_eq!(parse_bytes("48,405,005,312"), Ok(48_405_005_312));
    assert_eq!(parse_bytes("512M"), Ok(512 << 20));
    assert_eq!(parse_bytes("7"), Ok(7));
    assert!(parse_bytes("1.5G").is_err());
    assert!(parse_bytes("GiB").is_err());
    assert!(parse_bytes("99999999999T").is_err());
}

#[test]
fn checked_in_schema_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas/certificate.schema.json");
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == schema_json(),
        "{} is stale: regenerate with `cargo run -- certificate schema > schemas/certificate.schema.json`",
        path.display()
    );
}

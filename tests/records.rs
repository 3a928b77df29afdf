//! Records: exclusive staging, write-once commit, sealed records checked before use.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

#[test]
fn a_foreign_partial_is_refused_and_kept() {
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "m.gguf", 5, &[]);
    let rec = t.path().join("r");
    fs::create_dir(t.path().join("r.partial")).unwrap();
    fs::write(t.path().join("r.partial/other"), b"not ours").unwrap();
    let r = generate(&model, "hello", 2, &rec, &[]);
    assert_one_line_error(&r, &["r.partial", "already exists"]);
    assert_eq!(fs::read(t.path().join("r.partial/other")).unwrap(), b"not ours");
    assert!(!rec.exists());
}

#[test]
fn two_runs_on_one_record_leave_one_consistent_record() {
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "m.gguf", 5, &[]);
    let rec = t.path().join("same");
    let spawn = |prompt: &str| {
        bin()
            .args(["generate", "--model", model.to_str().unwrap(), "--prompt", prompt, "--n-predict", "4", "--threads", "1"])
            .args(["--record", rec.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| spawn("one prompt"));
        let b = s.spawn(|| spawn("another prompt entirely"));
        (a.join().unwrap(), b.join().unwrap())
    });
    let wins = [&a, &b].iter().filter(|o| o.status.success()).count();
    assert_eq!(wins, 1, "exactly one run owns the record: {a:?} {b:?}");
    // The record that exists matches its own record.json.
    let (_, surfaces) = sovereign::record::load(&rec).unwrap();
    for s in surfaces.values() {
        assert_eq!(sovereign::util::sha256_file(&rec.join(&s.file)).unwrap(), s.sha256, "{}", s.file);
    }
}

#[test]
fn compare_refuses_a_tampered_sealed_record() {
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "m.gguf", 5, &[]);
    let rec = t.path().join("r");
    assert_eq!(generate(&model, "hello", 2, &rec, &[]).code, 0);
    let sealed = sovereign::record::seal(&rec, &t.path().join("results")).unwrap();
    let d = sealed.dir.to_str().unwrap();
    ok(&["compare", d, d]);
    let f = sealed.dir.join("tokens.bin");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = fs::read(&f).unwrap();
    bytes[0] ^= 1;
    fs::write(&f, &bytes).unwrap();
    let r = run(&["compare", d, d]);
    assert_ne!(r.code, 0, "a tampered record compared: {}", r.stdout);
    assert!(r.stderr.contains("tokens.bin") && r.stderr.contains("tampered"), "{}", r.stderr);
}

//! Records: exclusive staging, write-once commit, sealed records checked before use.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;

/// A partial whose lock is free was left by a run that died (a generate killed with -9): it is
/// moved aside with its contents, one line names it, and the run proceeds.
#[test]
fn a_stale_partial_is_moved_aside_and_the_run_proceeds() {
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "m.gguf", 5, &[]);
    let rec = t.path().join("r");
    fs::create_dir(t.path().join("r.partial")).unwrap();
    fs::write(t.path().join("r.partial/other"), b"not ours").unwrap();
    let r = generate(&model, "hello", 2, &rec, &[]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let lines: Vec<&str> = r.stderr.lines().filter(|l| l.contains("r.partial")).collect();
    assert_eq!(lines.len(), 1, "{}", r.stderr);
    assert!(lines[0].contains("left by a run that died") && lines[0].contains("r.abandoned-"), "{}", lines[0]);
    let aside: Vec<_> = fs::read_dir(t.path()).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("r.abandoned-")).collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(fs::read(aside[0].path().join("other")).unwrap(), b"not ours", "the abandoned staging is kept, not deleted");
    assert!(rec.join("record.json").exists() && !t.path().join("r.partial").exists());
}

/// A partial a live run holds (its lock taken) is refused and left alone.
#[test]
fn a_partial_a_live_run_holds_is_refused_and_kept() {
    use std::os::fd::AsRawFd;
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "m.gguf", 5, &[]);
    let rec = t.path().join("r");
    fs::create_dir(t.path().join("r.partial")).unwrap();
    fs::write(t.path().join("r.partial/other"), b"a live run's").unwrap();
    let held = fs::File::open(t.path().join("r.partial")).unwrap();
    // SAFETY: flock on a descriptor the File owns.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) }, 0);
    let r = generate(&model, "hello", 2, &rec, &[]);
    assert_one_line_error(&r, &["r.partial", "a live run holds it"]);
    assert_eq!(fs::read(t.path().join("r.partial/other")).unwrap(), b"a live run's");
    assert!(!rec.exists());
    drop(held);
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
    // A sealed record whose manifest was deleted is refused, not compared as if unsealed.
    fs::set_permissions(&sealed.dir, fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_file(sealed.dir.join(sovereign::record::MANIFEST_FILE)).unwrap();
    let r = run(&["compare", d, d]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.stderr.contains("no seal") && r.stderr.contains("--unsealed"), "{}", r.stderr);
    // Records never sealed are compared when the caller says so.
    let plain = t.path().join("plain");
    assert_eq!(generate(&model, "hello", 2, &plain, &[]).code, 0);
    let p = plain.to_str().unwrap();
    assert_ne!(run(&["compare", p, p]).code, 0);
    ok(&["compare", "--unsealed", p, p]);
}

//! Records: exclusive staging, write-once commit, sealed records checked before use.

use crate::common;

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
    let aside: Vec<_> =
        fs::read_dir(t.path()).unwrap().flatten().filter(|e| e.file_name().to_string_lossy().starts_with("r.abandoned-")).collect();
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

/// Every record sovereign writes is sealed where it is written: `compare` verifies two
/// `generate --record` directories with no flag, and refuses one whose byte was changed.
#[test]
fn generate_records_are_sealed_and_compare_verifies_them_without_a_flag() {
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "m.gguf", 5, &[]);
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    for rec in [&a, &b] {
        assert_eq!(generate(&model, "hello", 2, rec, &[]).code, 0);
        let sealed = sovereign::record::verify_sealed(rec).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(sealed.digest, sovereign::util::sha256_file(&rec.join(sovereign::record::MANIFEST_FILE)).unwrap());
        let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!((mode(rec), mode(&rec.join("tokens.bin"))), (0o555, 0o444), "read-only as a campaign's records are");
        // Named as given, not by its digest: the strict check of a `results/<digest>` fails.
        assert!(sovereign::record::verify_record(rec).is_err());
    }
    let (pa, pb) = (a.to_str().unwrap(), b.to_str().unwrap());
    let r = ok(&["compare", pa, pb, "--json"]);
    assert_eq!(serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap()["exact"], true);

    // One changed byte: refused before anything is compared, naming the file.
    let f = b.join("tokens.bin");
    fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = fs::read(&f).unwrap();
    bytes[0] ^= 1;
    fs::write(&f, &bytes).unwrap();
    let r = run(&["compare", pa, pb]);
    assert_ne!(r.code, 0, "a tampered record compared: {}", r.stdout);
    assert!(r.stdout.is_empty(), "{}", r.stdout);
    assert!(r.stderr.contains("tokens.bin") && r.stderr.contains("tampered"), "{}", r.stderr);
    // --unsealed does not excuse a seal that fails.
    assert_ne!(run(&["compare", "--unsealed", pa, pb]).code, 0);

    // A record whose manifest was deleted is refused, not compared as if never sealed.
    fs::set_permissions(&b, fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_file(b.join(sovereign::record::MANIFEST_FILE)).unwrap();
    let r = run(&["compare", pa, pb]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(r.stderr.contains("no seal") && r.stderr.contains("--unsealed"), "{}", r.stderr);
}

#[test]
fn a_sealed_record_moved_under_another_digest_fails_and_unsealed_directories_need_the_flag() {
    let t = tempfile::tempdir().unwrap();
    let model = forge(t.path(), "m.gguf", 5, &[]);
    let rec = t.path().join("r");
    assert_eq!(generate(&model, "hello", 2, &rec, &[]).code, 0);
    // Sealed again under its digest, as a campaign seals: the same digest, and the name checked.
    let own = sovereign::record::verify_sealed(&rec).unwrap().digest;
    fs::set_permissions(&rec, fs::Permissions::from_mode(0o755)).unwrap();
    let sealed = sovereign::record::seal(&rec, &t.path().join("results")).unwrap();
    assert_eq!(sealed.digest, own);
    let d = sealed.dir.to_str().unwrap();
    ok(&["compare", d, d]);
    let other = sealed.dir.with_file_name("0".repeat(64));
    fs::rename(&sealed.dir, &other).unwrap();
    let o = other.to_str().unwrap();
    let r = run(&["compare", o, o]);
    assert!(r.code != 0 && r.stderr.contains("does not match the directory name"), "{}", r.stderr);

    // A directory another tool wrote (here the library, which seals nothing) has no seal:
    // compared only when the caller says so.
    let plain = t.path().join("plain");
    sovereign::generate::run(&generate_spec(&model, &plain, "hello", 2)).unwrap();
    assert!(!plain.join(sovereign::record::MANIFEST_FILE).exists());
    let p = plain.to_str().unwrap();
    let r = run(&["compare", p, p]);
    assert!(r.code != 0 && r.stderr.contains("no seal"), "{}", r.stderr);
    ok(&["compare", "--unsealed", p, p]);
}

//! The digest manifest of a model file: built once per file identity, reused while it holds,
//! rebuilt (one line saying why) when the file changes, a corrupt or hostile cache file rebuilt
//! with one line, a pinned sha256 it contradicts refused; runs name it and verify what they read.

use crate::common;

use common::*;
use serde_json::Value;
use std::fs;
use std::path::{Path, PathBuf};

/// The binary with its own digest cache `cache`.
fn sov(cache: &Path, args: &[&str]) -> Run {
    let out = bin().env("SOVEREIGN_CACHE", cache).args(args).output().expect("spawn sovereign");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn digests_json(cache: &Path, model: &Path) -> (Value, String) {
    let r = sov(cache, &["model", "digests", model.to_str().unwrap(), "--json"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(!r.stderr.contains("panicked"), "{}", r.stderr);
    (serde_json::from_str(&r.stdout).unwrap(), r.stderr)
}

/// The one cache file of `cache`.
fn cache_file(cache: &Path) -> PathBuf {
    let files: Vec<PathBuf> = fs::read_dir(cache.join("digests"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().filter(|l| !l.trim().is_empty()).collect()
}

/// A byte in the middle of expert 5's down extent of layer 1, flipped in place.
fn flip_expert_byte(model: &Path) {
    let inv = sovereign::inventory::Inventory::of(model).unwrap();
    let o = inv.objects.iter().find(|o| o.layer == 1 && o.expert == 5).unwrap();
    let e = o.extents.iter().find(|(r, _)| r == "down").unwrap().1;
    let mut bytes = fs::read(model).unwrap();
    bytes[(e.offset + e.len / 2) as usize] ^= 0x5a;
    fs::write(model, bytes).unwrap();
}

#[test]
fn built_once_reused_while_the_identity_holds_rebuilt_when_it_changes() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let m = forge(t.path(), "m.gguf", 61, &[]);
    let sha = sovereign::util::sha256_file(&m).unwrap();

    let (v, err) = digests_json(&cache, &m);
    assert!(err.is_empty(), "a first build is silent: {err}");
    assert_eq!(v["sha256"], sha.as_str());
    assert_eq!(v["provenance"]["reused"], false);
    assert!(v["provenance"]["build_s"].as_f64().unwrap() > 0.0);
    assert_eq!((v["expert_extents"].as_u64(), v["tensors"].as_u64().map(|n| n > 0)), (Some(3 * 16 * 3), Some(true)));
    let manifest = v["manifest_sha256"].as_str().unwrap().to_string();

    // Reused: no line, no pass over the file (no build time), the same manifest.
    let (v, err) = digests_json(&cache, &m);
    assert!(err.is_empty(), "{err}");
    assert_eq!((v["provenance"]["reused"].as_bool(), v["provenance"].get("build_s")), (Some(true), None));
    assert_eq!(v["manifest_sha256"], manifest.as_str());

    // A run names the manifest, checks what llama.cpp loads and verifies every extent it reads.
    let rec = t.path().join("run");
    let r = sov(
        &cache,
        &[
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "Digests cost what is read.",
            "--n-predict",
            "4",
            "--threads",
            "2",
            "--record",
            rec.to_str().unwrap(),
            "--experts",
            "plan",
            "--slots",
            "4",
            "--source",
            "f",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.stderr);
    let record: Value = serde_json::from_str(&fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    let d = &record["model"]["digests"];
    assert_eq!((d["manifest_sha256"].as_str(), d["reused"].as_bool()), (Some(manifest.as_str()), Some(true)));
    assert_eq!(record["model"]["sha256"], sha.as_str());
    let inv = sovereign::inventory::Inventory::of(&m).unwrap();
    assert_eq!(d["load_check"]["bytes"].as_u64(), Some(inv.data_offset + inv.non_expert_bytes));
    let tel = &record["experts"]["telemetry"];
    assert_eq!(tel["digests"]["manifest_sha256"], manifest.as_str());
    assert_eq!(tel["digests"]["bytes"], tel["q_run"]["logical_bytes"]);
    assert!(tel["digests"]["bytes"].as_u64().unwrap() > 0);

    // A touch changes the identity: rebuilt, one line naming what changed; same contents.
    let f = fs::OpenOptions::new().write(true).open(&m).unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(7)).unwrap();
    drop(f);
    let (v, err) = digests_json(&cache, &m);
    let l = lines(&err);
    assert_eq!(l.len(), 1, "{err}");
    assert!(l[0].contains("changed since its digest manifest was built (mtime, ctime); rebuilding"), "{err}");
    assert_eq!((v["provenance"]["reused"].as_bool(), v["manifest_sha256"].as_str()), (Some(false), Some(manifest.as_str())));
    assert!(v["provenance"]["rebuilt_because"].as_str().unwrap().contains("mtime"));

    // A changed byte: rebuilt, another manifest and sha256; the fresh one then checks out.
    flip_expert_byte(&m);
    let (v, err) = digests_json(&cache, &m);
    assert_eq!(lines(&err).len(), 1, "{err}");
    assert_ne!(v["manifest_sha256"], manifest.as_str());
    assert_eq!(v["sha256"], sovereign::util::sha256_file(&m).unwrap().as_str());
    let r = sov(&cache, &["model", "digests", m.to_str().unwrap(), "--check"]);
    assert_eq!(r.code, 0, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("every range agrees"), "{}", r.stdout);
}

#[test]
fn a_corrupt_or_hostile_cache_file_is_rebuilt_with_one_line() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let m = forge(t.path(), "m.gguf", 62, &[]);
    let (v, _) = digests_json(&cache, &m);
    let manifest = v["manifest_sha256"].as_str().unwrap().to_string();
    let file = cache_file(&cache);
    let good = fs::read(&file).unwrap();
    let mut doc: Value = serde_json::from_slice(&good).unwrap();
    doc["body"]["experts"][3]["blake3"] = "0".repeat(64).into();
    type Damage<'a> = Box<dyn Fn(&Path) + 'a>;
    let cases: Vec<(&str, Damage)> = vec![
        ("not a digest manifest", Box::new(|p: &Path| fs::write(p, b"\x00\xffnot json at all").unwrap())),
        ("not a digest manifest", Box::new(|p: &Path| fs::write(p, &good[..good.len() / 2]).unwrap())),
        ("(corrupt)", Box::new(move |p: &Path| fs::write(p, serde_json::to_vec(&doc).unwrap()).unwrap())),
        ("more than the", Box::new(|p: &Path| fs::File::create(p).unwrap().set_len(1 << 30).unwrap())),
        (
            "not a regular file",
            Box::new(|p: &Path| {
                fs::remove_file(p).unwrap();
                fs::create_dir(p).unwrap();
            }),
        ),
    ];
    for (needle, spoil) in cases {
        spoil(&file);
        let (v, err) = digests_json(&cache, &m);
        let l = lines(&err);
        assert!(
            l[0].contains("digest cache") && l[0].contains(needle) && l[0].ends_with("rebuilding its digest manifest"),
            "{needle}: {err}"
        );
        assert_eq!((v["manifest_sha256"].as_str(), v["provenance"]["reused"].as_bool()), (Some(manifest.as_str()), Some(false)));
        if file.is_dir() {
            // The directory stays in the way: the run goes on with the rebuilt manifest, uncached.
            assert_eq!(l.len(), 2, "{err}");
            assert!(l[1].contains("not cached"), "{err}");
            break;
        }
        assert_eq!(l.len(), 1, "{needle}: {err}");
        let again: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
        assert_eq!(again["manifest_sha256"], manifest.as_str(), "{needle}: the rebuilt manifest replaced the bad file");
    }
}

#[test]
fn a_cached_digest_that_lies_is_caught_by_check_and_by_the_run() {
    let t = tempfile::tempdir().unwrap();
    let cache = t.path().join("cache");
    let m = forge(t.path(), "m.gguf", 63, &[]);
    digests_json(&cache, &m);
    // A consistent but false cache: one extent's digest replaced and the manifest re-digested,
    // as a file written under the same identity behind the cache's back would look.
    let file = cache_file(&cache);
    let mut doc: Value = serde_json::from_slice(&fs::read(&file).unwrap()).unwrap();
    let mut victims = 0;
    for e in doc["body"]["experts"].as_array_mut().unwrap().iter_mut().filter(|e| e["layer"] == 0) {
        e["blake3"] = "ab".repeat(32).into();
        e["xxh3"] = "cd".repeat(16).into();
        victims += 1;
    }
    assert_eq!(victims, 16 * 3);
    let body: sovereign::digests::Body = serde_json::from_value(doc["body"].clone()).unwrap();
    doc["manifest_sha256"] = body.digest().unwrap().into();
    fs::write(&file, serde_json::to_vec(&doc).unwrap()).unwrap();

    // Whatever layer 0 reads first is rejected, by the default XXH3 and by BLAKE3 alike.
    for (name, verify) in [("run", None), ("run-blake3", Some("blake3"))] {
        let rec = t.path().join(name);
        let mut args = vec![
            "generate",
            "--model",
            m.to_str().unwrap(),
            "--prompt",
            "Digests that lie are caught.",
            "--n-predict",
            "2",
            "--threads",
            "2",
            "--record",
            rec.to_str().unwrap(),
            "--experts",
            "plan",
            "--slots",
            "4",
            "--source",
            "p",
        ];
        if let Some(v) = verify {
            args.extend_from_slice(&["--verify", v]);
        }
        let r = sov(&cache, &args);
        assert_ne!(r.code, 0);
        assert!(r.stderr.contains("failed closed") && r.stderr.contains("digest_mismatch"), "{}", r.stderr);
        let record: Value = serde_json::from_str(&fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
        assert_eq!(record["outcome"], "failed");
        let t = &record["experts"]["telemetry"];
        assert_eq!(t["rejections"]["digest_mismatch"], 1);
        assert_eq!(t["digests"]["algorithm"], verify.map_or("xxh3-128", |_| "blake3"), "{}", t["digests"]);
    }

    let r = sov(&cache, &["model", "digests", m.to_str().unwrap(), "--check"]);
    assert_eq!(r.code, 1, "{}{}", r.stdout, r.stderr);
    assert!(r.stdout.contains("48 ranges differ: ") && r.stdout.contains("0/15/down"), "{}", r.stdout);
    // The fresh pass replaced the lie.
    assert_eq!(sov(&cache, &["model", "digests", m.to_str().unwrap(), "--check"]).code, 0);
}

#[test]
fn a_pinned_sha256_the_manifest_contradicts_is_refused() {
    let t = tempfile::tempdir().unwrap();
    // The library reads its cache from this process's environment, which every test of the
    // suite shares: the suite's own cache, the one `bin()` hands the runs it starts.
    std::env::set_var("SOVEREIGN_CACHE", test_cache());
    let m = forge(t.path(), "m.gguf", 64, &[]);
    let sha = sovereign::util::sha256_file(&m).unwrap();
    assert_eq!(sovereign::digests::model_sha256(&m, Some(&sha)).unwrap(), sha);
    // The cached manifest contradicts another pin.
    let other = "1".repeat(64);
    let e = format!("{:#}", sovereign::digests::model_sha256(&m, Some(&other)).unwrap_err());
    assert!(e.contains(&format!("sha256 {sha}")) && e.contains(&format!("but {other} is pinned; refused")), "{e}");
    // After a change, the rebuilt manifest contradicts the old pin: refused, and not cached.
    flip_expert_byte(&m);
    let e = format!("{:#}", sovereign::digests::model_sha256(&m, Some(&sha)).unwrap_err());
    assert!(e.contains(&format!("but {sha} is pinned; refused (its digest manifest was not cached)")), "{e}");
    let now = sovereign::util::sha256_file(&m).unwrap();
    assert_eq!(sovereign::digests::model_sha256(&m, Some(&now)).unwrap(), now);
}

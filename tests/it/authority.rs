//! Seed 000's admission result in miniature, through the real binary and real cgroups: under a
//! hard host cap below the expert bytes, P completes exact but at the ceiling (page cache
//! charged), D and F complete exact with zero limit events and a positive margin.

use crate::common;

use common::*;
use std::path::Path;
use std::sync::Mutex;

/// The tests of this file take turns: one kills a harness outright, whose run cgroup stays until
/// the next harness (or the test) removes it, and the others check that none is left.
static TURNS: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURNS.lock().unwrap_or_else(|e| e.into_inner())
}

fn contained(model: &Path, rec: &Path, cap: &str, extra: &[&str]) -> (i32, serde_json::Value) {
    let (r, rec) = contained_run(model, rec, cap, extra);
    (r.code, rec)
}

/// A contained generate: how the command ended, and its record.
fn contained_run(model: &Path, rec: &Path, cap: &str, extra: &[&str]) -> (Run, serde_json::Value) {
    let mut args = vec!["--memory-max", cap, "--sample-ms", "20"];
    args.extend_from_slice(extra);
    let r = generate(model, "Bounded memory, exact output.", 12, rec, &args);
    let rec: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(rec.join("record.json")).unwrap()).unwrap();
    (r, rec)
}

/// No status is shown as Rust writes its values for a programmer.
fn no_debug_text(what: &str, text: &str) {
    for debug in ["Signaled {", "Exited {", "Some("] {
        assert!(!text.contains(debug), "{what} shows `{debug}`: {text}");
    }
}

fn no_run_cgroups_left() {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let path = own.lines().find_map(|l| l.strip_prefix("4:memory:").or_else(|| l.split(":memory:").nth(1))).unwrap_or("/");
    for base in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        let dir = Path::new(base).join(path.trim_start_matches('/'));
        if let Ok(rd) = std::fs::read_dir(&dir) {
            let left: Vec<_> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(&format!("sovereign-{}-", std::process::id())) || n.starts_with("sovereign-"))
                .filter(|n| {
                    // Only cgroups of harnesses that are gone count as leftovers.
                    let pid: u32 = n.split('-').nth(1).and_then(|p| p.parse().ok()).unwrap_or(0);
                    !Path::new(&format!("/proc/{pid}")).exists()
                })
                .collect();
            assert!(left.is_empty(), "leftover run cgroups in {}: {left:?}", dir.display());
        }
    }
}

#[test]
fn p_hits_the_ceiling_while_d_and_f_stay_under_it() {
    if !cgroups_usable() {
        return;
    }
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    // 4 layers x 32 experts: 96 MiB of experts; 4 slots hold 12 MiB. Cap: 64 MiB, which leaves
    // P's page cache room to be reclaimed from rather than an OOM kill on a busy machine.
    let m = forge(dir.path(), "m.gguf", 41, &["--layers", "4", "--experts", "32"]);
    let cap = 64u64 << 20;
    // Page cache is charged to whoever touches it first: an uncontained run first brings this
    // binary's code pages in, so that no contained run is charged for the executable itself.
    let warm = generate(&m, "warm", 2, &dir.path().join("warm"), &["--experts", "plan", "--slots", "4"]);
    assert_eq!(warm.code, 0, "{}", warm.stderr);
    let mut recs = Vec::new();
    for source in ["p", "d", "f"] {
        let rec = dir.path().join(source);
        let (code, r) = contained(&m, &rec, "64M", &["--experts", "plan", "--slots", "4", "--source", source]);
        assert_eq!(r["outcome"], "completed", "{source}: {}", r["error"]);
        let res = &r["resources"];
        assert_eq!(res["host"]["limit"], cap, "{source}");
        assert_eq!(res["authority"]["host"]["grade"]["grade"], "hard_limit", "{source}: {}", res["authority"]);
        assert!(res["authority"]["gpu"]["grade"]["grade"].as_str().is_some());
        assert!(r["cache_protocol"].as_str().unwrap().starts_with("cold"));
        let events = res["host"]["limit_events"].as_u64().unwrap();
        let margin = res["authority"]["host"]["margin"].as_i64().unwrap();
        if source == "p" {
            assert!(events > 0, "P must be charged its page cache and hit the limit");
            assert_eq!(res["admission"]["admitted"], false);
            assert_eq!(code, 0, "P still completes");
            let anon = res["host"]["stat_at_peak"]["anon"].as_u64().unwrap();
            assert!(anon < cap, "P's own (anonymous) memory {anon} stays below the cap: the rest is page cache");
        } else {
            assert_eq!(events, 0, "{source}: limit events");
            assert!(margin > 0, "{source}: margin {margin}");
            assert_eq!(res["admission"]["admitted"], true, "{source}: {}", res["admission"]);
        }
        recs.push(rec);
    }
    for pair in recs.windows(2) {
        let r = run(&["compare", pair[0].to_str().unwrap(), pair[1].to_str().unwrap()]);
        assert_eq!(r.code, 0, "{}", r.stdout);
    }
    no_run_cgroups_left();
}

#[test]
fn the_budget_sizes_the_plan_and_the_run_stays_under_it() {
    if !cgroups_usable() {
        return;
    }
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    // 4 layers x 32 experts of 768 KiB: a slot in every layer with F's window is about 4 MiB.
    // The host margin is 256 MiB at these budgets.
    let m = forge(dir.path(), "m.gguf", 42, &["--layers", "4", "--experts", "32"]);
    let resident = dir.path().join("resident");
    assert_eq!(generate(&m, "Bounded memory, exact output.", 12, &resident, &[]).code, 0);
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    for (cap, name) in [(300u64 << 20, "300M"), (448 << 20, "448M")] {
        let rec = dir.path().join(name);
        let (out, r) = contained_run(&m, &rec, name, &["--experts", "plan"]);
        assert_eq!((out.code, &r["outcome"]), (0, &serde_json::json!("completed")), "{name}: {}", r["error"]);
        // The summary gives the run's tokens and speeds, as an uncontained run's does.
        let line = |key: &str| out.stdout.lines().find(|l| l.split_whitespace().next() == Some(key)).map(str::to_string);
        let prompt = r["counts"]["prompt_tokens"].as_u64().unwrap();
        assert_eq!(line("tokens"), Some(format!("tokens    {prompt} prompt + 12 generated")), "{}", out.stdout);
        assert!(line("speed").is_some_and(|l| l.contains("decode") && l.contains("tok/s")), "{}", out.stdout);
        assert_eq!(r["resources"]["admission"]["admitted"], true, "{name}: {}", r["resources"]["admission"]);
        let b = &r["params"]["experts"]["budget"];
        assert_eq!((&b["tier"], n(&b["budget"])), (&serde_json::json!("host"), cap), "{b}");
        // Every term measured or stated, and the slots are what the budget holds beyond them.
        assert!(n(&b["weights"]) > 0 && n(&b["compute"]) > 0 && n(&b["context"]) > 0 && n(&b["logits"]) > 0, "{b}");
        assert_eq!(n(&b["margin"]), (256u64 << 20).max(cap / 16));
        let need = ["weights", "context", "compute", "logits", "margin"].iter().map(|k| n(&b[k])).sum::<u64>();
        let slots = ((cap - need) / n(&b["per_slot"])).clamp(1, 32);
        assert_eq!((n(&b["slots"]), n(&r["params"]["experts"]["slots"])), (slots, slots), "{b}");
        // 300 MiB holds some of the 32 experts per layer; 448 MiB all of them (no more slots).
        assert!(if cap == 300 << 20 { slots > 1 && slots < 32 } else { slots == 32 && (cap - need) / n(&b["per_slot"]) > 32 }, "{b}");
        assert_eq!(r["params"]["experts"]["policy"], format!("lru:{slots}"));
        assert_eq!(r["params"]["experts"]["sizing"]["slots_from"], "budget");
        assert!(n(&r["resources"]["host"]["kernel_peak"]) < cap);
        let c = run(&["compare", resident.to_str().unwrap(), rec.to_str().unwrap()]);
        assert_eq!(c.code, 0, "{name}: {}", c.stdout);
        // The least budget holds one slot beside the same terms.
        let least = n(&b["least_budget"]);
        let least_margin = (256u64 << 20).max(least / 16);
        assert!(least >= need - n(&b["margin"]) + least_margin + n(&b["per_slot"]), "{b}");
    }
    // Given slots are the run's own: no budget on record.
    let (code, r) = contained(&m, &dir.path().join("given"), "300M", &["--experts", "plan", "--slots", "4"]);
    assert_eq!((code, r["params"]["experts"]["slots"].as_u64(), r["params"]["experts"].get("budget")), (0, Some(4), None));
    // A budget that cannot hold one slot per layer is refused in one line naming the least one.
    let (run, r) = contained_run(&m, &dir.path().join("small"), "260M", &["--experts", "plan"]);
    assert_eq!((run.code, &r["outcome"]), (1, &serde_json::json!("failed")), "{}", run.stderr);
    let lines: Vec<&str> = run.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{}", run.stderr);
    assert!(lines[0].contains("--memory-max 272629760: too small") && lines[0].contains("the least budget that would is"), "{}", lines[0]);
    // Far below that, a limit the probe load could not live under: refused from the file alone,
    // in one line, rather than the worker killed under its own limit.
    for cap in ["24M", "120M"] {
        let (run, r) = contained_run(&m, &dir.path().join(format!("tiny-{cap}")), cap, &["--experts", "plan"]);
        assert_eq!((run.code, &r["outcome"]), (1, &serde_json::json!("failed")), "{cap}: {}", run.stderr);
        let lines: Vec<&str> = run.stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{cap}: {}", run.stderr);
        assert!(
            lines[0].contains("too small to hold one expert per layer") && lines[0].contains("the least budget that would is above"),
            "{}",
            lines[0]
        );
        assert_eq!(n(&r["resources"]["host"]["oom_kills"]), 0, "{cap}: {}", r["resources"]["host"]);
    }
    no_run_cgroups_left();
}

/// A served model whose non-expert weights are most of its budget: loading them through the
/// page cache held each byte twice (cached and loaded) until the load ended, so the run reached
/// its limit with every slot empty and was not admitted.
#[test]
fn a_served_load_is_charged_its_weights_once() {
    if !cgroups_usable() {
        return;
    }
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    // Wide attention in 10 layers: about 508 MB of non-expert weights beside 4 experts a layer.
    let m = forge(dir.path(), "m.gguf", 5, &["--layers", "10", "--experts", "4", "--top-k", "2", "--embd", "2048", "--expert-ff", "128"]);
    let resident = dir.path().join("resident");
    assert_eq!(generate(&m, "Bounded memory, exact output.", 12, &resident, &[]).code, 0);
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    let cap = 900u64 << 20;
    for source in ["f", "d"] {
        let rec = dir.path().join(source);
        let (code, r) = contained(&m, &rec, "900M", &["--experts", "plan", "--source", source]);
        assert_eq!((code, &r["outcome"]), (0, &serde_json::json!("completed")), "{source}: {}", r["error"]);
        let weights = n(&r["params"]["experts"]["budget"]["weights"]);
        assert!(2 * weights > cap, "the weights ({weights} bytes) must not fit twice under the cap");
        let h = &r["resources"]["host"];
        assert_eq!((n(&h["limit_events"]), &r["resources"]["admission"]["admitted"]), (0, &serde_json::json!(true)), "{source}: {h}");
        assert!(n(&h["kernel_peak"]) < weights + (256 << 20), "{source}: {h}");
        let c = run(&["compare", resident.to_str().unwrap(), rec.to_str().unwrap()]);
        assert_eq!(c.code, 0, "{source}: {}", c.stdout);
    }
    no_run_cgroups_left();
}

#[test]
fn a_cap_below_the_need_is_an_oom_on_record() {
    if !cgroups_usable() {
        return;
    }
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 42, &[]);
    let rec = dir.path().join("oom");
    let (run, r) = contained_run(&m, &rec, "4M", &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(r["outcome"], "failed");
    // Said in words on stderr, the limit told apart from a signal sent from outside.
    let said = "the cgroup's 4 MiB limit killed the worker: the kernel's OOM killer sent it signal 9 (SIGKILL)";
    assert!(run.stderr.contains(&format!("error: {said}")), "{}", run.stderr);
    assert_eq!(r["error"], said);
    let exit =
        r["resources"]["admission"]["conjuncts"].as_array().unwrap().iter().find(|c| c["name"] == "worker exited 0").unwrap().clone();
    assert_eq!((exit["passed"].clone(), exit["value"].clone()), (false.into(), said.into()));
    no_debug_text("stdout", &run.stdout);
    no_debug_text("stderr", &run.stderr);
    no_debug_text("record.json", &std::fs::read_to_string(rec.join("record.json")).unwrap());
    let res = &r["resources"];
    assert!(res["host"]["oom_kills"].as_u64().unwrap() >= 1, "{}", res["host"]);
    assert!(res["status"]["signal"].as_i64().is_some() || res["status"]["code"] != 0, "{}", res["status"]);
    assert_eq!(res["admission"]["admitted"], false);
    assert!(res["host"]["removed"] == true, "{}", res["host"]);
    no_run_cgroups_left();
}

/// The parent pid and state of `pid`, from /proc (None once it is reaped).
fn stat(pid: u32) -> Option<(u32, char)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut f = s[s.rfind(')')? + 2..].split(' ');
    let state = f.next()?.chars().next()?;
    Some((f.next()?.parse().ok()?, state))
}

/// Alive: not reaped and not a zombie (a zombie has released everything; its reaper may be slow).
fn alive(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, s)| s != 'Z')
}

/// A contained harness with minutes of work (1000 tokens, experts read through 4 slots per
/// layer, O_DIRECT), its worker's pid once it runs in its run cgroup, and that cgroup's
/// directories. `group`: the harness leads a process group of its own (what a shell job is).
struct Long {
    harness: Reaped,
    worker: u32,
    cgroup_dirs: Vec<std::path::PathBuf>,
}

fn long_contained(m: &Path, rec: &Path, group: bool) -> Long {
    use std::os::unix::process::CommandExt;
    let mut cmd = bin();
    cmd.args(["generate", "--model", m.to_str().unwrap(), "--prompt", "Outlive the harness.", "--n-predict", "1000"])
        .args(["--ctx", "2048", "--ignore-eos", "--threads", "2", "--experts", "plan", "--slots", "4", "--source", "d"])
        .args(["--memory-max", "256M", "--record", rec.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if group {
        cmd.process_group(0);
    }
    let mut harness = Reaped::new(cmd.spawn().unwrap());
    let h = harness.id();
    // The worker: the harness's child, once it runs this binary inside the run cgroup (the
    // cgroup's reaper, also a child, sits in the harness's own cgroup).
    let exe = std::fs::canonicalize(env!("CARGO_BIN_EXE_sovereign")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let (worker, cgroup) = loop {
        let found = std::fs::read_dir("/proc").unwrap().flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            (stat(pid)?.0 == h && std::fs::read_link(format!("/proc/{pid}/exe")).ok()? == exe && cg.contains("/sovereign-"))
                .then_some((pid, cg))
        });
        if let Some(f) = found {
            break f;
        }
        assert!(harness.try_wait().unwrap().is_none(), "the harness ended before its worker was seen");
        assert!(std::time::Instant::now() < deadline, "no worker in a run cgroup after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(10));
    };
    let cgroup_dirs: Vec<std::path::PathBuf> = cgroup
        .lines()
        .filter_map(|l| l.split_once(":memory:").or_else(|| l.strip_prefix("0::").map(|p| ("", p))))
        .filter(|(_, p)| p.contains("/sovereign-"))
        .flat_map(|(_, p)| ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"].map(|b| std::path::Path::new(b).join(p.trim_start_matches('/'))))
        .filter(|p| p.join("cgroup.procs").exists())
        .collect();
    assert!(!cgroup_dirs.is_empty(), "the run cgroup of {cgroup:?}");
    // Let it get into its decode.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(alive(worker), "the worker ended early");
    Long { harness, worker, cgroup_dirs }
}

/// The run cgroups are gone within 3 s, removed by their reaper: no later harness, and no
/// clean-up by this test, removes them.
fn reaped(l: &Long) {
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(3);
    while l.cgroup_dirs.iter().any(|d| d.exists()) {
        if std::time::Instant::now() > gone {
            sovereign::observe::cleanup_stale().unwrap();
            panic!("the run cgroups {:?} of the killed harness are still there 3 s later", l.cgroup_dirs);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    no_run_cgroups_left();
}

#[test]
fn a_killed_harness_takes_its_worker_with_it() {
    if !cgroups_usable() {
        return;
    }
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 43, &[]);
    let mut l = long_contained(&m, &dir.path().join("r"), false);
    let (h, worker) = (l.harness.id(), l.worker);
    l.harness.kill().unwrap();
    l.harness.wait().unwrap();
    let gone = std::time::Instant::now() + std::time::Duration::from_secs(3);
    let busy = |d: &std::path::PathBuf| std::fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| !s.trim().is_empty());
    while alive(worker) || l.cgroup_dirs.iter().any(busy) {
        if std::time::Instant::now() > gone {
            // SAFETY: a plain kill of the orphan this test made, so it does not run on.
            unsafe { libc::kill(worker as i32, libc::SIGKILL) };
            panic!("worker {worker} of the killed harness {h} still runs 3 s later ({:?}, run cgroup {:?})", stat(worker), l.cgroup_dirs);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    reaped(&l);
}

/// `kill -9 -PGID` of a harness and its worker (a shell job killed whole): nothing of ours can
/// run in either, and the run cgroup is still removed, by its reaper.
#[test]
fn a_group_kill_leaves_no_run_cgroup() {
    if !cgroups_usable() {
        return;
    }
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 44, &[]);
    let mut l = long_contained(&m, &dir.path().join("r"), true);
    let pgid = l.harness.id() as i32;
    assert_eq!(
        nix::unistd::getpgid(Some(nix::unistd::Pid::from_raw(l.worker as i32))).unwrap().as_raw(),
        pgid,
        "the worker is in the harness's group"
    );
    nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pgid), nix::sys::signal::Signal::SIGKILL).unwrap();
    l.harness.wait().unwrap();
    reaped(&l);
}

/// A worker killed from outside (SIGKILL, no limit event): the harness says so in words on
/// stderr, exits non-zero, and its record says the same.
#[test]
fn a_worker_killed_from_outside_is_said_killed_by_sigkill() {
    if !cgroups_usable() {
        return;
    }
    let _turn = turn();
    let dir = tempfile::tempdir().unwrap();
    let m = forge(dir.path(), "m.gguf", 45, &[]);
    let rec = dir.path().join("r");
    let l = long_contained(&m, &rec, false);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(l.worker as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let out = l.harness.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let said = "the worker was killed by signal 9 (SIGKILL)";
    assert!(stderr.contains(&format!("error: {said}; record ")), "{stderr}");
    assert!(!stderr.contains("limit"), "an outside signal is not the limit's: {stderr}");
    let text = std::fs::read_to_string(rec.join("record.json")).unwrap();
    let r: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["error"], said);
    assert_eq!(r["resources"]["status"]["signal"], 9);
    no_debug_text("stdout", &stdout);
    no_debug_text("stderr", &stderr);
    no_debug_text("record.json", &text);
    no_run_cgroups_left();
}

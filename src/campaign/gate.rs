//! What refuses a campaign before its first cell, asked in one place by every command that
//! starts one (`campaign check`, `run`, `resume`, the Slurm submission and its block tasks):
//! its models ([`models::problems`]: presence, recipes, pinned digests), its prompt (a regular
//! file under the cap, with the pinned digest, in UTF-8), its work within the model's trained
//! length, and this build's identity (engine tree and patch series). The file's own checks (types, bounds, references) come before, from
//! [`super::load`]. Nothing here makes a model or runs anything; what an executor must set up
//! to run a cell (a memory cgroup) is its `preflight`, which the runner asks after this.
//!
//! Paths are taken as the file writes them, relative to its directory or absolute, for models
//! and the prompt alike: a model may live anywhere, and what guards every input is its pinned
//! sha256, compared before any of it is used.

use super::models::{self, Recipes};
use super::spec::{Campaign, Diagnostic};
use super::Loaded;
use anyhow::Result;
use std::path::Path;

/// Every problem, each at the field it is about.
pub fn problems(c: &Loaded, recipes: Recipes) -> Vec<Diagnostic> {
    let mut out = models::problems(&c.spec, &c.base, recipes);
    out.extend(prompt(&c.spec, &c.base));
    out.extend(context(&c.spec, &c.base));
    out.extend(build(&c.spec));
    out
}

/// [`problems`] as an error: `FILE:line:column: message`, one per line.
pub fn refuse(c: &Loaded, recipes: Recipes) -> Result<()> {
    let p = problems(c, recipes);
    if p.is_empty() {
        return Ok(());
    }
    let file = c.file.display().to_string();
    anyhow::bail!("{}", p.iter().map(|d| d.render(&file)).collect::<Vec<_>>().join("\n"))
}

/// The prompt is read as a cell reads it (a regular file under the cap), hashed, and must be
/// UTF-8 (llama.cpp's tokenizer aborts on anything else). A session's requests are read as
/// `generate --requests` reads them, every prompt inline, so that the pinned digest is the
/// digest of every prompt the cells run.
fn prompt(c: &Campaign, base: &Path) -> Option<Diagnostic> {
    let w = &c.workload;
    // Neither or both: the spec's own check says so.
    let input = w.input().ok()?;
    let path = base.join(&input.file.value);
    let field = input.field();
    let bytes = match crate::bounds::read_file(field, &path, crate::bounds::MAX_PROMPT_FILE_BYTES) {
        Ok(b) => b,
        Err(e) => return Some(Diagnostic::at(input.file, format!("{e:#}"))),
    };
    let got = crate::util::sha256(&bytes);
    if got != input.sha256.0 {
        let message = format!("{}: {} has sha256 {got}, but the campaign pins {}", input.digest_field(), input.file.value, input.sha256.0);
        return Some(Diagnostic::at(input.sha256, message));
    }
    if let Err(e) = crate::bounds::prompt_text(&format!("{field} {}", input.file.value), &bytes) {
        return Some(Diagnostic::at(input.file, e.to_string()));
    }
    if !input.session {
        return None;
    }
    let text = String::from_utf8_lossy(&bytes);
    match crate::session::requests::parse(&path, &text, *w.outputs) {
        Err(e) => Some(Diagnostic::at(input.file, format!("{e:#}"))),
        Ok(requests) => requests.iter().find_map(|r| {
            let message = if r.prompt_file.is_some() {
                format!("{field}: request {:?} names a prompt_file; a campaign's requests give their prompts inline, so that requests_sha256 covers them", r.id)
            } else if r.fault != crate::source::fault::FaultCell::None {
                format!("{field}: request {:?} names a fault cell; a campaign's fault cells are its arms' (`fault`)", r.id)
            } else {
                return None;
            };
            Some(Diagnostic::at(input.file, message))
        }),
    }
}

/// A cell's context is its work (`prompt_tokens + outputs`), which must fit the model's trained
/// length: a campaign cannot pass `--ctx`, so work that does not fit would fail every cell.
/// Refinement campaigns and sessions count `prompt_tokens` over all their prompts, an upper
/// bound of each one's work: their cells size each context themselves. A model not (yet) readable is the
/// models' check's to refuse.
fn context(c: &Campaign, base: &Path) -> Option<Diagnostic> {
    if c.refine.is_some() || c.workload.is_session() {
        return None;
    }
    let g = crate::gguf::Gguf::open_model(&base.join(&*c.model.path)).ok()?;
    let key = format!("{}.context_length", g.architecture().ok()?);
    let trained = g.get(&key).and_then(crate::gguf::Value::as_u64).filter(|&n| n > 0)?;
    let w = &c.workload;
    let need = u64::from(*w.prompt_tokens) + u64::from(*w.outputs);
    (need > trained).then(|| {
        let message = format!(
            "workload: prompt_tokens {} + outputs {} need a context of {need}, over the model's trained length of {trained} ({key}); a campaign's cells are sized to their work and cannot pass --ctx",
            *w.prompt_tokens, *w.outputs
        );
        Diagnostic::at(&w.outputs, message)
    })
}

/// The engine tree and patch series this binary was built from must be the pinned ones.
fn build(c: &Campaign) -> Vec<Diagnostic> {
    let (e, b) = (crate::engine::identity(), &c.build);
    let mut out = Vec::new();
    if e.tree_sha256 != b.engine_tree_sha256.0 {
        let message = format!(
            "build.engine_tree_sha256: this build's engine tree is {}, but the campaign expects {}",
            e.tree_sha256, b.engine_tree_sha256.0
        );
        out.push(Diagnostic::at(&b.engine_tree_sha256, message));
    }
    let have: Vec<(&str, &str)> = e.patches.iter().map(|p| (&*p.name, &*p.sha256)).collect();
    let want: Vec<(&str, &str)> = b.patches.iter().map(|p| (p.name.as_str(), p.sha256.0.as_str())).collect();
    if have != want {
        let pins: Vec<String> = have.iter().map(|(n, d)| format!("{{ name: {n}, sha256: {d} }}")).collect();
        let message = format!(
            "build.patches: this build's patch series {have:?} differs from the campaign's {want:?}: to run it with this build, set `build.patches` to [{}] (`sovereign build-info` lists them)",
            pins.join(", ")
        );
        out.push(Diagnostic::at(&b.patches, message));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::tests::GOOD;

    /// GOOD in a directory with its model and prompt, pinned to their digests and this build.
    fn good(dir: &Path, edit: impl Fn(String) -> String) -> Loaded {
        std::fs::write(dir.join("m.gguf"), b"not a gguf, pinned by its bytes").unwrap();
        std::fs::write(dir.join("p.txt"), b"a prompt").unwrap();
        let e = crate::engine::identity();
        let zeros = "0".repeat(64);
        let patches: Vec<String> = e.patches.iter().map(|p| format!("\n    - {{ name: {}, sha256: {} }}", p.name, p.sha256)).collect();
        let text = GOOD
            .replacen(&zeros, &crate::util::sha256_file(&dir.join("m.gguf")).unwrap(), 1)
            .replacen(&zeros, &crate::util::sha256(b"a prompt"), 1)
            .replacen(&zeros, &e.tree_sha256, 1)
            .replacen("  patches: []", &format!("  patches:{}", if patches.is_empty() { " []".to_string() } else { patches.concat() }), 1);
        let file = dir.join("c.yaml");
        std::fs::write(&file, edit(text)).unwrap();
        crate::campaign::load(&file).unwrap()
    }

    fn at(d: &[Diagnostic]) -> Vec<(u64, u64)> {
        d.iter().map(|d| (d.line, d.column)).collect()
    }

    #[test]
    fn a_pinned_campaign_passes_and_each_wrong_input_is_refused_at_its_field() {
        let t = tempfile::tempdir().unwrap();
        let c = good(t.path(), |s| s);
        assert_eq!(problems(&c, Recipes::Made), []);
        // The prompt's digest, at workload.prompt_sha256.
        std::fs::write(t.path().join("p.txt"), b"another prompt").unwrap();
        let d = problems(&c, Recipes::Pending);
        assert_eq!(at(&d), [(8, 18)], "{d:?}");
        assert!(d[0].message.starts_with("workload.prompt_sha256: p.txt has sha256 "), "{d:?}");
        // A prompt that is no regular file, at workload.prompt_file.
        let c = good(t.path(), |s| s.replace("prompt_file: p.txt", "prompt_file: /dev/zero"));
        let d = problems(&c, Recipes::Pending);
        assert_eq!(at(&d), [(7, 16)], "{d:?}");
        assert!(d[0].message.contains("cannot read workload.prompt_file") && d[0].message.contains("not a regular file"), "{d:?}");
        // The model's digest, at model.sha256.
        let c = good(t.path(), |s| s);
        std::fs::write(t.path().join("m.gguf"), b"other bytes").unwrap();
        let d = problems(&c, Recipes::Pending);
        assert_eq!(at(&d), [(5, 11)], "{d:?}");
        assert!(d[0].message.starts_with("model.sha256: "), "{d:?}");
    }

    #[test]
    fn work_past_the_models_trained_length_is_refused_at_outputs() {
        let t = tempfile::tempdir().unwrap();
        let forged = t.path().join("forged.gguf");
        let dims = crate::forge::Preset::Tiny.dims();
        crate::forge::forge(crate::forge::Arch::Qwen3moe, dims, 1, &forged).unwrap();
        let outputs = |n: u64| {
            move |s: String| {
                s.replace("  outputs: 2\n", &format!("  outputs: {n}\n")).replace("  horizon: 2\n", &format!("  horizon: {n}\n"))
            }
        };
        // 3 prompt tokens: 4093 outputs fit the trained 4096, 4094 do not.
        for (n, refused) in [(4093, false), (4094, true)] {
            let c = good(t.path(), outputs(n));
            std::fs::copy(&forged, t.path().join("m.gguf")).unwrap();
            let d: Vec<Diagnostic> = problems(&c, Recipes::Made).into_iter().filter(|d| !d.message.starts_with("model.sha256")).collect();
            if refused {
                assert_eq!(at(&d), [(10, 12)], "{d:?}");
                assert!(
                    d[0].message.contains("need a context of 4097, over the model's trained length of 4096 (qwen3moe.context_length)"),
                    "{d:?}"
                );
            } else {
                assert_eq!(d, [], "{n} outputs fit");
            }
        }
    }

    #[test]
    fn another_build_is_refused_at_build() {
        let t = tempfile::tempdir().unwrap();
        let c = good(t.path(), |s| {
            s.replacen(
                "  patches:",
                "  patches:\n    - { name: extra.patch, sha256: \"0000000000000000000000000000000000000000000000000000000000000000\" }",
                1,
            )
        });
        let d = problems(&c, Recipes::Pending);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].line, 15, "{d:?}");
        assert!(
            d[0].message.starts_with("build.patches: this build's patch series") && d[0].message.contains("set `build.patches` to ["),
            "{d:?}"
        );
        let c = good(t.path(), |s| {
            s.replacen(
                "  engine_tree_sha256: ",
                "  engine_tree_sha256: \"1111111111111111111111111111111111111111111111111111111111111111\"\n  #",
                1,
            )
        });
        let d = problems(&c, Recipes::Pending);
        assert_eq!(at(&d), [(13, 23)], "{d:?}");
    }

    #[test]
    fn a_missing_model_with_a_recipe_is_made_by_run_and_check_makes_nothing() {
        let t = tempfile::tempdir().unwrap();
        let recipe = |s: String| s.replacen("  path: m.gguf\n", "  path: made/m.gguf\n  forge: { preset: tiny, seed: 1 }\n", 1);
        let c = good(t.path(), recipe);
        assert_eq!(problems(&c, Recipes::Pending), []);
        assert_eq!(models::pending(&c.spec, &c.base), [("model".to_string(), t.path().join("made/m.gguf"))]);
        assert!(!t.path().join("made").exists(), "nothing was made");
        let d = problems(&c, Recipes::Made);
        assert_eq!(at(&d), [(4, 9)], "{d:?}");
        // A recipe that cannot make anything is refused before anything runs.
        let c = good(t.path(), |s| recipe(s).replacen("seed: 1 }", "seed: 1, layers: 4294967295, experts: 4294967295 }", 1));
        let d = problems(&c, Recipes::Pending);
        assert!(d.len() == 1 && d[0].message.contains("over the 1099511627776-byte limit"), "{d:?}");
        // Without a recipe, with the fix.
        let c = good(t.path(), |s| s.replacen("  path: m.gguf\n", "  path: absent.gguf\n", 1));
        let d = problems(&c, Recipes::Pending);
        assert!(d.len() == 1 && d[0].message.contains("gives no recipe") && d[0].line == 4, "{d:?}");
    }

    #[test]
    fn absolute_paths_are_taken_as_written() {
        let t = tempfile::tempdir().unwrap();
        let abs = t.path().canonicalize().unwrap();
        let c = good(t.path(), |s| {
            s.replacen("path: m.gguf", &format!("path: {}", abs.join("m.gguf").display()), 1).replacen(
                "prompt_file: p.txt",
                &format!("prompt_file: {}", abs.join("p.txt").display()),
                1,
            )
        });
        assert_eq!(problems(&c, Recipes::Made), []);
    }
}

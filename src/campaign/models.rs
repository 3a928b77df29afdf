//! A campaign's models made from their recipes. A model whose file is missing and that says how
//! it is made (`forge:` or `quantize:`) is made once, into a temporary file beside its path,
//! checked against the pinned sha256 and only then renamed into place: a crash or a mismatch
//! leaves no model behind. A recipe that contradicts a file already present is refused.

use super::spec::{Campaign, Diagnostic, ForgeRecipe, ModelSpec, QuantizeRecipe};
use super::Loaded;
use crate::gguf::Gguf;
use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// A model made from its recipe.
#[derive(Debug, Clone, Serialize)]
pub struct Made {
    /// The campaign's field (`model`, `refine.verifier`, `refine.reference`, `proposers.NAME`).
    pub field: String,
    pub path: PathBuf,
    /// The command the recipe stands for.
    pub recipe: String,
    pub seconds: f64,
}

/// Makes every missing model that has a recipe (forged ones first: a quantized model's source
/// may be one of them). What is wrong with the models before any is made (a missing model
/// without a recipe, a recipe that contradicts the file present, a wrong digest) is
/// [`problems`]' to say, which `campaign run` asks first; a model this cannot make is refused
/// at its `path`, as `FILE:line:column: message`.
pub fn make_missing(c: &Loaded) -> Result<Vec<Made>> {
    let specs = c.spec.models();
    let mut made = Vec::new();
    for quantized in [false, true] {
        for (field, m) in specs.iter().filter(|(_, m)| m.quantize.is_some() == quantized) {
            let (field, m) = (field.as_str(), *m);
            let path = c.base.join(&*m.path);
            if path.symlink_metadata().is_ok() {
                continue;
            }
            let at = |e: anyhow::Error| anyhow!(Diagnostic::at(&m.path, format!("{e:#}")).render(&c.file.display().to_string()));
            let t = Instant::now();
            let recipe = match (&m.forge, &m.quantize) {
                (Some(f), _) => make(field, m, &path, |tmp| forge(f, tmp)).map_err(at)?,
                (None, Some(q)) => make(field, m, &path, |tmp| quantize(q, &c.base, tmp)).map_err(at)?,
                (None, None) => continue,
            };
            made.push(Made { field: field.to_string(), path, recipe, seconds: t.elapsed().as_secs_f64() });
        }
    }
    Ok(made)
}

/// What `campaign run` refuses of a campaign's models before it makes any, each at its field:
/// a model present must be a readable regular file that its recipe (if any) describes, with
/// the pinned sha256; a missing one needs a recipe that can make it. Under
/// [`Recipes::Made`] every model must be present. Makes nothing and writes nothing (a model's
/// digest manifest is cached, as every run caches it).
pub fn problems(c: &Campaign, base: &Path, recipes: Recipes) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    let specs = c.models();
    for (field, m) in &specs {
        let path = base.join(&*m.path);
        if path.symlink_metadata().is_err() {
            out.extend(missing(field, m, &path, base, &specs, recipes));
            continue;
        }
        let present = crate::bounds::regular_file(&format!("{field}.path"), &path)
            .and_then(|()| {
                crate::bounds::open_regular(&path).map(drop).with_context(|| format!("{}: cannot read {field}.path", path.display()))
            })
            .and_then(|()| check_recipe(field, m, &path));
        if let Err(e) = present {
            out.push(Diagnostic::at(&m.path, format!("{e:#}")));
            continue;
        }
        // Through the digest manifest, as every run checks its model.
        if let Err(e) = crate::digests::model_sha256(&path, Some(&m.sha256.0)) {
            out.push(Diagnostic::at(&m.sha256, format!("{field}.sha256: {e:#}")));
        }
    }
    out
}

/// Whether a model still to be made from its recipe is a problem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recipes {
    /// Not yet: `campaign run` makes it before its first cell (`campaign check`, and `run`
    /// before it makes models).
    Pending,
    /// The models were made: a missing one is refused.
    Made,
}

/// A missing model: refused without a recipe (with the fix), or with a recipe that cannot
/// make it (its dimensions, or a quantization source that is neither present nor made).
fn missing(field: &str, m: &ModelSpec, path: &Path, base: &Path, specs: &[(String, &ModelSpec)], recipes: Recipes) -> Option<Diagnostic> {
    let why = match (&m.forge, &m.quantize) {
        (None, None) => format!(
            "{}: {field}.path is missing, and {field} gives no recipe: make it (`sovereign model forge ... --out {}`), or add `forge:` or `quantize:` to {field}",
            path.display(),
            m.path.value
        ),
        _ if recipes == Recipes::Made => format!("{}: {field}.path is missing (its recipe was not made)", path.display()),
        (Some(f), _) => format!("{field}.forge: {:#}", dims(f).err()?),
        (None, Some(q)) => {
            let from = base.join(&q.from);
            let made_here = specs.iter().any(|(_, o)| o.forge.is_some() && base.join(&*o.path) == from);
            if from.is_file() || made_here {
                return None;
            }
            format!("{field}.quantize.from {} is missing, and no model of this campaign is forged there", from.display())
        }
    };
    Some(Diagnostic::at(&m.path, why))
}

/// The missing models `campaign run` will make, by field and path.
pub fn pending(c: &Campaign, base: &Path) -> Vec<(String, PathBuf)> {
    let made = |m: &ModelSpec| m.forge.is_some() || m.quantize.is_some();
    c.models()
        .into_iter()
        .filter(|(_, m)| made(m) && base.join(&*m.path).symlink_metadata().is_err())
        .map(|(f, m)| (f, base.join(&*m.path)))
        .collect()
}

/// Runs `build` into a temporary beside `path`; renames it into place only if its sha256 is
/// the pinned one.
fn make(field: &str, m: &ModelSpec, path: &Path, build: impl FnOnce(&Path) -> Result<String>) -> Result<String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create the model's directory", dir.display()))?;
    let name = path.file_name().ok_or_else(|| anyhow!("{field}.path {} names no file", m.path))?;
    let tmp = Temp(dir.join(format!(".{}.making-{}", name.to_string_lossy(), std::process::id())));
    let recipe = build(&tmp.0).with_context(|| format!("{field}: making {} from its recipe", m.path))?;
    let got = crate::util::sha256_file(&tmp.0)?;
    if got != m.sha256.0 {
        bail!(
            "{field}: `{recipe}` gives sha256 {got}, but {field}.sha256 is {}: the recipe does not make the pinned model (nothing was written)",
            m.sha256
        );
    }
    std::fs::rename(&tmp.0, path).with_context(|| format!("{}: cannot move the made model into place", path.display()))?;
    std::mem::forget(tmp);
    Ok(recipe)
}

/// A file removed when dropped (a model that was not made in full, or not the pinned one).
struct Temp(PathBuf);

impl Drop for Temp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn dims(f: &ForgeRecipe) -> Result<crate::forge::Dims> {
    let o = crate::forge::Overrides {
        layers: f.layers,
        experts: f.experts,
        top_k: f.top_k,
        embd: f.embd,
        expert_ff: f.expert_ff,
        vocab: f.vocab,
        alignment: f.alignment,
        context: f.context,
    };
    f.preset.dims().with(&o)
}

fn forge(f: &ForgeRecipe, out: &Path) -> Result<String> {
    let variant = crate::forge::Variant {
        f16_router: f.f16_router,
        tied_output: f.tied_output,
        router_skew: f.router_skew,
        mtp_layers: f.mtp_layers,
    };
    crate::forge::forge_variant(f.arch, dims(f)?, variant, f.seed, out)?;
    Ok(forge_command(f))
}

/// The `model forge` command line a recipe stands for.
fn forge_command(f: &ForgeRecipe) -> String {
    let mut s = format!("sovereign model forge --arch {} --preset {} --seed {}", f.arch.name(), preset_name(f.preset), f.seed);
    for (flag, v) in [
        ("layers", f.layers),
        ("experts", f.experts),
        ("top-k", f.top_k),
        ("embd", f.embd),
        ("expert-ff", f.expert_ff),
        ("vocab", f.vocab),
        ("alignment", f.alignment),
        ("context", f.context),
    ] {
        if let Some(v) = v {
            s += &format!(" --{flag} {v}");
        }
    }
    if f.f16_router {
        s += " --f16-router";
    }
    if f.tied_output {
        s += " --tied-output";
    }
    if f.router_skew > 0.0 {
        s += &format!(" --router-skew {}", f.router_skew);
    }
    if f.mtp_layers > 0 {
        s += &format!(" --mtp-layers {}", f.mtp_layers);
    }
    s
}

fn preset_name(p: crate::forge::Preset) -> &'static str {
    match p {
        crate::forge::Preset::Tiny => "tiny",
        crate::forge::Preset::Small => "small",
        crate::forge::Preset::Bench => "bench",
        crate::forge::Preset::Seed => "seed",
    }
}

fn quantize(q: &QuantizeRecipe, base: &Path, out: &Path) -> Result<String> {
    let from = base.join(&q.from);
    if !from.is_file() {
        bail!("quantize.from {} is missing (give it a recipe of its own, or make it first)", from.display());
    }
    crate::engine::quantize(&from, out, q.ty, 0)?;
    Ok(format!("sovereign model quantize --type {} {}", q.ty.name(), q.from))
}

/// A recipe must describe the file present: a forged file's architecture, seed and dimensions,
/// a quantized file's type. A file with other bytes is caught by its pinned sha256 later.
fn check_recipe(field: &str, m: &ModelSpec, path: &Path) -> Result<()> {
    if m.forge.is_none() && m.quantize.is_none() {
        return Ok(());
    }
    let g = Gguf::open(path).with_context(|| format!("{field}: {} is present but is not a readable GGUF", path.display()))?;
    let fix = "remove it to have the recipe make it, or correct the recipe";
    if let Some(f) = &m.forge {
        let d = dims(f)?;
        let seed = g.get("sovereign.forge.seed").and_then(|v| v.as_u64());
        let arch = g.architecture().unwrap_or("");
        // block_count counts the nextn blocks after the trunk's layers.
        let nextn = g.arch_u64("nextn_predict_layers").unwrap_or(0);
        let checks = [
            ("arch", arch.to_string(), f.arch.name().to_string()),
            ("seed", seed.map_or("none (not forged)".into(), |s| s.to_string()), f.seed.to_string()),
            ("layers", opt(g.arch_u64("block_count").map(|b| b - nextn.min(b))), d.layers.to_string()),
            ("mtp_layers", nextn.to_string(), f.mtp_layers.to_string()),
            ("experts", opt(g.arch_u64("expert_count")), d.experts.to_string()),
            ("top_k", opt(g.arch_u64("expert_used_count")), d.top_k.to_string()),
            ("alignment", g.alignment.to_string(), d.alignment.to_string()),
        ];
        if let Some((what, have, want)) = checks.into_iter().find(|(_, have, want)| have != want) {
            bail!("{field}: {} has {what} {have}, but {field}.forge says {want}: {fix}", path.display());
        }
    }
    if let Some(q) = &m.quantize {
        let have = g.get("general.file_type").and_then(|v| v.as_u64());
        if have != Some(u64::from(q.ty.file_type())) {
            bail!(
                "{field}: {} has general.file_type {}, but {field}.quantize says {} ({}): {fix}",
                path.display(),
                opt(have),
                q.ty.name(),
                q.ty.file_type()
            );
        }
    }
    Ok(())
}

fn opt(v: Option<u64>) -> String {
    v.map_or("none".into(), |v| v.to_string())
}

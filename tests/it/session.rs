//! Sessions: a request decoded after others in the same context, once the context is cleared,
//! is bitwise the request decoded in a new context.

use crate::common::ok;
use sovereign::engine::{Context, Model};
use sovereign::exec::ExecParams;
use sovereign::routes::RouteEvent;
use std::path::{Path, PathBuf};

fn forge_arch(dir: &Path, arch: &str) -> PathBuf {
    let out = dir.join(format!("{arch}.gguf"));
    ok(&["model", "forge", "--arch", arch, "--preset", "tiny", "--seed", "3", "--out", out.to_str().unwrap()]);
    out
}

/// What one request leaves: every logits row (as bits), each recurrent state after prefill and
/// after every step, and the routes.
#[derive(Debug, PartialEq)]
struct Served {
    logits: Vec<u32>,
    states: Vec<Vec<u8>>,
    routes: Vec<RouteEvent>,
}

/// Prefill (a ubatch of several tokens) and `n` greedy steps, as `generate` decodes.
fn serve(model: &Model, ctx: &mut Context, prompt: &str, n: usize) -> Served {
    let toks = model.tokenize(prompt.as_bytes(), true).unwrap();
    let mut rows = Vec::new();
    let mut states = Vec::new();
    ctx.decode(&toks, true, &mut rows).unwrap();
    states.extend(ctx.recurrent_state().unwrap());
    for _ in 0..n {
        let last = &rows[rows.len() - model.n_vocab()..];
        let next = sovereign::generate::argmax(last) as i32;
        ctx.decode(&[next], true, &mut rows).unwrap();
        states.extend(ctx.recurrent_state().unwrap());
    }
    Served { logits: rows.iter().map(|x| x.to_bits()).collect(), states, routes: ctx.take_routes() }
}

#[test]
fn a_cleared_context_serves_a_request_as_a_new_one_would() {
    let dir = tempfile::tempdir().unwrap();
    sovereign::engine::init();
    let exec = ExecParams { n_ctx: 256, n_batch: 64, n_ubatch: 64, threads: 2, threads_batch: None, flash_attn: false };
    let (a, b) = ("an earlier request, longer than the one after it, fills the cache", "the request that follows");
    // Attention only, hybrid (recurrent state per position of a ubatch) and recurrent with
    // snapshots.
    for arch in ["qwen3moe", "qwen35moe", "qwen3next"] {
        let model = Model::load(&forge_arch(dir.path(), arch)).unwrap();
        let alone = serve(&model, &mut Context::new(&model, exec, true).unwrap(), b, 6);
        assert!(
            !alone.routes.is_empty() && alone.logits.len() == (model.tokenize(b.as_bytes(), true).unwrap().len() + 6) * model.n_vocab()
        );
        assert_eq!(!alone.states.is_empty(), model.has_recurrent_state(), "{arch}");

        let mut ctx = Context::new(&model, exec, true).unwrap();
        let first = serve(&model, &mut ctx, a, 9);
        ctx.clear();
        assert_eq!(ctx.n_past(), 0);
        let after = serve(&model, &mut ctx, b, 6);
        assert!(after == alone, "{arch}: a request after a cleared one differs from it alone");
        // The same request twice in a row, cleared between: the same bytes again.
        ctx.clear();
        assert!(serve(&model, &mut ctx, b, 6) == alone, "{arch}: the second repeat differs");
        // And the earlier request was itself what it is alone (nothing of the test is vacuous).
        assert!(first != alone);
    }
}

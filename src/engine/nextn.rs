//! Multi-token prediction: an MTP context on the same model, and the hidden rows (`h_nextn`,
//! the trunk's post-norm state) that pass from the target to its MTP head.
//!
//! The pinned tree declares its staging calls in `src/llama-ext.h`, a C++ header outside
//! `llama.h`, so they have C++ linkage: they are named here by their Itanium mangled names.
//! A signature that changes at a new pin changes the name, and the link fails rather than
//! calling the wrong thing.

use super::{last_log, sys, Context, Model};
use anyhow::{anyhow, bail, Result};
use std::ffi::c_int;

unsafe extern "C" {
    /// `void llama_set_embeddings_nextn(llama_context *, bool value, bool masked)`
    #[link_name = "_Z26llama_set_embeddings_nextnP13llama_contextbb"]
    fn llama_set_embeddings_nextn(ctx: *mut sys::llama_context, value: bool, masked: bool);
    /// `float * llama_get_embeddings_nextn_ith(llama_context *, int32_t i)`
    #[link_name = "_Z30llama_get_embeddings_nextn_ithP13llama_contexti"]
    fn llama_get_embeddings_nextn_ith(ctx: *mut sys::llama_context, i: c_int) -> *mut f32;
}

/// Hidden rows a context keeps from its last decode.
pub(super) struct Hidden {
    /// Only the output rows (an MTP context), or every row of the batch (a target).
    masked: bool,
    width: usize,
    pub(super) rows: Vec<f32>,
}

impl Model {
    /// Nextn (MTP) blocks the model declares (`<arch>.nextn_predict_layers`).
    pub fn n_nextn(&self) -> u32 {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_layer_nextn(self.ptr.as_ptr()) }.max(0) as u32
    }

    /// Width of a hidden row (`n_embd_out`).
    pub fn n_embd_out(&self) -> usize {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_embd_out(self.ptr.as_ptr()) }.max(0) as usize
    }
}

impl<'m> Context<'m> {
    /// An MTP context: its graph is the model's nextn block, fed a token and the target's
    /// hidden row for the position before it; it keeps its own output rows' hidden states.
    /// The model must have been loaded with its nextn blocks ([`Model::load_full`]).
    pub fn mtp(model: &'m Model, params: crate::exec::ExecParams, capture_routes: bool) -> Result<Context<'m>> {
        if model.n_nextn() == 0 {
            bail!("{}: the model has no MTP (nextn) block", model.path.display());
        }
        let mut ctx = Self::of_type(model, params, capture_routes, 0, sys::llama_context_type_LLAMA_CONTEXT_TYPE_MTP)?;
        ctx.keep_hidden(true);
        Ok(ctx)
    }

    /// From now on every decode keeps its hidden rows ([`Context::hidden`]): every row of the
    /// batch, or (`masked`) the rows of its outputs.
    pub fn keep_hidden(&mut self, masked: bool) {
        // SAFETY: the context is alive and no decode runs (&mut self).
        unsafe { llama_set_embeddings_nextn(self.ptr.as_ptr(), true, masked) };
        self.hidden = Some(Hidden { masked, width: self.model.n_embd_out(), rows: Vec::new() });
    }

    /// The hidden rows of the last decode, `n_embd_out` floats each (empty unless kept).
    pub fn hidden(&self) -> &[f32] {
        self.hidden.as_ref().map_or(&[], |h| &h.rows)
    }

    /// Decodes `tokens`, each beside its state row (`states`: `n_embd_out` floats a token),
    /// as an MTP context takes them.
    pub fn decode_with_states(&mut self, tokens: &[i32], states: &[f32], all_logits: bool, rows: &mut Vec<f32>) -> Result<()> {
        let width = self.model.n_embd_out();
        if width == 0 || states.len() != tokens.len() * width {
            bail!("{} state floats for {} tokens of width {width}", states.len(), tokens.len());
        }
        self.decode_states(tokens, Some(states), all_logits, rows)
    }

    /// After a decoded chunk of `n` tokens: appends its hidden rows where they are kept.
    pub(super) fn keep_hidden_rows(&mut self, n: usize, all_logits: bool) -> Result<()> {
        let Some(h) = self.hidden.as_mut() else { return Ok(()) };
        let first = if h.masked && !all_logits { n - 1 } else { 0 };
        for i in first..n {
            // SAFETY: the context is alive; llama.cpp returns null for a row it does not hold,
            // else width floats valid until the next decode, copied out here.
            let p = unsafe { llama_get_embeddings_nextn_ith(self.ptr.as_ptr(), i as c_int) };
            if p.is_null() {
                return Err(anyhow!("no hidden row {i} of the last decode: {}", last_log()));
            }
            h.rows.extend_from_slice(unsafe { std::slice::from_raw_parts(p, h.width) });
        }
        Ok(())
    }
}

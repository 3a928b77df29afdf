//! Route capture: the router's top-k ids of every MoE layer, read from the `ffn_moe_topk-L`
//! node through llama.cpp's eval callback (no patch needed to observe, only to remap).

use super::sys;
use crate::routes::RouteEvent;
use std::ffi::{c_void, CStr};

const TOPK_PREFIX: &[u8] = b"ffn_moe_topk-";

#[derive(Debug, Default)]
pub struct RouteRecorder {
    events: Vec<RouteEvent>,
    ubatch: Option<u32>,
    ubatch_pos: u32,
    ubatch_rows: u32,
    last_layer: Option<u32>,
    k: Option<usize>,
}

impl RouteRecorder {
    pub fn take(&mut self) -> Vec<RouteEvent> {
        std::mem::take(&mut self.events)
    }

    pub fn k(&self) -> Option<usize> {
        self.k
    }

    fn record(&mut self, layer: u32, t: &sys::ggml_tensor) {
        let (k, rows) = (t.ne[0] as usize, t.ne[1] as u32);
        // A layer at or below the previous one starts the next ubatch.
        if self.last_layer.is_none_or(|l| layer <= l) {
            self.ubatch_pos += self.ubatch_rows;
            self.ubatch = Some(self.ubatch.map_or(0, |u| u + 1));
            self.ubatch_rows = rows;
        }
        self.last_layer = Some(layer);
        // The most any layer selects: layers may select different numbers of experts.
        self.k = Some(self.k.map_or(k, |m| m.max(k)));
        let ubatch = self.ubatch.unwrap_or(0);
        let mut ids = vec![0i32; k];
        for row in 0..rows {
            // SAFETY: the node is computed; row `row` holds k contiguous I32 values at
            // offset row * nb[1] of the (possibly strided) view.
            unsafe {
                sys::ggml_backend_tensor_get(t as *const _ as *mut _, ids.as_mut_ptr() as *mut c_void, row as usize * t.nb[1], k * 4);
            }
            self.events.push(RouteEvent { ubatch, row, pos: self.ubatch_pos + row, layer, experts: ids.clone() });
        }
    }
}

fn topk_layer(t: &sys::ggml_tensor) -> Option<u32> {
    // SAFETY: ggml tensor names are NUL-terminated within the fixed-size array.
    let name = unsafe { CStr::from_ptr(t.name.as_ptr()) }.to_bytes();
    let rest = name.strip_prefix(TOPK_PREFIX)?;
    std::str::from_utf8(rest).ok()?.parse().ok()
}

/// `ggml_backend_sched_eval_callback`: asks for the top-k nodes, then reads them.
///
/// # Safety
/// `t` is a live tensor of the graph being computed and `user` the context's boxed
/// [`RouteRecorder`], as registered; the scheduler calls it from one thread at a time, and only
/// while the context lives (it is freed before the recorder is dropped). A panic here aborts
/// the process rather than unwinding into C.
pub(super) unsafe extern "C" fn eval_callback(t: *mut sys::ggml_tensor, ask: bool, user: *mut c_void) -> bool {
    // SAFETY: the scheduler passes a live tensor; user data is the context's boxed recorder.
    let (t, rec) = unsafe { (&*t, &mut *(user as *mut RouteRecorder)) };
    let Some(layer) = topk_layer(t) else {
        // Asked: not interested. Evaluated: keep computing.
        return !ask;
    };
    if !ask && t.type_ == sys::ggml_type_GGML_TYPE_I32 {
        rec.record(layer, t);
    }
    true
}

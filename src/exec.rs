//! What a run's engine is made with and where it places the model, as records state them:
//! the execution parameters that change kernels or numerics, the placement asked for, and what
//! it amounted to on this machine's devices. Plain data: the engine applies it, records keep it.

use serde::{Deserialize, Serialize};

/// Where llama.cpp puts a model's layers: `gpu_layers` is llama's `n_gpu_layers` (negative:
/// all), `experts_host` keeps the MoE expert tensors in host memory by buffer-type override (as
/// llama.cpp's `--cpu-moe` does). Process-wide: every run is its own process.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Placement {
    pub gpu_layers: i32,
    pub experts_host: bool,
    /// `--gpu-budget`: the device bytes the run may hold.
    pub gpu_budget: Option<u64>,
}

/// `"all"`, or a number of layers: llama's `n_gpu_layers` as a record states it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
pub enum GpuLayers {
    All(AllLayers),
    Count(i32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AllLayers {
    All,
}

/// The device memory of the run's own process before decoding, against `--gpu-budget`:
/// what its buffers hold on each device (exact: their sizes), and what NVML reports for the
/// process where a GPU is observed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceCheck {
    pub observed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub own_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub budget: Option<u64>,
    /// Per device, the bytes of the run's buffers there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<DeviceBuffers>,
    /// Their total on every device but the CPU: what the budget bounds.
    #[serde(default, skip_serializing_if = "crate::util::is_zero")]
    pub device_bytes: u64,
}

/// The bytes of a context's buffers on one device.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceBuffers {
    pub device: String,
    /// Weights llama.cpp loaded there.
    pub model: u64,
    /// KV cache and recurrent state.
    pub context: u64,
    /// Compute buffers (the graph's scratch).
    pub compute: u64,
    /// The expert source's slot pools.
    pub pools: u64,
}

impl DeviceBuffers {
    pub fn total(&self) -> u64 {
        self.model + self.context + self.compute + self.pools
    }
}

/// The placement as a record states it, with what it amounts to on this machine's devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlacementReport {
    pub gpu_layers: GpuLayers,
    pub experts_host: bool,
    pub gpu_budget: Option<u64>,
    pub gpu_devices: Vec<String>,
    pub effective: String,
    /// ggml's RPC protocol version this build speaks, when an RPC device is registered (a
    /// server of another major version refuses the connection).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc_protocol: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_before_decode: Option<DeviceCheck>,
    /// After the run: the RPC device server's own memory cgroup (hard: the kernel's peak).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_audit: Option<crate::observe::DeviceAudit>,
}

/// Execution parameters that change kernels or numerics: fixed and recorded for every arm.
/// `C` is the context: its size in tokens once resolved (`ExecParams`, what a context is made
/// with and every record states), or, as a run asks for it ([`ExecRequest`]), `None` to size it
/// to the run's work once its prompt is tokenized (`bounds::context`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExecParams<C = u32> {
    pub n_ctx: C,
    pub n_batch: u32,
    pub n_ubatch: u32,
    /// Threads for one-token batches (decoding).
    pub threads: i32,
    /// Threads for multi-token batches (the prompt, a drafted traversal), where they differ
    /// from `threads`: the prompt is compute-bound even when experts stream, one token is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads_batch: Option<i32>,
    pub flash_attn: bool,
}

/// Execution parameters as a run asks for them: the context given (`--ctx`), or `None`.
pub type ExecRequest = ExecParams<Option<u32>>;

impl<C> ExecParams<C> {
    /// The parameters every run takes but for its context size, its threads resolved as
    /// [`crate::bounds::threads`] does.
    pub fn new(n_ctx: C, batch: u32, threads: (i64, i64), flash_attn: bool) -> ExecParams<C> {
        // Saturating: an out-of-range count stays out of range for `RunParams::check`.
        let clamp = |n: i64| n.clamp(i32::MIN.into(), i32::MAX.into()) as i32;
        let (decode, batched) = (clamp(threads.0), clamp(threads.1));
        ExecParams {
            n_ctx,
            n_batch: batch,
            n_ubatch: batch,
            threads: decode,
            threads_batch: (batched != decode).then_some(batched),
            flash_attn,
        }
    }

    /// The most CPU threads the engine computes with at once: its decode or its batch threads.
    pub fn cpu_threads(&self) -> usize {
        self.threads.max(self.threads_batch.unwrap_or(0)).max(1) as usize
    }

    /// The same parameters with the context `n_ctx`.
    pub fn with_ctx<D>(self, n_ctx: D) -> ExecParams<D> {
        let ExecParams { n_ctx: _, n_batch, n_ubatch, threads, threads_batch, flash_attn } = self;
        ExecParams { n_ctx, n_batch, n_ubatch, threads, threads_batch, flash_attn }
    }
}

#[cfg(test)]
mod tests {
    use super::ExecParams;

    #[test]
    fn the_engines_cpu_threads_are_the_more_of_decode_and_batch() {
        let threads = |d, b| ExecParams::new(None::<u32>, 512, (d, b), false).cpu_threads();
        assert_eq!(threads(2, 2), 2);
        assert_eq!(threads(1, 2), 2, "a prompt on more threads than the decode");
        assert_eq!(threads(3, 1), 3);
        assert_eq!(threads(0, 0), 1);
    }
}

//! `device serve`: a non-host device in its own process (ggml's RPC backend over the CPU
//! device), for the device tier where no GPU exists.

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum DeviceCommand {
    /// Serve this machine's CPU device over ggml's RPC protocol until killed; `generate --rpc
    /// HOST:PORT --gpu-layers all` then places layers and slot pools in its buffers.
    ///
    /// Example: sovereign device serve --listen 127.0.0.1:50052
    Serve {
        /// HOST:PORT to listen on (a loopback address: the protocol has no authentication).
        #[arg(long)]
        listen: String,
        /// Threads the device computes with.
        #[arg(long, default_value_t = 2)]
        threads: usize,
    },
}

pub fn device(c: DeviceCommand) -> Result<ExitCode> {
    match c {
        DeviceCommand::Serve { listen, threads } => {
            let addr: std::net::SocketAddr = listen.parse().map_err(|e| anyhow!("--listen {listen:?}: not HOST:PORT ({e})"))?;
            if !addr.ip().is_loopback() {
                bail!("--listen {listen}: the RPC protocol has no authentication; serve on a loopback address");
            }
            if threads == 0 || threads > sovereign::bounds::MAX_THREADS as usize {
                bail!("--threads {threads} is out of range (1 to {})", sovereign::bounds::MAX_THREADS);
            }
            sovereign::engine::init();
            sovereign::engine::backends::rpc_serve(&listen, threads).map_err(|e| anyhow!(e))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

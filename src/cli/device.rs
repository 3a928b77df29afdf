//! `device serve`: a non-host device in its own process (ggml's RPC backend over the CPU
//! device), for the device tier where no GPU exists.

use anyhow::{anyhow, bail, Result};
use clap::Subcommand;
use sovereign::cell::DeviceServe;
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum DeviceCommand {
    /// Serve this machine's CPU device over ggml's RPC protocol until killed; `generate --rpc
    /// HOST:PORT --gpu-layers all` then places layers and slot pools in its buffers.
    ///
    /// Example: sovereign device serve --listen 127.0.0.1:50052
    #[command(after_help = "Example:\n  sovereign device serve --listen 127.0.0.1:50052 --memory-max 256M")]
    Serve {
        /// HOST:PORT to listen on (a loopback address: the protocol has no authentication).
        #[arg(long)]
        listen: String,
        /// Threads the device computes with.
        #[arg(long, default_value_t = sovereign::cell::DEVICE_SERVE_THREADS)]
        threads: usize,
        /// A hard bound on the device's memory: the server runs in a memory cgroup of its own
        /// with this limit (swap off), and what it allocated beyond it fails (e.g. 512M, 2G).
        #[arg(long, value_parser = sovereign::bounds::parse_bytes)]
        memory_max: Option<u64>,
    },
}

pub fn device(c: DeviceCommand) -> Result<ExitCode> {
    match c {
        DeviceCommand::Serve { listen, threads, memory_max } => serve(&DeviceServe { listen, threads }, memory_max),
    }
}

/// Serves `s` until killed: here, or with `memory_max` as a child in a memory cgroup of its own.
pub fn serve(s: &DeviceServe, memory_max: Option<u64>) -> Result<ExitCode> {
    let DeviceServe { listen, threads } = s;
    let addr: std::net::SocketAddr = listen.parse().map_err(|e| anyhow!("--listen {listen:?}: not HOST:PORT ({e})"))?;
    if !addr.ip().is_loopback() {
        bail!("--listen {listen}: the RPC protocol has no authentication; serve on a loopback address");
    }
    if *threads == 0 || *threads > sovereign::bounds::MAX_THREADS as usize {
        bail!("--threads {threads} is out of range (1 to {})", sovereign::bounds::MAX_THREADS);
    }
    if let Some(max) = memory_max {
        return serve_capped(listen, *threads, max);
    }
    sovereign::engine::init();
    sovereign::engine::backends::rpc_serve(listen, *threads).map_err(|e| anyhow!(e))?;
    Ok(ExitCode::SUCCESS)
}

/// The same server as a child in its own memory cgroup; what bounded it is said when it ends.
fn serve_capped(listen: &str, threads: usize, max: u64) -> Result<ExitCode> {
    sovereign::bounds::range(
        "--memory-max",
        max,
        sovereign::bounds::MIN_MEMORY_MAX,
        sovereign::bounds::MAX_MEMORY_MAX,
        "1 MiB up to 1 PiB",
    )?;
    let mut cmd = std::process::Command::new(std::env::current_exe()?);
    cmd.args(["device", "serve", "--listen", listen, "--threads", &threads.to_string()]);
    let server = sovereign::observe::Capped::start(cmd, max)?;
    forward_termination(server.pid());
    eprintln!(
        "device server at {listen} in cgroup {} (memory limit {} bytes, swap off); audit a run with --device-cgroup {}",
        server.cgroup(),
        server.limit.map_or("?".into(), |l| l.to_string()),
        server.cgroup_dir().display()
    );
    let end = server.wait()?;
    let c = &end.counters;
    eprintln!(
        "device server {}: peak {} bytes, limit events {}, OOM kills {}",
        end.status,
        c.peak.map_or("not kept".into(), |p| p.to_string()),
        c.limit_events,
        c.oom_kills
    );
    Ok(if end.status.success() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

static SERVER: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// SIGTERM and SIGINT stop the server, so this process lives on to report and remove its
/// cgroup (a SIGKILL leaves the cgroup to the next run's clean-up of stale ones).
fn forward_termination(pid: u32) {
    use nix::sys::signal::{kill, signal, SigHandler, Signal};
    /// A signal handler: it may run between any two instructions of any thread, so it only
    /// loads an atomic and calls kill, both async-signal-safe.
    extern "C" fn forward(sig: libc::c_int) {
        let pid = SERVER.load(std::sync::atomic::Ordering::Relaxed);
        if let (true, Ok(sig)) = (pid > 0, Signal::try_from(sig)) {
            let _ = kill(nix::unistd::Pid::from_raw(pid), sig);
        }
    }
    SERVER.store(pid as i32, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the handler is async-signal-safe (see `forward`), and no other code of this
    // process sets a disposition for these two signals.
    unsafe {
        let _ = signal(Signal::SIGTERM, SigHandler::Handler(forward));
        let _ = signal(Signal::SIGINT, SigHandler::Handler(forward));
    }
}

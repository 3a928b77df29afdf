//! The `sovereign` command line: parse, then dispatch to the command's module in `cli/`.

mod cli;

use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

fn main() -> ExitCode {
    // Die quietly on a closed pipe (`sovereign inventory M | head`), like other Unix tools.
    // SAFETY: setting a signal disposition (no handler) before any threads start.
    let _ = unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGPIPE, nix::sys::signal::SigHandler::SigDfl) };
    cli::notices::install();
    let m = cli::Cli::command().try_get_matches().unwrap_or_else(|e| cli::refuse(e));
    let mut cli = cli::Cli::from_arg_matches(&m).unwrap_or_else(|e| cli::refuse(e));
    cli.note_given(&m);
    if let Some(d) = &cli.backend_dir {
        // Before any thread starts; workers inherit it.
        std::env::set_var(sovereign::engine::backends::BACKEND_DIR_ENV, d);
    }
    match cli::dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

//! `task SPEC`: a process this binary started for work other than a cell (a device server, a
//! cluster's block task), given as a typed spec; it runs what the command it stands for runs.

use anyhow::Result;
use clap::Args;
use sovereign::cell::{read_task, Task};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Args)]
pub struct TaskArgs {
    /// The task spec (JSON), as `cell::write_task` writes it.
    spec: PathBuf,
}

pub fn task(a: TaskArgs) -> Result<ExitCode> {
    match read_task(&a.spec)? {
        Task::DeviceServe(s) => super::device::serve(&s, None),
        Task::CampaignBlock(b) => super::campaign::run_block(&b),
    }
}

//! The integration tests: one binary, so the suite links once and libtest spreads every test
//! over the cores. Each module is one subject; `common` holds the helpers they share.

mod common;

mod architecture;
mod authority;
mod bench;
mod campaign;
mod certificate;
mod context;
mod digests;
mod engine;
mod expert_source;
mod families;
mod faults;
mod gguf_fuzz;
mod inputs;
mod mtp;
mod observe;
mod plan_completeness;
mod plan_differential;
mod plan_exactness;
mod plan_simulate;
mod record_format;
mod records;
mod refine;
mod reproduce;
mod rpc;
mod session;
mod slurm;
mod speculative;
mod timeline;

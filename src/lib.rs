//! sovereign: LLM inference beyond full memory residency, with proof of what happened.

pub mod bounds;
pub mod campaign;
pub mod cell;
pub mod certificate;
pub mod claims;
pub mod digests;
pub mod engine;
pub mod envelope;
pub mod export;
pub mod forge;
pub mod generate;
pub mod gguf;
pub mod identity;
pub mod inventory;
pub mod measure;
pub mod observe;
pub mod oracle;
pub mod plan;
pub mod record;
pub mod refine;
pub mod reproduce;
pub mod routes;
pub mod source;
pub mod spec;
pub mod stats;
pub mod util;

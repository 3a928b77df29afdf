//! Sessions: many requests served by one process, one model load and one Plan. This room holds
//! what a session reads and judges apart from the engine: its requests file and the task
//! scores of its responses.

use serde::{Deserialize, Serialize};

pub mod requests;
pub mod score;

pub use requests::Request;
pub use score::{Aggregate, Score};

/// What the expert source carries from one request of a session to the next. The engine's
/// sequence (KV cache, recurrent states) is cleared either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Between {
    /// The Plan is reset (a new epoch; nothing in flight survives) and the experts it published
    /// stay warm for the next request.
    Reset,
    /// As `reset`, and every slot is emptied and the policy starts over: the next request runs
    /// as the first of a new Plan.
    Cold,
    /// Nothing carries over: every request is a process of its own, with its own model load
    /// and expert source (separate runs, as a session's baseline).
    Separate,
}

impl Between {
    pub fn name(self) -> &'static str {
        match self {
            Between::Reset => "reset",
            Between::Cold => "cold",
            Between::Separate => "separate",
        }
    }
}

/// What a session asks to carry between requests: the `--between` flag and a campaign arm's
/// `between` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum BetweenMode {
    /// Reset: keep what the last request published warm
    #[default]
    Auto,
    /// A new epoch; published experts stay warm
    Reset,
    /// Every slot emptied and the policy new, as a new Plan
    Cold,
    /// Every request a process of its own: its own model load and expert source
    Separate,
}

impl BetweenMode {
    pub fn resolve(self) -> Between {
        match self {
            BetweenMode::Auto | BetweenMode::Reset => Between::Reset,
            BetweenMode::Cold => Between::Cold,
            BetweenMode::Separate => Between::Separate,
        }
    }
}

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
}

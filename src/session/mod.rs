//! Sessions: many requests served by one process, one model load and one Plan. This room holds
//! what a session reads and judges apart from the engine: its requests file and the task
//! scores of its responses.

pub mod requests;
pub mod score;

pub use requests::Request;
pub use score::{Aggregate, Score};

//! Driving a model: sessions that keep the KV cache between requests (longest-common-prefix
//! reuse) and the generation loop (sampling, stop conditions, streaming text).

pub mod generate;
pub mod perplexity;
pub mod session;
pub mod stats;

pub use generate::{generate, FinishReason, GenerateOptions, Generation};
pub use session::Session;

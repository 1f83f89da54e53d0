//! Driving a model: sessions that keep the KV cache between requests (longest-common-prefix
//! reuse), the generation loop (sampling, stop conditions, streaming text) and the
//! continuous-batching scheduler behind `trit serve`.

pub mod generate;
pub mod perplexity;
pub mod prefix_store;
pub mod scheduler;
pub mod sequence;
pub mod session;
pub mod stats;

pub use generate::{generate, FinishReason, GenerateOptions, Generation};
pub use scheduler::{
    Scheduler, SchedulerConfig, SchedulerStats, SeqEvent, SeqRequest, SeqSummary, SubmitError,
};
pub use sequence::{Decoding, Step, TokenLogprob};
pub use session::Session;

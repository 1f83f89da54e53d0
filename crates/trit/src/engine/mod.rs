//! Driving a model: sessions that keep the KV cache between requests (longest-common-prefix
//! reuse), the generation loop (sampling, stop conditions, streaming text) and the
//! continuous-batching scheduler behind `trit serve` with its paged KV block pool.

pub mod block_pool;
pub mod embedding;
pub mod generate;
pub mod kl_divergence;
pub mod logits_file;
mod parked_slots;
pub mod perplexity;
pub mod scheduler;
pub mod sequence;
pub mod session;
pub mod speculative;
pub mod state_file;
pub mod stats;

pub use block_pool::{BlockPool, BlockStats};
pub use embedding::{embed, Pooling};
pub use generate::{
    generate, generate_shifting, ContextShift, FinishReason, GenerateOptions, Generation,
};
pub use scheduler::{
    Draft, Scheduler, SchedulerConfig, SchedulerStats, SeqEvent, SeqRequest, SeqSummary,
    SubmitError,
};
pub use sequence::{Decoding, Step, TokenLogprob};
pub use session::Session;
pub use speculative::{check_draft, generate_speculative, DraftOptions, DraftStats};
pub use state_file::LoadedState;

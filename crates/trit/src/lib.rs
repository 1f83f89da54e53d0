//! trit: an engine for ternary ("1.58-bit") language models.
//!
//! The data path is visible in the module names:
//! file (`format`) → tensors (`quant`, `kernels`) → model (`model`) → logits →
//! sampler (`sample`) → text (`tokenizer`, `chat`), driven by `engine`.

pub mod chat;
pub mod convert;
pub mod engine;
pub mod error;
pub mod format;
pub mod kernels;
pub mod model;
pub mod profile;
pub mod quant;
pub mod sample;
/// Deterministic pseudo-random inputs for tests (unit and integration); not an API.
#[doc(hidden)]
pub mod test_values;
pub mod threadpool;
pub mod tokenizer;

pub use error::{Error, Result};

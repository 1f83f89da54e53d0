//! Logits → next token: penalties over the recent history, then a seeded sampler.

pub mod processors;
pub mod rng;
pub mod sampler;

pub use processors::Penalties;
pub use sampler::{Sampler, SamplingParams};

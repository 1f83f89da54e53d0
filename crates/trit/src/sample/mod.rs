//! Logits → next token: penalties over the recent history, then a seeded sampler; or, from a
//! device backend, a row's best candidates only (`candidates`).

pub mod candidates;
pub mod constraint;
pub mod dry;
pub mod dynatemp;
pub mod grammar;
pub mod json;
pub mod lazy;
pub mod mirostat;
pub mod processors;
pub mod rng;
pub mod sampler;
pub mod token_table;
pub mod truncation;

pub use candidates::{RowLogits, TopLogits, TOP_CANDIDATES};
pub use constraint::{constraint_for, Constrain, ConstrainedOutput, OutputConstraint, OutputRule};
pub use dry::{Breakers, Dry};
pub use dynatemp::DynamicTemperature;
pub use grammar::Grammar;
pub use json::JsonSchema;
pub use lazy::LazyRule;
pub use mirostat::Mirostat;
pub use processors::Penalties;
pub use sampler::{Sampler, SamplingParams};
pub use token_table::TokenTable;
pub use truncation::Truncation;

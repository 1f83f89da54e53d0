//! Chat prompts: the model's own Jinja template rendered like transformers renders it
//! ([`ChatTemplate`]), and the split of a thinking model's reply into reasoning and answer.

pub mod builtin;
mod pyjson;
mod pystr;
pub mod reasoning;
mod strftime;
mod template;

pub use reasoning::{split_reasoning, ReasoningSplit, ReasoningStream, ReplyPart};
pub use template::{ChatTemplate, FUEL as TEMPLATE_FUEL};

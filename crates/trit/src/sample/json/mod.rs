//! JSON schemas as a language over bytes for constrained decoding (`super::constraint`): a
//! compiled schema and a recognizer that reads output byte by byte and says whether it is
//! still a prefix of a document that satisfies the schema.

mod dec_range;
mod int_range;
mod pattern;
mod recognizer;
mod schema;

pub use recognizer::{ParseState, Recognizer};
pub use schema::JsonSchema;

#[cfg(test)]
mod all_of_tests;
#[cfg(test)]
mod number_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod union_tests;
#[cfg(test)]
mod xml_tests;

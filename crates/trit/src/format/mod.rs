//! See docs/ARCHITECTURE.md.
pub mod gguf;
pub mod gguf_write;

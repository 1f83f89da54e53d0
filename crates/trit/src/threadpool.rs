//! Persistent worker pool. See docs/ARCHITECTURE.md.

//! Persistent worker pool: `ThreadPool::run(&f)` calls `f(thread_idx, n_threads)` on every
//! thread (index 0 is the caller) and returns when all are done. Workers spin briefly after a
//! job, then park; jobs are published by a sequence number. The implementation lives in
//! `kernels::pool` because it needs one `unsafe` lifetime erasure and `unsafe` is confined to
//! `kernels/`.

pub use crate::kernels::pool::{default_threads, ThreadPool};

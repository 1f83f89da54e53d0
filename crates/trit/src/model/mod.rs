//! Models: config + named weights → a forward pass that fills the KV cache and returns logits.

pub mod attention;
pub mod kv_cache;
pub mod llama;
pub mod qwen3;
pub mod rope;
pub mod transformer;
pub mod weights;

pub use kv_cache::KvCache;
pub use transformer::{BatchSeq, Logits, Transformer};

use crate::format::config::{Arch, ModelConfig};
use crate::format::ModelFiles;
use crate::threadpool::ThreadPool;
use crate::Result;

/// A loaded model plus the worker pool its kernels run on.
pub struct Model {
    net: Transformer,
    pool: ThreadPool,
}

impl Model {
    pub fn load(files: &ModelFiles, threads: usize) -> Result<Self> {
        let cfg = &files.config;
        let src = files.weights.as_ref();
        let net = match cfg.arch {
            Arch::Llama => llama::load(cfg, src)?,
            Arch::Qwen3 => qwen3::load(cfg, src)?,
        };
        Ok(Model {
            net,
            pool: ThreadPool::new(threads.max(1)),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.net.config
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        self.net.new_cache(n_ctx)
    }

    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, which: Logits) -> Result<Vec<f32>> {
        self.net.forward(&self.pool, tokens, cache, which)
    }

    /// Several sequences in one pass (weights read once for all); see
    /// [`Transformer::forward_batch`].
    pub fn forward_batch(&self, seqs: &mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        self.net.forward_batch(&self.pool, seqs)
    }

    pub fn weight_bytes(&self) -> usize {
        self.net.weight_bytes()
    }

    pub fn bytes_per_token(&self) -> usize {
        self.net.bytes_per_token()
    }
}

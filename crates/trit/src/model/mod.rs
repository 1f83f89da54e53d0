//! Models: config + named weights → a forward pass that fills the KV cache and returns logits.

pub mod attention;
pub mod bitnet;
pub mod device_slot;
pub mod gated_delta;
pub mod kv_cache;
pub mod llama;
pub mod lora;
pub mod qwen3;
pub mod qwen35;
pub mod recurrent;
pub mod rope;
pub mod rotation;
pub mod transformer;
pub mod weights;

pub use kv_cache::{KvCache, KvType, KvTypes};
pub use transformer::{BatchSeq, Logits, Transformer};

use crate::format::config::{Arch, ModelConfig};
use crate::format::ModelFiles;
use crate::sample::RowLogits;
use crate::threadpool::ThreadPool;
use crate::Result;

/// The network of one architecture family.
enum Net {
    /// llama / qwen3 / bitnet dense decoders.
    Dense(Box<Transformer>),
    /// Qwen3.5 hybrid (Gated DeltaNet + gated full attention).
    Hybrid(Box<qwen35::Qwen35>),
    /// A forward pass that runs elsewhere (the `trit-cuda` crate's GPU model).
    External(Box<dyn ExternalNet>),
}

/// How a device's decoding loop picks each token ([`ExternalNet::decode_on_device`]).
#[derive(Clone, Debug, PartialEq)]
pub enum DevicePick {
    /// The row's argmax (greedy; the lowest id among equal logits).
    Argmax,
    /// The host sampler's rule on the row's `top_k` best candidates
    /// ([`Sampler::sample_top`](crate::sample::Sampler::sample_top)): top-p and min-p on the
    /// untempered probabilities, then temperature and one draw of the sampler's xoshiro256**
    /// generator, continued from `rng` ([`Rng::state`](crate::sample::rng::Rng::state)).
    Sample {
        temperature: f32,
        top_k: usize,
        top_p: f32,
        min_p: f32,
        rng: [u64; 4],
    },
}

/// What a device's decoding loop did ([`ExternalNet::decode_on_device`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLoopRun {
    /// Tokens fed and kept in the cache: `first`, then the accepted tokens in order (all of
    /// them but `pending`).
    pub fed: usize,
    /// The last accepted token, when the step budget ran out before it could be fed.
    pub pending: Option<u32>,
}

/// A network computed outside this crate (on a GPU), behind the same `Model` so sessions,
/// generation, chat and the benchmark drive it unchanged. The caches it gets hold positions
/// only (`KvCache` rows of width 0): the backend keeps keys and values in its own memory;
/// `forward` runs `tokens` at positions `cache.len()..` for one sequence at a time and must
/// `advance` the cache, like the CPU networks.
///
/// A backend that can also run several sequences together implements `forward_batch` and
/// `max_sequences`: each sequence's keys/values then live in a device slot the cache owns
/// ([`KvCache::device_slot`]), which the backend attaches on the sequence's first batched call.
pub trait ExternalNet: Send + Sync {
    fn config(&self) -> &ModelConfig;
    fn forward(&self, tokens: &[u32], cache: &mut KvCache, which: Logits) -> Result<Vec<f32>>;

    /// `forward` with the logits lent to `read` rather than returned: a device backend passes
    /// the page-locked buffer it copied them into, saving a copy of the whole row per token
    /// (what `trit bench` does; llama.cpp's decode also leaves them in its page-locked output
    /// buffer). By default: through `forward`.
    fn forward_read(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<()> {
        read(&self.forward(tokens, cache, which)?);
        Ok(())
    }

    fn weight_bytes(&self) -> usize;
    fn bytes_per_token(&self) -> usize;

    /// The final-normed hidden states (`hidden` floats per row `which` asks for) of `tokens` as
    /// a sequence of their own from position 0, on scratch keys/values — what embeddings pool.
    /// By default: not offered.
    fn hidden_states(&self, tokens: &[u32], which: Logits) -> Result<Vec<f32>> {
        let _ = (tokens, which);
        Err(crate::Error::Unsupported(
            "hidden states (embeddings) of this GPU model: load the model on the CPU for them"
                .into(),
        ))
    }

    /// Sequences one `forward_batch` call may carry (and that may own slots at once).
    fn max_sequences(&self) -> usize {
        1
    }

    /// `forward` of one sampled token for a caller that samples from its `k` best candidates
    /// (`Session::step_top`): the row may come back as those candidates and the row's
    /// normalizer ([`RowLogits::Top`]) instead of every logit, so a device backend copies a
    /// few hundred bytes per token instead of the vocabulary. By default: the full row.
    fn forward_top(&self, tokens: &[u32], cache: &mut KvCache, k: usize) -> Result<RowLogits> {
        let _ = k;
        Ok(RowLogits::Full(self.forward(
            tokens,
            cache,
            Logits::Last,
        )?))
    }

    /// Decoding with the device choosing each next token itself (by `pick`, fed straight into
    /// the next step, several steps in flight, no host round trip between them): feeds `first`
    /// at position `cache.len()`, then offers each token it produces to `accept`, in order,
    /// with whether picking it drew from the generator. A token `accept` refuses is not fed, and
    /// steps the device already ran past it are dropped; at most `max_steps` tokens are fed.
    /// `stop`: tokens `accept` always refuses (end of sequence), which the device may act on
    /// itself (a hybrid's state then stays where the fed tokens end). The cache advances by
    /// [`DeviceLoopRun::fed`]. `Ok(None)`: not supported, nothing ran (the caller steps token by
    /// token). By default: not supported.
    fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        max_steps: usize,
        pick: &DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<DeviceLoopRun>> {
        let _ = (first, cache, max_steps, pick, stop, accept);
        Ok(None)
    }

    /// Whether `decode_on_device` also runs a cache that owns a batched slot
    /// ([`KvCache::device_slot`]; the scheduler's lone sequence). By default not: such caches
    /// never reach it.
    fn loops_on_slots(&self) -> bool {
        false
    }

    /// Gives `dst` (a new sequence's empty cache, without a slot yet) a device slot holding the
    /// keys/values of the first `n` positions of `src` (a running sequence's cache): sequences
    /// that run at the same time and share a prompt's beginning compute it once. `Ok(false)`:
    /// not done (not supported, or no slot free), `dst` unchanged. By default: not supported.
    fn copy_prefix(&self, src: &KvCache, dst: &mut KvCache, n: usize) -> Result<bool> {
        let _ = (src, dst, n);
        Ok(false)
    }

    /// Several sequences in one pass, logits in `seqs` order (as
    /// [`Transformer::forward_batch`]). By default: one sequence, through `forward`.
    fn forward_batch(&self, seqs: &mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        match seqs {
            [s] => Ok(vec![self.forward(s.tokens, s.cache, s.logits)?]),
            _ => Err(crate::Error::Unsupported(
                "batched decoding on this device (one sequence at a time)".into(),
            )),
        }
    }

    /// `forward_batch` for callers that sample: where `want_top[i]` is set, sequence `i`'s row
    /// may come back as its `k` best candidates and the row's normalizer
    /// ([`RowLogits::Top`]) instead of every logit, so a device backend copies a few hundred
    /// bytes per sequence instead of the vocabulary. A backend returns a full row wherever it
    /// cannot give exactly that (a prompt's rows, a row whose normalizer is not finite). By
    /// default: every row in full, through `forward_batch`.
    fn forward_batch_top(
        &self,
        seqs: &mut [BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> Result<Vec<RowLogits>> {
        let _ = (k, want_top);
        Ok(self
            .forward_batch(seqs)?
            .into_iter()
            .map(RowLogits::Full)
            .collect())
    }
}

/// A loaded model plus the worker pool its kernels run on.
pub struct Model {
    net: Net,
    pool: ThreadPool,
    /// How the caches it hands out store keys and values (f16 unless set).
    kv_types: KvTypes,
}

impl Model {
    pub fn load(files: &ModelFiles, threads: usize) -> Result<Self> {
        let cfg = &files.config;
        let src = files.weights.as_ref();
        if files.rotation.is_some() && cfg.arch != Arch::Qwen35 {
            return Err(crate::Error::Unsupported(format!(
                "a Hadamard-rotated {} model; trit applies the rotation to qwen35 models only",
                cfg.arch.name()
            )));
        }
        let net = match cfg.arch {
            Arch::Llama if cfg.bitnet => Net::Dense(Box::new(bitnet::load(cfg, src)?)),
            Arch::Llama => Net::Dense(Box::new(llama::load(cfg, src)?)),
            Arch::Qwen3 => Net::Dense(Box::new(qwen3::load(cfg, src)?)),
            Arch::Qwen35 => {
                let rot = rotation::Rotations::new(files.rotation.clone());
                Net::Hybrid(Box::new(qwen35::Qwen35::load(cfg, src, rot)?))
            }
        };
        Ok(Model {
            net,
            pool: ThreadPool::new(threads.max(1)),
            kv_types: KvTypes::default(),
        })
    }

    /// Wraps a network computed elsewhere (see [`ExternalNet`]).
    pub fn from_external(net: Box<dyn ExternalNet>) -> Self {
        Model {
            net: Net::External(net),
            pool: ThreadPool::new(1),
            kv_types: KvTypes::default(),
        }
    }

    /// `load`, then the LoRA adapter folder at `adapter` (mlx-lm or PEFT layout), if any:
    /// the one entry point every command uses, so `--adapter` means the same everywhere.
    pub fn load_with_adapter(
        files: &ModelFiles,
        threads: usize,
        adapter: Option<&std::path::Path>,
    ) -> Result<Self> {
        let mut model = Self::load(files, threads)?;
        if let Some(dir) = adapter {
            model.set_adapter(&lora::LoraAdapter::load(dir)?)?;
        }
        Ok(model)
    }

    /// Adds a LoRA adapter's side paths (llama/qwen3 models, unrotated qwen35 hybrids).
    pub fn set_adapter(&mut self, adapter: &lora::LoraAdapter) -> Result<()> {
        match &mut self.net {
            Net::Dense(n) => n.set_adapter(adapter),
            Net::Hybrid(n) => n.set_adapter(adapter),
            Net::External(_) => Err(crate::Error::Unsupported(
                "LoRA adapters on a GPU model (run the adapter with --device cpu, or fuse it \
                 with `trit convert --quantize --adapter`)"
                    .into(),
            )),
        }
    }

    pub fn config(&self) -> &ModelConfig {
        match &self.net {
            Net::Dense(n) => &n.config,
            Net::Hybrid(n) => &n.config,
            Net::External(n) => n.config(),
        }
    }

    pub fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Stores the keys and values of the caches made from now on as `types` (default: f16
    /// both; f32 keeps them exact; `q8_0` needs head dimensions that are multiples of 32). A
    /// device backend keeps its own and ignores this.
    pub fn set_kv_types(&mut self, types: KvTypes) -> Result<()> {
        if matches!(self.net, Net::External(_)) && types != KvTypes::F16 {
            // A device model keeps its keys and values on the device, in f16; a request for
            // another type must not be ignored silently.
            return Err(crate::Error::Unsupported(format!(
                "KV cache types {}/{} on a device: the GPU keeps keys and values in f16 \
                 (--cache-type-k/-v choose the CPU's cache)",
                types.k, types.v
            )));
        }
        let hd = self.config().head_dim;
        if !matches!(self.net, Net::External(_)) && !hd.is_multiple_of(types.granule()) {
            return Err(crate::Error::Unsupported(format!(
                "KV cache types {}/{} with head dimension {hd} (q8_0 stores blocks of {} values)",
                types.k,
                types.v,
                types.granule()
            )));
        }
        self.kv_types = types;
        Ok(())
    }

    /// [`set_kv_types`](Self::set_kv_types), by value.
    pub fn with_kv_types(mut self, types: KvTypes) -> Result<Self> {
        self.set_kv_types(types)?;
        Ok(self)
    }

    pub fn kv_types(&self) -> KvTypes {
        self.kv_types
    }

    /// The weights live on a device backend (`--device cuda`), not in this process's memory.
    pub fn runs_on_device(&self) -> bool {
        matches!(self.net, Net::External(_))
    }

    /// A cache for `n_ctx` positions; for hybrid models it also holds the recurrent state.
    pub fn new_cache(&self, n_ctx: usize) -> KvCache {
        match &self.net {
            Net::Dense(n) => n.new_cache(n_ctx).with_types(self.kv_types),
            Net::Hybrid(n) => n.new_cache(n_ctx).with_types(self.kv_types),
            Net::External(n) => KvCache::new(n.config().n_layers, 0, n_ctx),
        }
    }

    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, which: Logits) -> Result<Vec<f32>> {
        match &self.net {
            Net::Dense(n) => n.forward(&self.pool, tokens, cache, which),
            Net::Hybrid(n) => n.forward(&self.pool, tokens, cache, which),
            Net::External(n) => {
                if cache.device_slot().is_some() {
                    return Err(crate::Error::InvalidArgument(
                        "this cache's keys/values live in a batched device slot; run it \
                         through forward_batch"
                            .into(),
                    ));
                }
                n.forward(tokens, cache, which)
            }
        }
    }

    /// The final-normed hidden states (the LM head's input: `hidden` floats per row `which`
    /// asks for) of `tokens` run after what `cache` holds — what embeddings pool. A device
    /// model runs them as a sequence of their own (`cache` empty; it stays so) where its
    /// backend offers it ([`ExternalNet::hidden_states`]).
    pub fn hidden_states(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
    ) -> Result<Vec<f32>> {
        match &self.net {
            Net::Dense(n) => n.hidden_states(&self.pool, tokens, cache, which),
            Net::Hybrid(n) => n.hidden_states(&self.pool, tokens, cache, which),
            Net::External(_) if !cache.is_empty() => Err(crate::Error::InvalidArgument(
                "hidden states on a device model start from an empty cache".into(),
            )),
            Net::External(n) => n.hidden_states(tokens, which),
        }
    }

    /// [`forward`](Self::forward) with the logits lent to `read` (see
    /// [`ExternalNet::forward_read`]): a device model skips copying the row out of its
    /// page-locked buffer.
    pub fn forward_read(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        read: &mut dyn FnMut(&[f32]),
    ) -> Result<()> {
        match &self.net {
            Net::External(n) if cache.device_slot().is_none() => {
                n.forward_read(tokens, cache, which, read)
            }
            _ => {
                read(&self.forward(tokens, cache, which)?);
                Ok(())
            }
        }
    }

    /// Several sequences in one pass (weights read once for all); see
    /// [`Transformer::forward_batch`]. Hybrid models run the sequences one after another
    /// (a batched Gated DeltaNet step is not written yet), with the same results.
    /// [`forward`](Self::forward) of the last position for a caller that samples from the `k`
    /// best candidates: a device backend may answer with just those ([`RowLogits::Top`]); the
    /// CPU networks give the full row.
    pub fn forward_top(&self, tokens: &[u32], cache: &mut KvCache, k: usize) -> Result<RowLogits> {
        match &self.net {
            Net::External(n) if cache.device_slot().is_none() => n.forward_top(tokens, cache, k),
            _ => Ok(RowLogits::Full(self.forward(
                tokens,
                cache,
                Logits::Last,
            )?)),
        }
    }

    /// [`ExternalNet::decode_on_device`] where the backend has it; `Ok(None)` on the CPU
    /// networks, for a cache in a batched device slot unless the backend
    /// [loops on slots](ExternalNet::loops_on_slots), and where the backend lacks it.
    pub fn decode_on_device(
        &self,
        first: u32,
        cache: &mut KvCache,
        max_steps: usize,
        pick: &DevicePick,
        stop: &[u32],
        accept: &mut dyn FnMut(u32, bool) -> bool,
    ) -> Result<Option<DeviceLoopRun>> {
        match &self.net {
            Net::External(n) if cache.device_slot().is_none() || n.loops_on_slots() => {
                n.decode_on_device(first, cache, max_steps, pick, stop, accept)
            }
            _ => Ok(None),
        }
    }

    pub fn forward_batch(&self, seqs: &mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>> {
        match &self.net {
            Net::Dense(n) => n.forward_batch(&self.pool, seqs),
            Net::Hybrid(n) => n.forward_batch(&self.pool, seqs),
            Net::External(n) => {
                if seqs.len() > n.max_sequences() {
                    return Err(crate::Error::InvalidArgument(format!(
                        "{} sequences in one batch; this device runs at most {} together",
                        seqs.len(),
                        n.max_sequences()
                    )));
                }
                n.forward_batch(seqs)
            }
        }
    }

    /// [`forward_batch`](Self::forward_batch) whose rows may come back as their `k` best
    /// candidates where `want_top` says so (see [`ExternalNet::forward_batch_top`]); the CPU
    /// networks return every row in full.
    pub fn forward_batch_top(
        &self,
        seqs: &mut [BatchSeq<'_>],
        k: usize,
        want_top: &[bool],
    ) -> Result<Vec<RowLogits>> {
        if want_top.len() != seqs.len() {
            return Err(crate::Error::InvalidArgument(format!(
                "{} candidate flags for {} sequences",
                want_top.len(),
                seqs.len()
            )));
        }
        match &self.net {
            Net::External(n) if want_top.iter().any(|&w| w) => {
                if seqs.len() > n.max_sequences() {
                    return Err(crate::Error::InvalidArgument(format!(
                        "{} sequences in one batch; this device runs at most {} together",
                        seqs.len(),
                        n.max_sequences()
                    )));
                }
                n.forward_batch_top(seqs, k, want_top)
            }
            _ => Ok(self
                .forward_batch(seqs)?
                .into_iter()
                .map(RowLogits::Full)
                .collect()),
        }
    }

    /// Sequences `forward_batch` accepts at once (unbounded on the CPU; a device backend has
    /// a fixed number of KV slots).
    pub fn max_sequences(&self) -> usize {
        match &self.net {
            Net::External(n) => n.max_sequences(),
            _ => usize::MAX,
        }
    }

    /// [`ExternalNet::copy_prefix`] on a device backend; false on the CPU, whose caches share
    /// host blocks instead.
    pub fn copy_device_prefix(&self, src: &KvCache, dst: &mut KvCache, n: usize) -> Result<bool> {
        match &self.net {
            Net::External(net) => net.copy_prefix(src, dst, n),
            _ => Ok(false),
        }
    }

    /// Whether the caches' keys/values are host memory that sequences may share (the
    /// scheduler's prefix reuse). Not for a device backend: its keys/values live in per-sequence
    /// device slots, which a shared host block cannot fill.
    pub fn shares_prefixes(&self) -> bool {
        !matches!(self.net, Net::External(_))
    }

    pub fn weight_bytes(&self) -> usize {
        match &self.net {
            Net::Dense(n) => n.weight_bytes(),
            Net::Hybrid(n) => n.weight_bytes(),
            Net::External(n) => n.weight_bytes(),
        }
    }

    pub fn bytes_per_token(&self) -> usize {
        match &self.net {
            Net::Dense(n) => n.bytes_per_token(),
            Net::Hybrid(n) => n.bytes_per_token(),
            Net::External(n) => n.bytes_per_token(),
        }
    }
}

/// One sequence through a batched pass `run` (an architecture's forward or hidden-state pass):
/// its rows, or nothing when `run` returned no sequence.
fn one_sequence(
    tokens: &[u32],
    cache: &mut KvCache,
    which: Logits,
    run: impl FnOnce(&mut [BatchSeq<'_>]) -> Result<Vec<Vec<f32>>>,
) -> Result<Vec<f32>> {
    let mut seqs = [BatchSeq {
        tokens,
        cache,
        logits: which,
    }];
    Ok(run(&mut seqs)?.pop().unwrap_or_default())
}

/// Refuses an input no forward pass can run: no tokens, no room left in the cache, or ids outside
/// the vocabulary. Shared by every architecture so the errors read the same.
pub fn check_input(tokens: &[u32], cache: &KvCache, vocab: usize) -> Result<()> {
    let n = tokens.len();
    if n == 0 {
        return Err(crate::Error::InvalidArgument(
            "no tokens to evaluate".into(),
        ));
    }
    if cache.len() + n > cache.capacity() {
        return Err(crate::Error::ContextOverflow {
            n_prompt: cache.len() + n,
            n_ctx: cache.capacity(),
        });
    }
    if let Some(&tok) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(crate::Error::InvalidArgument(format!(
            "token id {tok} is outside the vocabulary ({vocab} rows)"
        )));
    }
    Ok(())
}

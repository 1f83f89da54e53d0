//! CUDA backend of trit: dense llama/qwen3 ternary models decoding on an NVIDIA GPU.
//!
//! The driver API and NVRTC are loaded at run time (cudarc's dynamic loading), so this crate
//! builds where there is no CUDA toolkit and no GPU; on such a machine `CudaModel::load`
//! returns an error saying what is missing. The kernels (`src/kernels/*.cu`) are CUDA C
//! compiled by NVRTC for the GPU's architecture on first use and cached on disk
//! (`$TRIT_CUDA_CACHE`, else `~/.cache/trit/cuda`).
//!
//! What runs on the GPU: the whole decode step (embedding lookup, fused RMSNorm + int8
//! quantization, ternary GEMV with dp4a over a 2-bit layout, QK-norm + RoPE + KV append,
//! flash-decoding attention over an f16 cache, SwiGLU + quantization, residual adds fused into
//! the GEMV, LM head), captured once in a CUDA graph and replayed per token. Prompts of more
//! than one token take the batched prefill (`prefill.rs`): chunks of up to 512 tokens per
//! layer, the matrix products as an int8 tensor-core GEMM over the same 2-bit layout, causal
//! attention over the cache for the chunk's query rows on the tensor cores (`flash.rs`), the
//! LM head only where logits are asked for.
//!
//! Several sequences at once (the server's continuous batching) take the batched path
//! (`batch.rs`): each sequence's keys/values in a GPU slot its cache owns, prompts through the
//! batched prefill into the slot, and one decode step for all sequences with the GEMM over B
//! token rows.
//!
//! Qwen3.5 hybrids (Gated DeltaNet + gated full attention) take their own decode step
//! (`hybrid.rs`, `hybrid/step.rs`), Bonsai 2's Hadamard-rotated files included (`rotation.rs`).

mod attention_o;
mod batch;
pub mod batch_gemm;
mod batch_rows;
mod buffers;
mod decode_attention;
pub mod device;
pub mod flash;
pub mod gemm;
pub mod gemv;
mod graph;
pub mod greedy;
pub mod hybrid;
mod hybrid_weights;
mod launch;
mod mapped;
pub mod model;
mod options;
mod persist;
mod prefill;
pub mod repack;
pub mod rotation;
mod sub_norm;
pub mod topk;
pub mod trace;
pub mod weights;

pub use model::{load_model, CudaModel, CudaOptions, FusedSet};

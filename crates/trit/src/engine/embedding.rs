//! Sentence embeddings from a language model (`trit serve`'s `/v1/embeddings`, llama.cpp's
//! `--embeddings --pooling`): the final-normed hidden states of the prompt's tokens — the LM
//! head's input, llama.cpp's `result_norm` — pooled into one vector and L2-normalized, as
//! OpenAI's endpoint returns them. Checked against llama.cpp's embeddings of the default model
//! (`tools/ref_embeddings.py`, `tests/embeddings.rs`).

use crate::model::{Logits, Model};
use crate::{Error, Result};

/// How one vector is made from the hidden states of every token (llama.cpp's `--pooling`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Pooling {
    /// Their average (the default here; llama.cpp takes it from the file, which a chat model
    /// leaves unset).
    #[default]
    Mean,
    /// The last token's state: the one that has seen the whole text.
    Last,
    /// The first token's state (encoder models' [CLS]).
    Cls,
}

impl Pooling {
    pub fn parse(s: &str) -> Result<Pooling> {
        match s {
            "mean" => Ok(Pooling::Mean),
            "last" => Ok(Pooling::Last),
            "cls" => Ok(Pooling::Cls),
            other => Err(Error::InvalidArgument(format!(
                "pooling '{other}' (known: mean, last, cls)"
            ))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Last => "last",
            Pooling::Cls => "cls",
        }
    }
}

/// The L2-normalized `pooling` of the final-normed hidden states of `tokens` (`hidden`
/// floats), computed on a cache of their own.
pub fn embed(model: &Model, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>> {
    if tokens.is_empty() {
        return Err(Error::InvalidArgument(
            "nothing to embed: the input has no tokens".into(),
        ));
    }
    let d = model.config().hidden;
    let mut cache = model.new_cache(tokens.len());
    // The last token's state needs only the last row; the others read every row.
    let which = match pooling {
        Pooling::Last => Logits::Last,
        Pooling::Mean | Pooling::Cls => Logits::All,
    };
    let states = model.hidden_states(tokens, &mut cache, which)?;
    let mut v = match pooling {
        Pooling::Last | Pooling::Cls => states[..d].to_vec(),
        Pooling::Mean => {
            let mut sum = vec![0f64; d];
            for row in states.chunks_exact(d) {
                for (s, &x) in sum.iter_mut().zip(row) {
                    *s += x as f64;
                }
            }
            let n = (states.len() / d) as f64;
            sum.iter().map(|s| (s / n) as f32).collect()
        }
    };
    let norm = v.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if !norm.is_finite() || norm == 0.0 {
        return Err(Error::InvalidArgument(format!(
            "the pooled hidden state has norm {norm}; it cannot be normalized"
        )));
    }
    v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
    Ok(v)
}

//! One error type for the whole library. Every user-facing failure (broken file,
//! unknown type, prompt too long, bad template) is a variant with a message that
//! names the offending thing; the library never panics on bad input.

use thiserror::Error as ThisError;

#[derive(Debug, ThisError)]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A file whose bytes do not follow its format (bad magic, truncated, offsets out of range).
    #[error("{0}")]
    Format(String),
    #[error("tensor '{tensor}' has unknown ggml type id {id} (trit knows: {known})")]
    UnknownTensorType {
        tensor: String,
        id: u32,
        known: String,
    },
    #[error("missing tensor '{0}'")]
    MissingTensor(String),
    #[error("tensor '{tensor}' has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        tensor: String,
        found: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("config: {0}")]
    Config(String),
    /// Same wording as llama.cpp's server, which clients parse.
    #[error("request ({n_prompt} tokens) exceeds the available context size ({n_ctx} tokens), try increasing it")]
    ContextOverflow { n_prompt: usize, n_ctx: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

//! `WeightSource` over a GGUF file, and `open` for `.gguf` paths: config from metadata,
//! tokenizer and chat template from `tokenizer.*`, sampling defaults from
//! `general.sampling.*`. GGUF tensor names are already the canonical names.

use super::gguf::GgufFile;
use super::{
    GenerationDefaults, ModelConfig, ModelFiles, OpenOptions, TensorData, TensorView,
    TokenizerSource, WeightSource,
};
use crate::quant::GgmlType;
use crate::{Error, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Tensors of one GGUF file; views borrow from the shared map.
pub struct GgufSource {
    file: Arc<GgufFile>,
    description: String,
}

impl GgufSource {
    pub fn new(file: Arc<GgufFile>) -> GgufSource {
        let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
        for t in file.tensors() {
            *counts.entry(t.ty.name()).or_default() += 1;
        }
        let types: Vec<String> = counts.iter().map(|(t, n)| format!("{t} ×{n}")).collect();
        let description = format!(
            "GGUF v{}, {} tensors ({})",
            file.version(),
            file.tensors().len(),
            types.join(", ")
        );
        GgufSource { file, description }
    }

    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }
}

impl WeightSource for GgufSource {
    fn tensor(&self, name: &str) -> Result<Option<TensorView<'_>>> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        let bytes = self.file.tensor_data(info);
        let data = match info.ty {
            GgmlType::F32 => TensorData::F32(bytes),
            GgmlType::F16 => TensorData::F16(bytes),
            GgmlType::BF16 => TensorData::BF16(bytes),
            ty => TensorData::Ggml { ty, bytes },
        };
        Ok(Some(TensorView {
            name: name.to_string(),
            shape: info.shape.clone(),
            data,
        }))
    }

    fn tensor_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.file.tensors().iter().map(|t| t.name.clone()).collect();
        v.sort();
        v
    }

    fn describe(&self) -> String {
        self.description.clone()
    }

    fn release(&self, name: &str) {
        if let Some(info) = self.file.tensor(name) {
            self.file.release_tensor(info);
        }
    }
}

/// Refuses rotated (Bonsai 2) files: running them without the Hadamard transform gives
/// fluent-looking garbage, so a half-understood file must not load (formats.md §8.3).
fn generation_defaults(file: &GgufFile) -> GenerationDefaults {
    let f = |k: &str| file.get_f32(&format!("general.sampling.{k}"));
    let d = GenerationDefaults {
        temperature: f("temp"),
        top_k: file.get_u64("general.sampling.top_k").map(|v| v as usize),
        top_p: f("top_p"),
        min_p: f("min_p"),
        repetition_penalty: f("penalty_repeat"),
        source: String::new(),
    };
    let any = d.temperature.is_some()
        || d.top_k.is_some()
        || d.top_p.is_some()
        || d.min_p.is_some()
        || d.repetition_penalty.is_some();
    GenerationDefaults {
        source: if any {
            "gguf general.sampling.*"
        } else {
            "none"
        }
        .into(),
        ..d
    }
}

/// Opens a GGUF model file.
pub(super) fn open_gguf(path: &Path, _options: OpenOptions) -> Result<ModelFiles> {
    let file = Arc::new(GgufFile::open(path)?);
    let rotation = super::prism_gguf::read(&file)?;
    let mut config = ModelConfig::from_gguf(&file)?;
    let source = GgufSource::new(file.clone());
    config.check_tensors(&source)?;
    if file.get("tokenizer.ggml.tokens").is_none() {
        return Err(Error::Tokenizer(format!(
            "{}: no tokenizer.ggml.tokens (the GGUF carries no vocabulary)",
            path.display()
        )));
    }
    let chat_template = file.get_str("tokenizer.chat_template").map(str::to_string);
    let generation = generation_defaults(&file);
    Ok(ModelFiles {
        config,
        weights: Box::new(source),
        tokenizer: TokenizerSource::Gguf(file),
        chat_template,
        generation,
        path: path.to_path_buf(),
        format_name: match &rotation {
            Some(r) => format!("GGUF Bonsai 2 ({})", r.describe()),
            None => "GGUF".into(),
        },
        rotation,
    })
}

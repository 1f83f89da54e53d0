//! Models the GPU backend does not run are refused by name before any GPU work (so this runs
//! in CI, without a GPU): a BitNet b1.58 file would otherwise decode as another network (the
//! CUDA chain has no sub-norms and only SwiGLU).

use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit_cuda::{load_model, CudaOptions};

#[test]
fn a_bitnet_model_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let f = OutFormat::parse("tq2_0").unwrap();
    let preset = Preset::by_name("tiny-bitnet").unwrap();
    generate(&preset, 0, dir.path(), &[f], &TokenizerAssets::Placeholder).unwrap();
    let files = trit::format::open(&dir.path().join(f.file_name())).unwrap();
    let err = load_model(&files, &CudaOptions::new(64))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("BitNet"), "{err}");
}

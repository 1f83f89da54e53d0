//! The same random ternary weights written as an MLX 2-bit folder, GGUF PQ2_0, PTQ1_0, TQ2_0,
//! TQ1_0, Q2_0 (g64) and an unpacked F16 folder must give the same logits in trit.
//! Runs at the exact (Reference) kernel level so any loader or repack bug shows as a mismatch
//! well above float rounding; the fast kernels are compared to the reference separately.

use std::sync::Arc;
use trit::engine::Session;
use trit::format::testgen::{generate, OutFormat, Preset, TokenizerAssets};
use trit::kernels::{set_level, KernelLevel};
use trit::model::Model;

const PROMPT: [u32; 14] = [
    151644, 872, 198, 9707, 11, 847, 5562, 374, 18838, 151645, 198, 151644, 77091, 198,
];

fn logits(path: &std::path::Path) -> Vec<f32> {
    let files = trit::format::open(path).unwrap();
    let model = Arc::new(Model::load(&files, 2).unwrap());
    let mut s = Session::new(model, 64);
    s.prefill(&PROMPT).unwrap()
}

#[test]
fn every_format_gives_the_same_logits() {
    set_level(KernelLevel::Reference).unwrap();
    for preset in ["tiny", "tiny-llama"] {
        let dir = tempfile::tempdir().unwrap();
        let formats: Vec<OutFormat> = ["mlx", "pq2_0", "ptq1_0", "tq2_0", "tq1_0", "q2_0", "f16"]
            .iter()
            .map(|f| OutFormat::parse(f).unwrap())
            .collect();
        let p = Preset::by_name(preset).unwrap();
        generate(&p, 0, dir.path(), &formats, &TokenizerAssets::Placeholder).unwrap();
        let reference = logits(&dir.path().join("mlx"));
        assert!(reference.iter().all(|x| x.is_finite()));
        let spread = reference.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(spread > 0.1, "{preset}: logits are degenerate");
        for f in &formats[1..] {
            let other = logits(&dir.path().join(f.file_name()));
            let max_diff = reference
                .iter()
                .zip(&other)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            // Same weights, same f32 math: only summation-order rounding may differ.
            assert!(
                max_diff < 1e-4 * spread.max(1.0),
                "{preset} {}: max |Δ| {max_diff} vs MLX",
                f.file_name()
            );
        }
    }
}

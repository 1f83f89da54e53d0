//! Binary weights (1-bit Bonsai: ±d per group) load into the ternary kernels (binary is a subset
//! of ternary): GGUF `Q1_0` gives the logits of the same weights as F32 and holds its matrices
//! in ~2 bits per weight, not as dense f32; `trit convert` repacks it losslessly; an MLX 1-bit
//! pack reads as the same weights as a 2-bit pack of them.

use trit::convert::{convert, ConvertOptions, Target};
use trit::format::testgen::binary::{mlx_1bit_twins, q1_0_twins, small_vocab_tiny};
use trit::format::testgen::{generate, OutFormat, TokenizerAssets};
use trit::kernels::{set_level, KernelLevel};
use trit::model::{Logits, Model};

#[test]
fn q1_0_runs_on_the_ternary_kernels_with_the_dense_models_logits() {
    set_level(KernelLevel::Reference).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (bin, dense) = q1_0_twins(dir.path()).unwrap();
    let load = |p: &std::path::Path| Model::load(&trit::format::open(p).unwrap(), 2).unwrap();
    let (b, d) = (load(&bin), load(&dense));
    // Dense f32 is 32 bits per weight; the ternary layout ~2 (plus scales).
    assert!(
        b.weight_bytes() * 8 < d.weight_bytes(),
        "{} vs {}",
        b.weight_bytes(),
        d.weight_bytes()
    );
    let tokens = [3u32, 17, 99, 512, 7, 1024, 5];
    let (mut cb, mut cd) = (b.new_cache(16), d.new_cache(16));
    let lb = b.forward(&tokens, &mut cb, Logits::All).unwrap();
    let ld = d.forward(&tokens, &mut cd, Logits::All).unwrap();
    let worst = lb
        .iter()
        .zip(&ld)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1.0))
        .fold(0f32, f32::max);
    assert!(worst < 1e-4, "largest relative difference {worst}");

    // `trit convert` repacks Q1_0 into a ternary type without loss (binary ⊂ ternary, one scale
    // per 128 either way): the PQ2_0 file computes the same logits as the Q1_0 one, exactly.
    let out = dir.path().join("repacked.gguf");
    let opts = ConvertOptions {
        target: Target::parse("pq2_0").unwrap(),
        allow_lossy: false,
    };
    let report = convert(&bin, &out, &opts, &mut |_, _, _| {}).unwrap();
    assert!(!report.lossy);
    assert!(
        report.tensors.iter().any(|t| t.from.contains("Q1_0")),
        "{report:?}"
    );
    let p = load(&out);
    let mut cp = p.new_cache(16);
    assert_eq!(p.forward(&tokens, &mut cp, Logits::All).unwrap(), lb);
}

/// 1-bit Bonsai's MLX pack reads as the same ternary weights as a 2-bit pack of the same
/// binary values (the 2-bit reader is the one checked against mlx-lm): identical logits.
#[test]
fn a_one_bit_mlx_pack_reads_as_its_binary_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (two, one) = mlx_1bit_twins(dir.path()).unwrap();
    let load = |p: &std::path::Path| Model::load(&trit::format::open(p).unwrap(), 2).unwrap();
    let (a, b) = (load(&two), load(&one));
    assert_eq!(a.weight_bytes(), b.weight_bytes());
    let tokens = [3u32, 17, 99, 512, 7];
    let (mut ca, mut cb) = (a.new_cache(8), b.new_cache(8));
    assert_eq!(
        a.forward(&tokens, &mut ca, Logits::All).unwrap(),
        b.forward(&tokens, &mut cb, Logits::All).unwrap()
    );
}

/// `trit info`'s memory line (`model::weights::loaded_bytes` summed over a file's tensors,
/// without loading) is what the loaded model holds, for every format, base-3 and binary ones
/// included (their files are smaller than their 2-bit layout in memory). The estimate takes one
/// scale per group of the file's type; the loader keeps fewer where neighbouring groups share
/// one (as these generated models' do, per 256 columns), so the loaded matrices lie between the
/// estimate without its ternary scales and the estimate. (`weight_bytes` counts matrices only.)
#[test]
fn the_memory_estimate_matches_the_loaded_weights() {
    use trit::format::TensorData;
    let dir = tempfile::tempdir().unwrap();
    let formats = ["mlx", "q2_0", "pq2_0", "ptq1_0", "tq2_0", "tq1_0", "f16"];
    let outs: Vec<OutFormat> = formats
        .iter()
        .map(|f| OutFormat::parse(f).unwrap())
        .collect();
    generate(
        &small_vocab_tiny().unwrap(),
        3,
        dir.path(),
        &outs,
        &TokenizerAssets::Placeholder,
    )
    .unwrap();
    let mut paths: Vec<std::path::PathBuf> = outs
        .iter()
        .map(|f| dir.path().join(f.file_name()))
        .collect();
    let twins = dir.path().join("twins");
    std::fs::create_dir_all(&twins).unwrap();
    paths.push(q1_0_twins(&twins).unwrap().0);
    paths.push(mlx_1bit_twins(&twins).unwrap().1);
    for path in paths {
        let files = trit::format::open(&path).unwrap();
        let (mut estimate, mut scales) = (0, 0);
        for name in files.weights.tensor_names() {
            let view = files.weights.tensor(&name).unwrap().unwrap();
            if view.shape.len() != 2 {
                continue;
            }
            estimate += trit::model::weights::loaded_bytes(&view);
            let (rows, cols) = (view.shape[0].div_ceil(16) * 16, view.shape[1]);
            scales += match view.data {
                TensorData::Ggml { ty, .. } if ty.reads_as_ternary() => {
                    rows * cols / ty.block_size().min(256) * 2
                }
                TensorData::Mlx { group_size, .. } => rows * cols / group_size * 2,
                _ => 0,
            };
        }
        let loaded = Model::load(&files, 1).unwrap().weight_bytes();
        assert!(
            estimate - scales <= loaded && loaded <= estimate,
            "{}: estimate {estimate} ({scales} of scales), loaded {loaded}",
            path.display()
        );
    }
}

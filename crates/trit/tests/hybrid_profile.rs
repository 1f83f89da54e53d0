//! `trit bench --profile` on a hybrid: the Qwen3.5 graph times its ops like the dense one. A
//! prompt through the generated `tiny-qwen35` (GGUF Q2_0, plain and Hadamard-rotated) records
//! each matrix group with its multiply-adds, the DeltaNet mixer once per linear-attention layer,
//! and between them nearly all of the forward's time. (Its own binary: the counters are global.)

mod common;

use std::time::Instant;
use trit::model::{Logits, Model};
use trit::profile::{self, Op};

#[test]
fn hybrid_forward_records_every_op_group() {
    for preset in ["tiny-qwen35", "tiny-prism"] {
        let (_dir, files, p) = common::hybrid_q2_0(preset, 4);
        let hy = files.config.hybrid.clone().unwrap();
        let model = Model::load(&files, 2).unwrap();
        let tokens: Vec<u32> = (0..24).map(|i| (i * 7 + 3) % p.vocab as u32).collect();
        let mut cache = model.new_cache(64);

        profile::reset();
        profile::set_enabled(true);
        let start = Instant::now();
        model.forward(&tokens, &mut cache, Logits::Last).unwrap();
        let wall = start.elapsed().as_nanos() as u64;
        profile::set_enabled(false);
        let ops = profile::snapshot();

        let of = |op: Op| ops[op as usize];
        let (n, linear, full) = (
            tokens.len() as u64,
            hy.n_linear() as u64,
            hy.n_full() as u64,
        );
        let layers = linear + full;
        let d = files.config.hidden as u64;
        assert_eq!(of(Op::DeltaRule).calls, linear, "{preset}");
        assert_eq!(of(Op::Attention).calls, full, "{preset}");
        assert_eq!(
            of(Op::MatGate).calls,
            layers,
            "{preset}: gate and up in one call"
        );
        assert_eq!(of(Op::MatDown).calls, layers, "{preset}");
        assert_eq!(of(Op::MatO).calls, layers, "{preset}: out or o");
        assert_eq!(of(Op::MatQ).calls, layers, "{preset}: q/k/v in one call");
        // gate‖up: 2·ffn rows of `hidden` columns for each token of each layer.
        let ffn = files.config.ffn as u64;
        assert_eq!(of(Op::MatGate).work, 2 * ffn * d * n * layers, "{preset}");
        assert!(of(Op::MatGates).work > 0, "{preset}: z and a/b");
        assert_eq!(
            of(Op::MatHead).calls,
            1,
            "{preset}: the last token's logits"
        );
        let timed: u64 = ops.iter().map(|o| o.nanos).sum();
        assert!(
            timed >= wall / 2,
            "{preset}: the ops account for {timed} of {wall} ns"
        );
    }
}

//! Several hybrid (Qwen3.5) sequences in one `forward_batch` — what `trit serve` runs each
//! scheduler step — give each sequence's logits as it alone would, on the generated tiny-qwen35
//! and its Hadamard-rotated form tiny-prism (regrouped ssm_out columns): a decode row after a
//! history, a prompt with every row's logits and a first token, then one more step of each from
//! the caches the batch left (recurrent states and KV rows in their own places).

mod common;

use trit::model::{BatchSeq, KvCache, Logits, Model};

fn max_rel(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

#[test]
fn batched_hybrid_sequences_match_each_alone() {
    for preset in ["tiny-qwen35", "tiny-prism"] {
        let (_dir, files, p) = common::hybrid_q2_0(preset, 9);
        let model = Model::load(&files, 2).unwrap();
        let vocab = p.vocab as u32;
        let ids =
            |seed: u32, n: u32| -> Vec<u32> { (0..n).map(|i| (seed + 13 * i) % vocab).collect() };
        let (history, next) = (ids(1, 5), ids(7, 1));
        let (prompt, first) = (ids(3, 7), ids(11, 1));

        // Alone: each sequence in its own cache.
        let alone = |pre: &[u32], toks: &[u32], which: Logits| -> (Vec<f32>, KvCache) {
            let mut c = model.new_cache(32);
            if !pre.is_empty() {
                model.forward(pre, &mut c, Logits::Last).unwrap();
            }
            let l = model.forward(toks, &mut c, which).unwrap();
            (l, c)
        };
        let (la, mut ca) = alone(&history, &next, Logits::Last);
        let (lb, mut cb) = alone(&[], &prompt, Logits::All);
        let (lc, mut cc) = alone(&[], &first, Logits::Last);

        // Together: the same three in one pass.
        let mut ta = model.new_cache(32);
        model.forward(&history, &mut ta, Logits::Last).unwrap();
        let (mut tb, mut tc) = (model.new_cache(32), model.new_cache(32));
        let together = {
            let mut seqs = [
                BatchSeq {
                    tokens: &next,
                    cache: &mut ta,
                    logits: Logits::Last,
                },
                BatchSeq {
                    tokens: &prompt,
                    cache: &mut tb,
                    logits: Logits::All,
                },
                BatchSeq {
                    tokens: &first,
                    cache: &mut tc,
                    logits: Logits::Last,
                },
            ];
            model.forward_batch(&mut seqs).unwrap()
        };
        assert_eq!(together[1].len(), prompt.len() * p.vocab, "{preset}");
        // Stacked rows take the small-batch kernels, whose partial sums add in another order.
        for (got, want) in together.iter().zip([&la, &lb, &lc]) {
            let e = max_rel(got, want);
            assert!(e < 1e-3, "{preset}: batched logits differ by {e}");
        }
        assert_eq!((ta.len(), tb.len(), tc.len()), (6, 7, 1), "{preset}");

        // One more step each, from the caches the batch left and from the lone ones.
        let step = ids(5, 1);
        for (t, c) in [(&mut ta, &mut ca), (&mut tb, &mut cb), (&mut tc, &mut cc)] {
            let got = model.forward(&step, t, Logits::Last).unwrap();
            let want = model.forward(&step, c, Logits::Last).unwrap();
            let e = max_rel(&got, &want);
            assert!(
                e < 1e-3,
                "{preset}: the step after the batch differs by {e}"
            );
        }
    }
}

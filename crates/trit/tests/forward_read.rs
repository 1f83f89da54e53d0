//! `Model::forward_read`: the logits lent to a reader instead of returned (what `trit bench`
//! uses, so that a GPU model hands over its page-locked row rather than copying it again).
//! The row is the one `forward` returns, on the CPU models and through a device backend's own
//! `forward_read`.

mod common;

use std::sync::Mutex;
use trit::format::config::ModelConfig;
use trit::model::{ExternalNet, KvCache, Logits, Model};
use trit::tokenizer::Tokenizer;

/// A device stand-in that only lends its rows, as the GPU models do: its `forward` fails, so a
/// `Model::forward_read` that went through `forward` would fail too. Its rows are the CPU
/// engine's, from a cache of its own.
struct Lender {
    inner: Model,
    cache: Mutex<KvCache>,
}

impl ExternalNet for Lender {
    fn config(&self) -> &ModelConfig {
        self.inner.config()
    }
    fn forward(&self, _: &[u32], _: &mut KvCache, _: Logits) -> trit::Result<Vec<f32>> {
        Err(trit::Error::Unsupported(
            "this stand-in only lends rows".into(),
        ))
    }
    fn forward_read(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        which: Logits,
        read: &mut dyn FnMut(&[f32]),
    ) -> trit::Result<()> {
        let mut own = self.cache.lock().unwrap();
        let row = self.inner.forward(tokens, &mut own, which)?;
        cache.advance(tokens.len());
        read(&row);
        Ok(())
    }
    fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.inner.bytes_per_token()
    }
}

#[test]
fn forward_read_lends_the_rows_forward_returns() {
    let files = common::default_model_files();
    let tok = Tokenizer::from_source(&files.tokenizer).unwrap();
    let cpu = Model::load(&files, 2).unwrap();
    let inner = Model::load(&files, 2).unwrap();
    let cache = Mutex::new(inner.new_cache(64));
    let device = Model::from_external(Box::new(Lender { inner, cache }));
    let mut feed = tok.encode("The capital of France is", false).unwrap();
    let (mut want_cache, mut cpu_cache, mut dev_cache) =
        (cpu.new_cache(64), cpu.new_cache(64), device.new_cache(64));
    for _ in 0..3 {
        let want = cpu.forward(&feed, &mut want_cache, Logits::Last).unwrap();
        let (mut from_cpu, mut from_dev) = (Vec::new(), Vec::new());
        cpu.forward_read(&feed, &mut cpu_cache, Logits::Last, &mut |r| {
            from_cpu = r.to_vec()
        })
        .unwrap();
        device
            .forward_read(&feed, &mut dev_cache, Logits::Last, &mut |r| {
                from_dev = r.to_vec()
            })
            .unwrap();
        assert_eq!(want.len(), cpu.config().vocab);
        assert_eq!(from_cpu, want);
        assert_eq!(from_dev, want);
        assert_eq!(dev_cache.len(), want_cache.len());
        feed = vec![trit::sample::sampler::argmax(&want)];
    }
    assert!(device.forward(&feed, &mut dev_cache, Logits::Last).is_err());
}

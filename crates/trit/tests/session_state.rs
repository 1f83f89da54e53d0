//! Sessions saved to disk and loaded back (`trit run --prompt-cache`, `trit chat`'s `/save` and
//! `/load`): a loaded session continues exactly as the saving one would have, reading only the
//! tokens after the saved ones; a file of another model, other weights, other cache types, a
//! smaller context, or damaged or cut short is refused with an error that says which, and the
//! session keeps what it held.

mod common;

use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use trit::engine::Session;
use trit::model::{KvTypes, Model};

fn default_model() -> Arc<Model> {
    Arc::new(Model::load(&common::default_model_files(), 2).unwrap())
}

fn hybrid(seed: u64) -> (tempfile::TempDir, Arc<Model>) {
    let (dir, files, _) = common::hybrid_q2_0("tiny-qwen35", seed);
    (dir, Arc::new(Model::load(&files, 2).unwrap()))
}

/// Token ids of a prompt of `n` tokens (any ids below 200 are in both vocabularies).
fn prompt(n: usize, salt: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i * 37 + salt * 11) % 200 + 1)
        .collect()
}

/// Saves a session holding `first`, then checks that a loaded copy continues with `more`
/// exactly as the saving session does, evaluating only `more`.
fn round_trip(model: &Arc<Model>, first: &[u32], more: &[u32], file: &Path) {
    let mut a = Session::new(model.clone(), 256);
    a.prefill(first).unwrap();
    a.save_state(file, json!({"note": "kept"})).unwrap();
    let whole: Vec<u32> = first.iter().chain(more).copied().collect();
    let expected = a.prefill(&whole).unwrap();

    let mut b = Session::new(model.clone(), 256);
    let loaded = b.load_state(file).unwrap();
    assert_eq!(loaded.tokens, first.len());
    assert_eq!(loaded.extra, json!({"note": "kept"}));
    assert_eq!(b.tokens(), first);
    let got = b.prefill(&whole).unwrap();
    assert_eq!(
        b.last_evaluated(),
        more.len(),
        "only the new tokens are read"
    );
    assert_eq!(
        got, expected,
        "a loaded session computes what the saving one does"
    );
}

#[test]
fn a_loaded_dense_session_continues_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let model = default_model();
    // 70 tokens: a second, partly filled cache block.
    round_trip(
        &model,
        &prompt(70, 1),
        &prompt(9, 2),
        &dir.path().join("s.bin"),
    );
    // f32 and q8_0 caches store other bytes; both come back exactly.
    for types in ["f32", "q8_0"] {
        let t = trit::model::KvType::parse(types).unwrap();
        let m = Arc::new(
            Model::load(&common::default_model_files(), 2)
                .unwrap()
                .with_kv_types(KvTypes { k: t, v: t })
                .unwrap(),
        );
        round_trip(&m, &prompt(20, 3), &prompt(5, 4), &dir.path().join("t.bin"));
    }
}

#[test]
fn a_loaded_hybrid_session_continues_exactly_and_keeps_its_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let (_m, model) = hybrid(0);
    let file = dir.path().join("h.bin");
    round_trip(&model, &prompt(40, 1), &prompt(6, 2), &file);

    // The recurrent state's snapshot (before the prompt's last token) is saved too: the same
    // prompt again reads only its last token, as in the saving session.
    let p = prompt(30, 5);
    let mut a = Session::new(model.clone(), 256);
    let expected = a.prefill(&p).unwrap();
    a.save_state(&file, json!(null)).unwrap();
    let mut b = Session::new(model.clone(), 256);
    b.load_state(&file).unwrap();
    assert_eq!(b.prefill(&p).unwrap(), expected);
    assert_eq!(b.last_evaluated(), 1);
}

/// The error `load_state` gives for `file`, after checking that the session kept its tokens.
fn refused(session: &mut Session, file: &Path) -> String {
    let before = session.tokens().to_vec();
    let err = session.load_state(file).unwrap_err().to_string();
    assert_eq!(session.tokens(), before, "a refused file changes nothing");
    err
}

#[test]
fn files_of_other_models_or_damaged_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.bin");
    let model = default_model();
    let mut a = Session::new(model.clone(), 256);
    a.prefill(&prompt(80, 1)).unwrap();
    a.save_state(&file, json!({})).unwrap();
    let good = std::fs::read(&file).unwrap();

    let mut b = Session::new(model.clone(), 256);
    b.prefill(&prompt(3, 9)).unwrap();
    let damaged = dir.path().join("d.bin");
    let write = |bytes: &[u8]| std::fs::write(&damaged, bytes).unwrap();

    write(&good[..good.len() - 100]);
    let e = refused(&mut b, &damaged);
    assert!(e.contains("truncated"), "{e}");
    let mut flipped = good.clone();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    write(&flipped);
    let e = refused(&mut b, &damaged);
    assert!(e.contains("checksum"), "{e}");
    write(b"GGUF and then some bytes that are no session");
    let e = refused(&mut b, &damaged);
    assert!(e.contains("not a trit session file"), "{e}");
    let missing = refused(&mut b, &dir.path().join("absent.bin"));
    assert!(missing.contains("absent.bin"), "{missing}");

    // A context smaller than the saved tokens.
    let mut small = Session::new(model.clone(), 64);
    let e = refused(&mut small, &file);
    assert!(e.contains("80 tokens") && e.contains("64"), "{e}");

    // Keys and values stored as other types.
    let q8 = trit::model::KvType::parse("q8_0").unwrap();
    let m8 = Model::load(&common::default_model_files(), 2)
        .unwrap()
        .with_kv_types(KvTypes { k: q8, v: q8 })
        .unwrap();
    let e = refused(&mut Session::new(Arc::new(m8), 256), &file);
    assert!(e.contains("f16/f16") && e.contains("q8_0/q8_0"), "{e}");

    // Another architecture.
    let (_h, hyb) = hybrid(0);
    let e = refused(&mut Session::new(hyb.clone(), 256), &file);
    assert!(e.contains("saved with the model"), "{e}");

    // The same shapes with other weights: caught by the first token's keys.
    let hfile = dir.path().join("h.bin");
    let mut h = Session::new(hyb, 256);
    h.prefill(&prompt(10, 1)).unwrap();
    h.save_state(&hfile, json!({})).unwrap();
    let (_o, other) = hybrid(1);
    let e = refused(&mut Session::new(other, 256), &hfile);
    assert!(e.contains("other weights"), "{e}");
}

/// A device backend whose keys and values would live on the device: nothing to save.
struct OnDevice(Model);

impl trit::model::ExternalNet for OnDevice {
    fn config(&self) -> &trit::format::config::ModelConfig {
        self.0.config()
    }
    fn forward(
        &self,
        tokens: &[u32],
        cache: &mut trit::model::KvCache,
        _: trit::model::Logits,
    ) -> trit::Result<Vec<f32>> {
        cache.advance(tokens.len());
        Ok(vec![0.0; self.0.config().vocab])
    }
    fn weight_bytes(&self) -> usize {
        self.0.weight_bytes()
    }
    fn bytes_per_token(&self) -> usize {
        self.0.bytes_per_token()
    }
}

#[test]
fn sessions_of_device_models_are_not_saved_or_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("s.bin");
    let cpu = default_model();
    let mut a = Session::new(cpu, 64);
    a.prefill(&prompt(5, 1)).unwrap();
    a.save_state(&file, json!({})).unwrap();
    let inner = Model::load(&common::default_model_files(), 1).unwrap();
    let device = Arc::new(Model::from_external(Box::new(OnDevice(inner))));
    let mut d = Session::new(device, 64);
    d.prefill(&prompt(5, 1)).unwrap();
    for e in [
        d.save_state(&dir.path().join("d.bin"), json!({}))
            .unwrap_err(),
        d.load_state(&file).unwrap_err(),
    ] {
        assert!(e.to_string().contains("--device cpu"), "{e}");
    }
    assert!(!dir.path().join("d.bin").exists());
}

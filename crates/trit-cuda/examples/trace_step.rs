//! Per-block timestamps of decode steps on the GPU, for `scripts/trace_report.py`:
//!
//!     TRIT_CUDA_DEFINES=-DTRIT_TRACE trace_step MODEL [--prompt 64] [--steps 3] [--ctx 128]
//!                                                   [--out FILE]
//!
//! Reads a `--prompt`-token prompt, runs a few untraced steps (graphs captured), then traces
//! `--steps` single-token steps one by one and writes every record as CSV (step, kind, id,
//! block, smid, start, waited, end, marks m0–m3; nanoseconds of `%globaltimer`). Measurement only: the
//! trace itself costs a little time in every block.

use trit::model::Logits;
use trit_cuda::{load_model, trace, CudaOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (mut path, mut prompt, mut steps, mut ctx) = (None, 64usize, 3usize, 128usize);
    let mut out = "trace.csv".to_string();
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--prompt" => prompt = val()?.parse()?,
            "--steps" => steps = val()?.parse()?,
            "--out" => out = val()?,
            "--ctx" => ctx = val()?.parse()?,
            _ if path.is_none() => path = Some(a),
            _ => return Err(format!("unexpected argument {a}").into()),
        }
    }
    let path = path.ok_or("usage: trace_step MODEL [--prompt N] [--steps N] [--out FILE]")?;
    let files = trit::format::open(std::path::Path::new(&path))?;
    let vocab = files.config.vocab as u32;
    let warm = 4;
    // At least `--ctx` positions (default 128, tg128's): the attention's grid and kernel
    // depend on the context the model is loaded for.
    let ctx = ctx.max(prompt + warm + steps + 1);
    let model = load_model(&files, &CudaOptions::new(ctx))?;
    let tok = |i: usize| (i as u32).wrapping_mul(2_654_435_761) % vocab;
    let mut c = model.new_cache(ctx);
    let ids: Vec<u32> = (0..prompt).map(tok).collect();
    model.forward(&ids, &mut c, Logits::Last)?;
    for i in 0..warm {
        model.forward(&[tok(prompt + i)], &mut c, Logits::Last)?;
    }
    let mut csv = String::from("step,kind,id,block,smid,start,waited,end,m0,m1,m2,m3\n");
    for s in 0..steps {
        trace::reset()?;
        model.forward(&[tok(prompt + warm + s)], &mut c, Logits::Last)?;
        for r in trace::take()? {
            csv.push_str(&format!(
                "{s},{},{:#x},{},{},{},{},{},{},{},{},{}\n",
                r.kind,
                r.id,
                r.block,
                r.smid,
                r.start,
                r.waited,
                r.end,
                r.marks[0],
                r.marks[1],
                r.marks[2],
                r.marks[3]
            ));
        }
    }
    std::fs::write(&out, csv)?;
    println!(
        "{steps} traced steps from position {} into {out}",
        prompt + warm
    );
    Ok(())
}

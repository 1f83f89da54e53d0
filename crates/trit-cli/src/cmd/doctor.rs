//! `trit doctor [MODEL]`: verify a model download (shards, tensor ranges, checksums, tokenizer,
//! chat template, config vs tensors) or, without a model, report what this machine can run.

use crate::doctor::{any_failed, machine, model_checks, print_checks};
use anyhow::{bail, Result};
use clap::Args;
use serde_json::json;

#[derive(Args, Debug)]
pub struct DoctorArgs {
    /// GGUF file, model folder, or `owner/name[:FILE]` in the HF cache. Without it: the
    /// machine report.
    pub model: Option<std::path::PathBuf>,
    /// Print only failed checks (nothing when all pass); the exit code still tells.
    #[arg(short, long)]
    pub quiet: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: DoctorArgs) -> Result<()> {
    let Some(arg) = &a.model else {
        let r = machine::report();
        if a.json {
            println!("{r}");
        } else if !a.quiet {
            machine::print(&r);
        }
        return Ok(());
    };
    let path = crate::hub::resolve::model_argument(arg)?;
    crate::doctor::set_show_progress(
        !a.quiet && !a.json && std::io::IsTerminal::is_terminal(&std::io::stderr()),
    );
    let checks = model_checks::check_model(&path);
    let failed = any_failed(&checks);
    if a.json {
        let list: Vec<_> = checks.iter().map(|c| c.to_json()).collect();
        println!("{}", json!({"model": path, "ok": !failed, "checks": list}));
    } else {
        if !a.quiet {
            println!("{}", path.display());
        }
        print_checks(&checks, a.quiet);
    }
    if failed {
        let n = checks
            .iter()
            .filter(|c| c.status == crate::doctor::Status::Fail)
            .count();
        bail!("{n} check(s) failed for {}", path.display());
    }
    Ok(())
}

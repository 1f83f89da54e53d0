//! `trit doctor`: checks that say what is wrong with a model download or a machine, one line
//! per check (✓ pass, ✗ fail, - skipped), or one JSON object for scripts.

pub mod file_checks;
pub mod machine;
pub mod model_checks;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};

static SHOW_PROGRESS: AtomicBool = AtomicBool::new(false);

/// Progress bars for long checks (hashing), on stderr; off unless the command turns them on.
pub fn set_show_progress(on: bool) {
    SHOW_PROGRESS.store(on, Ordering::Relaxed);
}

pub fn show_progress() -> bool {
    SHOW_PROGRESS.load(Ordering::Relaxed)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    Pass,
    Fail,
    /// Nothing to check against (no checksums, no chat template); never a failure.
    Skip,
}

impl Status {
    fn mark(self) -> &'static str {
        match self {
            Status::Pass => "✓",
            Status::Fail => "✗",
            Status::Skip => "-",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One check's verdict and the reason.
#[derive(Clone, Debug)]
pub struct Check {
    pub name: &'static str,
    pub status: Status,
    pub detail: String,
}

impl Check {
    pub fn pass(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Pass,
            detail: detail.into(),
        }
    }

    pub fn fail(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Fail,
            detail: detail.into(),
        }
    }

    pub fn skip(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            status: Status::Skip,
            detail: detail.into(),
        }
    }

    /// Pass when `problems` is empty, else fail listing the first few.
    pub fn from_problems(name: &'static str, ok: String, problems: &[String]) -> Check {
        if problems.is_empty() {
            return Check::pass(name, ok);
        }
        let shown: Vec<&str> = problems.iter().take(5).map(String::as_str).collect();
        let more = if problems.len() > 5 {
            format!(" (and {} more)", problems.len() - 5)
        } else {
            String::new()
        };
        Check::fail(name, format!("{}{more}", shown.join("; ")))
    }

    pub fn to_json(&self) -> Value {
        json!({"check": self.name, "status": self.status.name(), "detail": self.detail})
    }
}

/// Prints the checks; `quiet` keeps only failures.
pub fn print_checks(checks: &[Check], quiet: bool) {
    for c in checks {
        if quiet && c.status != Status::Fail {
            continue;
        }
        println!("{} {}: {}", c.status.mark(), c.name, c.detail);
    }
}

pub fn any_failed(checks: &[Check]) -> bool {
    checks.iter().any(|c| c.status == Status::Fail)
}

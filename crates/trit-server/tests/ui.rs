//! The chat page at `/`: served without the API key (it asks for the key itself) while the API
//! stays guarded; its script is valid JavaScript (`node --check`, where node exists); and, where
//! Chromium and playwright-core are installed (tools/fetch_assets.sh), a headless browser holds a
//! two-turn conversation through it: both replies stream in, the second turn's prompt comes
//! mostly from the server's prefix cache, a reload shows the same conversation, and the page
//! raises no script errors.

mod common;
use common::{request_raw, start, Options, API_KEY};

use std::path::PathBuf;
use std::process::Command;

#[test]
fn the_chat_page_is_served_without_the_key_and_the_api_stays_guarded() {
    let server = start(Options::default());
    let page = request_raw(server.addr, "GET", "/", b"", None);
    assert_eq!(page.status, 200);
    assert!(page
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/html")));
    let html = page.text();
    assert!(html.contains("/v1/chat/completions") && html.contains("<script>"));
    let models = request_raw(server.addr, "GET", "/v1/models", b"", None);
    assert_eq!(models.status, 401);

    // The page's script parses (a syntax error would leave the page dead in every browser).
    let Some(node) = which("node") else {
        eprintln!("SKIPPED: no node for the script's syntax check");
        return;
    };
    let script = html
        .split("<script>")
        .nth(1)
        .and_then(|s| s.split("</script>").next())
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ui.js");
    std::fs::write(&file, script).unwrap();
    let out = Command::new(node)
        .arg("--check")
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| PathBuf::from(d).join(name))
        .find(|p| p.is_file())
}

#[test]
fn a_browser_holds_a_conversation_through_the_page() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let modules = common::cache_dir().join("ui-test");
    let (Some(node), Some(chromium)) = (which("node"), which("chromium")) else {
        eprintln!("SKIPPED: node and chromium are needed for the browser test");
        return;
    };
    if !modules.join("node_modules/playwright-core").exists() {
        eprintln!("SKIPPED: playwright-core is absent (tools/fetch_assets.sh installs it)");
        return;
    }
    let server = start(Options {
        n_ctx: 512,
        ..Options::default()
    });
    let out = Command::new(node)
        .arg(root.join("tools/ui_check.mjs"))
        .arg(format!("http://{}", server.addr))
        .arg(chromium)
        .env("UI_API_KEY", API_KEY)
        .env("UI_TEST_MODULES", &modules)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["errors"], serde_json::json!([]), "{v}");
    assert!(v["model"].as_str().unwrap().starts_with("default"), "{v}");
    let turns = v["turns"].as_array().unwrap();
    for t in turns {
        assert!(!t["reply"].as_str().unwrap().trim().is_empty(), "{v}");
        assert!(t["stats"].as_str().unwrap().contains("tokens/s"), "{v}");
    }
    // "N prompt tokens (C cached), …": the second turn re-sends the first, which is cached.
    let cached = |t: &serde_json::Value| -> usize {
        let s = t["stats"].as_str().unwrap();
        s.split(" (")
            .nth(1)
            .unwrap()
            .split(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    assert!(cached(&turns[1]) > 20, "{v}");
    // After a reload the page shows the same conversation.
    let restored: Vec<&str> = v["restored"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap())
        .collect();
    let want = [
        "user: What is the capital of France?".to_string(),
        format!("assistant: {}", turns[0]["reply"].as_str().unwrap()),
        "user: And of Italy?".to_string(),
        format!("assistant: {}", turns[1]["reply"].as_str().unwrap()),
    ];
    assert_eq!(restored, want, "{v}");
}

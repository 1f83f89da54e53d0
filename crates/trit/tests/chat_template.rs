//! Chat templates rendered byte-identically to transformers' `apply_chat_template` (goldens
//! from `tools/ref_tokenizer.py`, which embeds the template sources so these tests need no
//! cache), the Qwen3 template golden ids of docs/assets.md, the Python-compat shims, and
//! errors.

use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};
use trit::chat::{split_reasoning, ChatTemplate};
use trit::tokenizer::Tokenizer;
use trit::Error;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixture(rel: &str) -> Value {
    let path = repo_root().join("tests/fixtures").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn template_of(f: &Value) -> ChatTemplate {
    ChatTemplate::new(
        f["template"].as_str().unwrap(),
        f["bos_token"].as_str().unwrap(),
        f["eos_token"].as_str().unwrap(),
    )
    .unwrap()
}

fn check_renders(rel: &str) -> usize {
    let f = fixture(rel);
    let t = template_of(&f);
    let cases = f["cases"].as_array().unwrap();
    for c in cases {
        let name = c["name"].as_str().unwrap();
        let messages = c["messages"].as_array().unwrap();
        let tools = (!c["tools"].is_null()).then_some(&c["tools"]);
        let kwargs = c["kwargs"].as_object().unwrap();
        let gen = c["add_generation_prompt"].as_bool().unwrap();
        let got = t.render(messages, gen, tools, kwargs).unwrap();
        let want = c["rendered"].as_str().unwrap();
        assert_eq!(got, want, "{rel}: case {name}");
    }
    cases.len()
}

#[test]
fn qwen3_renders_match_transformers() {
    assert!(check_renders("chat/qwen3_renders.json") >= 10);
}

#[test]
fn smollm2_renders_match_transformers() {
    assert!(check_renders("chat/smollm2_renders.json") >= 3);
}

fn cache_file(rel: &str) -> Option<PathBuf> {
    let cache = std::env::var_os("TRIT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".cache"));
    let path = cache.join(rel);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "SKIPPED: {} is absent (run tools/fetch_assets.sh or set TRIT_CACHE)",
            path.display()
        );
        None
    }
}

#[test]
fn qwen3_template_tokens_match_assets_md() {
    let Some(tok_path) = cache_file("qwen3/tokenizer.json") else {
        return;
    };
    let Some(cfg_path) = cache_file("qwen3/tokenizer_config.json") else {
        return;
    };
    let tok = Tokenizer::from_json_file(tok_path).unwrap();
    let cfg = trit::tokenizer::TokenizerConfig::from_json_file(cfg_path).unwrap();
    let t = ChatTemplate::new(cfg.chat_template.as_deref().unwrap(), "", "<|im_end|>").unwrap();
    let messages = [
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": "苹果发布M5芯片"}),
    ];
    let prompt = t.render(&messages, true, None, &Map::new()).unwrap();
    // docs/assets.md §1.
    let want: [u32; 24] = [
        151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 104167,
        90447, 44, 20, 105016, 151645, 198, 151644, 77091, 198,
    ];
    assert_eq!(tok.encode(&prompt, false).unwrap(), want);
    let mut kwargs = Map::new();
    kwargs.insert("enable_thinking".into(), json!(false));
    let prompt = t.render(&messages, true, None, &kwargs).unwrap();
    let ids = tok.encode(&prompt, false).unwrap();
    assert_eq!(ids[..want.len()], want);
    assert_eq!(
        ids[want.len() - 2..],
        [77091, 198, 151667, 271, 151668, 271]
    );
}

fn render(src: &str, vars: Value) -> Result<String, Error> {
    let t = ChatTemplate::new(src, "<s>", "</s>")?;
    t.render(&[], false, None, vars.as_object().unwrap())
}

#[test]
fn python_compat_methods_and_slicing() {
    // Expected outputs: Jinja2 in transformers' configuration (tools/ref_tokenizer.py's env).
    let vars = json!({"s": "  Hello, World  ", "d": {"b": 1, "a": 2}, "l": [1, 2, 3]});
    let cases = [
        ("{{ s.strip() }}", "Hello, World"),
        ("{{ s.lstrip() }}|", "Hello, World  |"),
        ("{{ s.rstrip() }}|", "  Hello, World|"),
        ("{{ s.strip().startswith('Hello') }} {{ s.strip().endswith('x') }}", "True False"),
        ("{{ s.strip().split(', ') }}", "['Hello', 'World']"),
        ("{{ s.strip().split(',')[-1].strip() }}", "World"),
        ("{{ s.replace('l', 'L') }}", "  HeLLo, WorLd  "),
        ("{{ s.strip().upper() }} {{ s.strip().lower() }}", "HELLO, WORLD hello, world"),
        ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "b=1;a=2;"),
        ("{{ d.get('a') }} {{ d.get('zz', 'dflt') }}", "2 dflt"),
        ("{{ l[::-1] }} {{ 'abc'[::-1] }} {{ l[1:] }}", "[3, 2, 1] cba [2, 3]"),
        ("{{ bos_token }}x{{ eos_token }}", "<s>x</s>"),
        ("{% set ns = namespace(n=0) %}{% for i in l %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}", "6"),
        ("{% for i in l %}{% if i == 2 %}{% continue %}{% endif %}{{ i }}{% endfor %}", "13"),
        ("{{ messages|length }} {{ tools is none }} {{ add_generation_prompt }}", "0 True False"),
        (
            "{{ none }}|{{ [1, 'a', none, true, 2.5] }}|{{ {'k': 'v', 'n': none} }}|{{ 1.0 }}",
            "None|[1, 'a', None, True, 2.5]|{'k': 'v', 'n': None}|1.0",
        ),
        ("{{ d }} {{ d.keys()|list }} {{ 'a' ~ 1.5 }}", "{'b': 1, 'a': 2} ['b', 'a'] a1.5"),
    ];
    for (src, want) in cases {
        assert_eq!(render(src, vars.clone()).unwrap(), want, "{src}");
    }
}

#[test]
fn whitespace_control_is_transformers_like() {
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indentation before
    // it; a single trailing newline of the template is dropped.
    let src =
        "{% for i in [1, 2] %}\n    {% if i %}\n{{ i }}\n    {% endif %}\n{% endfor %}\nend\n";
    assert_eq!(render(src, json!({})).unwrap(), "1\n2\nend");
}

#[test]
fn tojson_is_pythons_json_dumps() {
    let vars = json!({"x": {"name": "天气 <b>&'\"", "n": [1, 2.5, 1e-7, true, null], "e": {}}});
    assert_eq!(
        render("{{ x|tojson }}", vars.clone()).unwrap(),
        r#"{"name": "天气 <b>&'\"", "n": [1, 2.5, 1e-07, true, null], "e": {}}"#
    );
    assert_eq!(
        render("{{ x.n|tojson(indent=2) }}", vars.clone()).unwrap(),
        "[\n  1,\n  2.5,\n  1e-07,\n  true,\n  null\n]"
    );
    assert_eq!(
        render(
            "{{ x|tojson(sort_keys=true, separators=(',', ':')) }}",
            vars.clone()
        )
        .unwrap(),
        r#"{"e":{},"n":[1,2.5,1e-07,true,null],"name":"天气 <b>&'\""}"#
    );
    assert_eq!(
        render("{{ x.name|tojson(ensure_ascii=true) }}", vars.clone()).unwrap(),
        r#""\u5929\u6c14 <b>&'\"""#
    );
    assert!(render("{{ x|tojson(bogus=1) }}", vars.clone()).is_err());
    assert!(render("{{ nothing|tojson }}", vars).is_err());
}

#[test]
fn strftime_now_uses_the_fixed_clock() {
    let t = ChatTemplate::new("Today is {{ strftime_now('%d %b %Y') }}.", "", "").unwrap();
    t.set_fixed_time(Some(1_709_211_909)); // 2024-02-29 13:05:09 UTC
    assert_eq!(
        t.render(&[], false, None, &Map::new()).unwrap(),
        "Today is 29 Feb 2024."
    );
    t.set_fixed_time(None);
    let live = t.render(&[], false, None, &Map::new()).unwrap();
    assert!(
        live.starts_with("Today is ") && live.len() == "Today is 29 Feb 2024.".len(),
        "{live}"
    );
}

#[test]
fn generation_blocks_render_their_body() {
    let src = "{% for m in messages %}{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}[{{ m.content }}]{% endif %}{% endfor %}";
    let t = ChatTemplate::new(src, "", "").unwrap();
    let messages = [
        json!({"role": "user", "content": "q"}),
        json!({"role": "assistant", "content": "a"}),
    ];
    assert_eq!(
        t.render(&messages, false, None, &Map::new()).unwrap(),
        "[q]a"
    );
}

#[test]
fn empty_bos_is_undefined_like_a_missing_token() {
    let t = ChatTemplate::new(
        "{{ bos_token is defined }}|{{ bos_token }}|{{ eos_token }}",
        "",
        "<|im_end|>",
    )
    .unwrap();
    assert_eq!(
        t.render(&[], false, None, &Map::new()).unwrap(),
        "False||<|im_end|>"
    );
}

#[test]
fn template_errors_are_reported_not_panics() {
    let syntax = ChatTemplate::new("{% for m in messages %}{{ m.content }", "", "").unwrap_err();
    assert!(matches!(syntax, Error::Template(_)), "{syntax}");
    let unclosed = ChatTemplate::new("{% if x %}never closed", "", "").unwrap_err();
    assert!(matches!(unclosed, Error::Template(_)));

    let raising = ChatTemplate::new(
        "{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a user turn') }}{% endif %}ok",
        "",
        "",
    )
    .unwrap();
    let err = raising
        .render(
            &[json!({"role": "assistant", "content": "x"})],
            false,
            None,
            &Map::new(),
        )
        .unwrap_err();
    match err {
        Error::Template(msg) => assert!(
            msg.contains("Conversations must start with a user turn"),
            "{msg}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        raising
            .render(
                &[json!({"role": "user", "content": "x"})],
                false,
                None,
                &Map::new()
            )
            .unwrap(),
        "ok"
    );

    // Runtime failures: calling a method of an undefined value, an unknown filter, bad slicing.
    for src in [
        "{{ nope.strip() }}",
        "{{ 'x'|no_such_filter }}",
        "{{ 'abc'[::0] }}",
        "{{ strftime_now('%Q') }}",
    ] {
        match render(src, json!({})) {
            Err(Error::Template(_)) => {}
            other => panic!("{src}: {other:?}"),
        }
    }
    // kwargs cannot replace the variables the renderer owns.
    let mut kwargs = Map::new();
    kwargs.insert("messages".into(), json!([]));
    let t = ChatTemplate::new("x", "", "").unwrap();
    assert!(matches!(
        t.render(&[], false, None, &kwargs),
        Err(Error::Template(_))
    ));
}

#[test]
fn reasoning_split_feeds_back_into_the_qwen3_template() {
    // A reply split with split_reasoning and sent back as reasoning_content renders exactly
    // like the raw reply: the template's own split and ours agree.
    let f = fixture("chat/qwen3_renders.json");
    let t = template_of(&f);
    let reply = "<think>\nThe user greets.\n</think>\n\nHello! How can I help?";
    let split = split_reasoning(reply, false);
    assert_eq!(split.reasoning.as_deref(), Some("The user greets."));
    let user = json!({"role": "user", "content": "Hi"});
    let raw = [user.clone(), json!({"role": "assistant", "content": reply})];
    let structured = [
        user,
        json!({"role": "assistant", "content": split.content, "reasoning_content": split.reasoning}),
    ];
    let a = t.render(&raw, false, None, &Map::new()).unwrap();
    let b = t.render(&structured, false, None, &Map::new()).unwrap();
    assert_eq!(a, b);
    assert!(
        a.ends_with("<think>\nThe user greets.\n</think>\n\nHello! How can I help?<|im_end|>\n"),
        "{a}"
    );
}

/// A template runs on a budget of instructions (`FUEL`): one that loops (almost) forever — it
/// comes with a model file — ends in an error within seconds instead of hanging, while Qwen3's
/// template over a 200-message conversation with tools takes under 1 % of the budget.
#[test]
fn runaway_templates_stop_and_real_ones_fit_the_budget() {
    let looping =
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    let t = ChatTemplate::new(looping, "", "").unwrap();
    let start = std::time::Instant::now();
    let e = t
        .render(
            &[json!({"role": "user", "content": "hi"})],
            true,
            None,
            &Map::new(),
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("fuel"), "{e}");
    assert!(start.elapsed().as_secs() < 10, "{:?}", start.elapsed());

    let f = fixture("chat/qwen3_renders.json");
    let case = f["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| !c["tools"].is_null())
        .expect("a case with tools");
    let mut messages = Vec::new();
    for i in 0..100 {
        messages.push(json!({"role": "user", "content": format!("question {i}")}));
        messages.push(json!({"role": "assistant", "content": format!("answer {i}")}));
    }
    let small = ChatTemplate::with_fuel(
        f["template"].as_str().unwrap(),
        f["bos_token"].as_str().unwrap(),
        f["eos_token"].as_str().unwrap(),
        trit::chat::TEMPLATE_FUEL / 100,
    )
    .unwrap();
    let text = small
        .render(&messages, true, Some(&case["tools"]), &Map::new())
        .unwrap();
    assert!(text.contains("answer 99"));
}

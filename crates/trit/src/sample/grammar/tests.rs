use super::Grammar;

fn g(text: &str) -> Grammar {
    Grammar::parse(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
}

/// Whether `s` is a complete string of the grammar.
fn accepts(g: &Grammar, s: &str) -> bool {
    let mut st = g.start();
    g.feed_all(&mut st, s.as_bytes()) && g.can_end(&st)
}

/// Whether `s` can be continued into a string of the grammar.
fn prefix(g: &Grammar, s: &str) -> bool {
    let mut st = g.start();
    g.feed_all(&mut st, s.as_bytes())
}

fn err(text: &str) -> String {
    match Grammar::parse(text) {
        Ok(_) => panic!("{text:?} parsed"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn literals_alternatives_and_groups() {
    let y = g(r#"root ::= "yes" | "no" | ("may" "be")"#);
    for s in ["yes", "no", "maybe"] {
        assert!(accepts(&y, s), "{s}");
    }
    for s in ["", "ye", "yess", "maybee", "noo"] {
        assert!(!accepts(&y, s), "{s}");
    }
    assert!(prefix(&y, "ma") && !prefix(&y, "mx"));
}

#[test]
fn classes_ranges_negation_and_any() {
    let id = g("root ::= [a-zA-Z_] [a-zA-Z0-9_]*");
    assert!(accepts(&id, "x") && accepts(&id, "_a9Z") && !accepts(&id, "9a"));
    let q = g(r#"root ::= "\"" [^"\\]* "\"""#);
    assert!(accepts(&q, r#""hi there""#) && !accepts(&q, r#""a"b""#));
    let any = g("root ::= . . .");
    assert!(accepts(&any, "a\nb") && accepts(&any, "éßü") && !accepts(&any, "ab"));
    // A dash first or last is literal; escapes inside classes.
    let d = g(r"root ::= [-a\]]+");
    assert!(accepts(&d, "-a]-") && !accepts(&d, "b"));
}

#[test]
fn repetitions_take_their_bounds() {
    let r = g(r#"root ::= "a"{2,4} "b"? "c"+ "d"{3} "e"{1,}"#);
    assert!(accepts(&r, "aacddde"));
    assert!(accepts(&r, "aaaabcccdddeee"));
    assert!(!accepts(&r, "acddde"), "too few a");
    assert!(!accepts(&r, "aaaaacddde"), "too many a");
    assert!(!accepts(&r, "aabddde"), "no c");
    assert!(!accepts(&r, "aacdde"), "two d");
    // A repetition of a multi-character literal repeats the whole literal.
    let w = g(r#"root ::= "ab"*"#);
    assert!(accepts(&w, "") && accepts(&w, "abab") && !accepts(&w, "aba"));
    // Long repetitions keep the stacks small (right recursion replaces, not nests).
    let long = g("root ::= [0-9]*");
    let mut st = long.start();
    assert!(long.feed_all(&mut st, "7".repeat(5000).as_bytes()));
    assert!(st.stacks.iter().all(|s| s.len() <= 2), "{:?}", st.stacks);
}

#[test]
fn recursion_comments_and_multiline_rules() {
    let arith = g(r#"
        # arithmetic, llama.cpp's example grammar shape
        root  ::= expr
        expr  ::= term (("+" | "-") term)*
        term  ::= factor (("*" | "/") factor)*
        factor ::= num | "(" ws expr ws ")"
        num   ::= [0-9]+
        ws    ::= [ ]*
    "#);
    for s in ["1", "1+2*3", "(1+2)*3", "((4))", "( 1-2 )/7"] {
        assert!(accepts(&arith, s), "{s}");
    }
    for s in ["", "1+", "(1", "1)", "a", "1++2"] {
        assert!(!accepts(&arith, s), "{s}");
    }
    // A rule continues on the next line inside parentheses and after `|`.
    let m = g("root ::= (\n  \"a\"\n  \"b\"\n) |\n \"c\"\n");
    assert!(accepts(&m, "ab") && accepts(&m, "c") && !accepts(&m, "a"));
}

#[test]
fn split_utf8_code_points_are_checked_as_they_come() {
    let g = g("root ::= [à-ä] \"€\"");
    let text = "â€".as_bytes();
    let mut st = g.start();
    for (i, &b) in text.iter().enumerate() {
        assert!(g.feed(&mut st, b), "byte {i}");
        assert_eq!(g.can_end(&st), i + 1 == text.len());
    }
    assert!(g.is_done(&st));
    // "å" (U+00E5) is outside the class; its first byte 0xC3 is a prefix of "à"..."ä" too,
    // so only the second byte is refused.
    let mut st = g.start();
    assert!(g.feed(&mut st, 0xc3));
    assert!(!g.feed(&mut st, 0xa5));
    // A lead byte no class can take is refused at once: "€" starts with 0xE2.
    let mut st = g.start();
    assert!(!g.feed(&mut st, 0xe2));
    // Invalid UTF-8 is never taken.
    let any = super::Grammar::parse("root ::= .*").unwrap();
    let mut st = any.start();
    assert!(!any.feed(&mut st, 0xff));
    let mut st = any.start();
    assert!(any.feed(&mut st, 0xe2) && !any.feed(&mut st, b'a'));
}

#[test]
fn negated_classes_take_partial_code_points_they_do_not_exclude() {
    // Every code point but "é" (U+00E9): after 0xC3 some continuation is still fine.
    let g = g("root ::= [^é]");
    let mut st = g.start();
    assert!(g.feed(&mut st, 0xc3));
    assert!(!g.clone_feed(&st, 0xa9), "é itself");
    assert!(g.clone_feed(&st, 0xa8), "è");
    // A negated class that excludes every continuation of a prefix refuses the prefix.
    let g2 = super::Grammar::parse(r"root ::= [^\u0080-\u07FF]").unwrap();
    let mut st = g2.start();
    assert!(!g2.feed(&mut st, 0xc3));
    // The same with its ranges written out of order.
    let g3 = super::Grammar::parse(r"root ::= [^\u0100-\u07FF\u0080-\u00FF]").unwrap();
    let mut st = g3.start();
    assert!(!g3.feed(&mut st, 0xc3));
}

impl Grammar {
    fn clone_feed(&self, st: &super::GrammarState, b: u8) -> bool {
        let mut s = st.clone();
        self.feed(&mut s, b)
    }
}

#[test]
fn done_means_nothing_may_follow() {
    let g = g(r#"root ::= "a" "b"?"#);
    let mut st = g.start();
    assert!(g.feed(&mut st, b'a'));
    assert!(g.can_end(&st) && !g.is_done(&st), "b may still follow");
    assert!(g.feed(&mut st, b'b'));
    assert!(g.is_done(&st));
    assert!(!g.clone_feed(&st, b'b'));
}

#[test]
fn bad_grammars_are_refused_with_the_reason() {
    assert!(err(r#"start ::= "a""#).contains("no 'root' rule"));
    assert!(err("root ::= item").contains("'item' is used but never defined"));
    assert!(err("root ::= \"a\"\nroot ::= \"b\"").contains("defined twice"));
    assert!(err("root ::= root \"a\" | \"b\"").contains("left-recursive"));
    // Left recursion through a nullable prefix and another rule.
    let e = err("root ::= ws list\nlist ::= ws root \"x\" | \"y\"\nws ::= [ ]*");
    assert!(e.contains("left-recursive"), "{e}");
    assert!(err(r#"root ::= "abc"#).contains("unterminated string literal"));
    assert!(err("root ::= [a-").contains("unterminated character class"));
    assert!(err("root ::= [z-a]").contains("runs backwards"));
    assert!(err(r#"root ::= "a"{3,2}"#).contains("max < min"));
    assert!(err(r#"root ::= "a"{99999}"#).contains("repetitions above"));
    assert!(err("root ::= (\"a\"").contains("expected ')'"));
    assert!(err("root = \"a\"").contains("expected '::='"));
    assert!(err(r#"root ::= "\q""#).contains("unknown escape"));
    assert!(err(r#"root ::= "\x4""#).contains("hexadecimal"));
    assert!(err("root ::= <think>").contains("token references"));
    let e = err("root ::= \"a\"\n\nfoo ::= \"b\" )");
    assert!(e.contains("line 3"), "{e}");
    assert!(err("root ::= * \"a\"").contains("repetition operator without an item"));
    // Size and depth limits, instead of exhausting memory or the stack.
    let wide = format!(
        "root ::= [a-z]{{10000}} [a-z]{{10000}} {}",
        "[0-9]{10000} ".repeat(99)
    );
    assert!(err(&wide).contains("elements once repetitions are written out"));
    let deep = format!("root ::= {}\"a\"{}", "(".repeat(300), ")".repeat(300));
    assert!(err(&deep).contains("nested deeper than 256"));
}

#[test]
fn escapes_in_literals() {
    let g = g(r#"root ::= "\n\t\"\\\x41\u00e9\U0001F600""#);
    assert!(accepts(&g, "\n\t\"\\Aé😀"));
}

#[test]
fn overlong_prefixes_do_not_stand_for_ascii() {
    // 0xE0 0x81 0xA2 would be "b" written in three bytes; UTF-8 forbids it, so a lead byte
    // 0xE0 or 0xF0 cannot start "b".
    let g = g(r#"root ::= "ab""#);
    let mut st = g.start();
    assert!(g.feed(&mut st, b'a'));
    let ok: Vec<u8> = (0..=255u8).filter(|&b| g.clone_feed(&st, b)).collect();
    assert_eq!(ok, [b'b']);
    let any = super::Grammar::parse("root ::= .").unwrap();
    let mut st = any.start();
    assert!(any.feed_all(&mut st, &[0xe0, 0xa0]), "U+0800's prefix");
    let mut st = any.start();
    assert!(any.feed(&mut st, 0xe0) && !any.feed_all(&mut st, &[0x81, 0xa2]));
}

#[test]
fn long_chains_of_rules_expand_without_recursion() {
    // r0 ::= r1, r1 ::= r2, … : each starts with the next; expanding the start walks all.
    let n = 50_000;
    let mut text = String::from("root ::= r0\n");
    for i in 0..n {
        text.push_str(&format!("r{i} ::= r{}\n", i + 1));
    }
    text.push_str(&format!("r{n} ::= \"z\"\n"));
    let g = g(&text);
    assert!(accepts(&g, "z") && !accepts(&g, "y"));
}

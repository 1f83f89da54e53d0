//! The pushdown recognizer against a second, independent algorithm over the same parsed
//! rules: a memoized set-of-end-positions parser (for each rule and start, every position a
//! derivation can end at). Strings derived at random from each grammar must be accepted by
//! both; their one-character mutations must get the same verdict from both.

use super::{Elem, Grammar};
use crate::test_values::TestRng;
use std::collections::{BTreeSet, HashMap};

/// Every end position of `rule` from `start` over `text`.
fn ends(
    g: &Grammar,
    text: &[u32],
    rule: usize,
    start: usize,
    memo: &mut HashMap<(usize, usize), BTreeSet<usize>>,
) -> BTreeSet<usize> {
    if let Some(e) = memo.get(&(rule, start)) {
        return e.clone();
    }
    // A rule reached again at the same start before it is solved contributes nothing yet
    // (grammars here are not left-recursive, so this only cuts a revisit).
    memo.insert((rule, start), BTreeSet::new());
    let mut out = BTreeSet::new();
    for alt in &g.rules[rule].alts {
        let mut at = BTreeSet::from([start]);
        for e in alt {
            let mut next = BTreeSet::new();
            for &i in &at {
                match e {
                    Elem::Chars { .. } => {
                        if i < text.len() && e.takes(text[i]) {
                            next.insert(i + 1);
                        }
                    }
                    Elem::Rule(r) => next.extend(ends(g, text, *r, i, memo)),
                }
            }
            at = next;
        }
        out.extend(at);
    }
    memo.insert((rule, start), out.clone());
    out
}

fn set_parser_accepts(g: &Grammar, s: &str) -> bool {
    let text: Vec<u32> = s.chars().map(|c| c as u32).collect();
    ends(g, &text, g.root, 0, &mut HashMap::new()).contains(&text.len())
}

fn pushdown_accepts(g: &Grammar, s: &str) -> bool {
    let mut st = g.start();
    g.feed_all(&mut st, s.as_bytes()) && g.can_end(&st)
}

/// Characters a class may produce: its ranges' ends and middles, or for a negated class the
/// first of a few candidates it does not exclude.
fn pick_char(e: &Elem, rng: &mut TestRng) -> Option<char> {
    let Elem::Chars { ranges, negated } = e else {
        return None;
    };
    if *negated {
        let pool = ['x', 'Q', '7', ' ', 'é', '€', '😀', '"', '\\', '\n'];
        let start = rng.below(pool.len());
        return (0..pool.len())
            .map(|k| pool[(start + k) % pool.len()])
            .find(|&c| e.takes(c as u32));
    }
    let (lo, hi) = ranges[rng.below(ranges.len())];
    let c = match rng.below(3) {
        0 => lo,
        1 => hi,
        _ => lo + (hi - lo) / 2,
    };
    char::from_u32(c)
}

/// Fewest characters each rule can derive (to steer deep derivations to an end).
fn min_lengths(g: &Grammar) -> Vec<usize> {
    let mut min = vec![usize::MAX; g.rules.len()];
    loop {
        let mut changed = false;
        for (i, r) in g.rules.iter().enumerate() {
            for alt in &r.alts {
                let n = alt.iter().try_fold(0usize, |acc, e| match e {
                    Elem::Chars { .. } => Some(acc + 1),
                    Elem::Rule(t) => (min[*t] != usize::MAX).then(|| acc + min[*t]),
                });
                if let Some(n) = n.filter(|&n| n < min[i]) {
                    min[i] = n;
                    changed = true;
                }
            }
        }
        if !changed {
            return min;
        }
    }
}

fn derive(
    g: &Grammar,
    rule: usize,
    depth: usize,
    min: &[usize],
    rng: &mut TestRng,
    out: &mut String,
) {
    let alts = &g.rules[rule].alts;
    let cost = |alt: &Vec<Elem>| -> usize {
        alt.iter()
            .map(|e| match e {
                Elem::Chars { .. } => 1,
                Elem::Rule(t) => min[*t].saturating_add(1),
            })
            .fold(0usize, usize::saturating_add)
    };
    // Past a depth, the cheapest alternative, so every derivation ends.
    let alt = if depth > 12 {
        alts.iter().min_by_key(|a| cost(a)).unwrap()
    } else {
        &alts[rng.below(alts.len())]
    };
    for e in alt {
        match e {
            Elem::Rule(t) => derive(g, *t, depth + 1, min, rng, out),
            chars => out.push(pick_char(chars, rng).expect("a class that takes some character")),
        }
    }
}

const GRAMMARS: &[&str] = &[
    r#"root ::= expr
       expr ::= term (("+" | "-") term)*
       term ::= factor (("*" | "/") factor)*
       factor ::= [0-9]{1,3} | "(" expr ")""#,
    r#"root ::= value
       value ::= object | array | string | number | ("true" | "false" | "null")
       object ::= "{" ws (pair ("," ws pair)*)? "}"
       pair ::= string ":" ws value ws
       array ::= "[" ws (value ws ("," ws value ws)*)? "]"
       string ::= "\"" ([^"\\] | "\\" ["\\nt])* "\""
       number ::= "-"? [0-9]+ ("." [0-9]+)?
       ws ::= [ \n]?"#,
    r#"root ::= "a"{2,4} "b"? ("cd" | "c")+ [x-z]{0,3} "é"* "€"?"#,
    r#"root ::= line+
       line ::= word (" " word)* "\n"
       word ::= [A-Za-z]+ | [^ \n\x00-\x40]"#,
];

#[test]
fn random_derivations_are_accepted_and_mutations_judged_alike() {
    let mut rng = TestRng(0x9e37_79b9_7f4a_7c15);
    let alphabet = [
        'a', 'b', 'c', '1', '+', '(', ')', '"', '\\', ' ', '\n', 'é', '€', '{', '}', ',',
    ];
    let (mut derived, mut mutants, mut accepted) = (0, 0, 0);
    for text in GRAMMARS {
        let g = Grammar::parse(text).unwrap();
        let min = min_lengths(&g);
        for _ in 0..150 {
            let mut s = String::new();
            derive(&g, g.root, 0, &min, &mut rng, &mut s);
            assert!(set_parser_accepts(&g, &s), "{text}: derived {s:?}");
            assert!(pushdown_accepts(&g, &s), "{text}: derived {s:?}");
            derived += 1;
            for _ in 0..6 {
                let mut chars: Vec<char> = s.chars().collect();
                let at = rng.below(chars.len() + 1);
                let c = alphabet[rng.below(alphabet.len())];
                match rng.below(3) {
                    0 => chars.insert(at, c),
                    1 if at < chars.len() => {
                        chars.remove(at);
                    }
                    _ if at < chars.len() => chars[at] = c,
                    _ => chars.push(c),
                }
                let m: String = chars.into_iter().collect();
                let want = set_parser_accepts(&g, &m);
                assert_eq!(pushdown_accepts(&g, &m), want, "{text}: mutant {m:?}");
                mutants += 1;
                accepted += want as usize;
            }
        }
    }
    // Both verdicts occur: the mutations are not all trivially rejected.
    assert!(derived == 600 && mutants == 3600, "{derived} {mutants}");
    assert!(
        accepted > 200 && accepted < 3400,
        "{accepted} of {mutants} mutants accepted"
    );
}

//! DRY ("don't repeat yourself", llama.cpp's `--dry-multiplier`): a token that would extend a
//! stretch of the recent text which already appeared earlier is penalized by
//! `multiplier · base^(length − allowed_length)`, `length` being the longest such stretch it
//! would extend (counted without the token), when that length is at least `allowed_length`.
//! Sequence breakers (by default newline, `:`, `"` and `*`) bound the stretches: none reaches
//! back across the last breaker, and a token that is a breaker on its own is never penalized.
//!
//! Breakers are strings; `Breakers::new` turns them into token sequences for a vocabulary as
//! llama.cpp does: any token whose text contains a breaker is one on its own, and a token whose
//! text ends with the start of a breaker is one when the tokens of the breaker's rest follow it.
//! Checked against llama.cpp's DRY sampler on the default model's vocabulary
//! (`tools/ref_dry.py`, `tests/fixtures/sampling/dry.json`).

use crate::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::Arc;

/// llama.cpp's default sequence breakers.
pub const DEFAULT_BREAKERS: [&str; 4] = ["\n", ":", "\"", "*"];

/// Breaker strings longer than this are cut (llama.cpp's limit).
const MAX_BREAKER_BYTES: usize = 40;
/// Tokens of a breaker's rest after its first token that are compared (llama.cpp's limit).
const MAX_TAIL_TOKENS: usize = 20;

/// A vocabulary's breakers: for each token that starts one, the tokens that must follow it
/// (none: the token is a breaker by itself).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Breakers {
    tails: HashMap<u32, Vec<Vec<u32>>>,
}

impl Breakers {
    pub fn new(tokenizer: &Tokenizer, strings: &[String]) -> Breakers {
        let texts: Vec<Vec<u8>> = (0..tokenizer.vocab_size() as u32)
            .map(|id| {
                tokenizer.token_bytes(id).unwrap_or_else(|| {
                    tokenizer
                        .decode(&[id], false)
                        .unwrap_or_default()
                        .into_bytes()
                })
            })
            .collect();
        let mut b = Breakers::default();
        for s in strings.iter().filter(|s| !s.is_empty()) {
            let mut cut = s.len().min(MAX_BREAKER_BYTES);
            while !s.is_char_boundary(cut) {
                cut -= 1;
            }
            b.add(&s.as_bytes()[..cut], &texts, |rest| {
                let mut ids = tokenizer.encode(rest, false).unwrap_or_default();
                ids.truncate(MAX_TAIL_TOKENS);
                ids
            });
        }
        b
    }

    /// From explicit token sequences (each a head token and the tokens after it).
    pub fn from_sequences(seqs: &[Vec<u32>]) -> Breakers {
        let mut b = Breakers::default();
        for s in seqs {
            if let Some((&head, tail)) = s.split_first() {
                b.insert(head, tail.to_vec());
            }
        }
        b
    }

    fn insert(&mut self, head: u32, tail: Vec<u32>) {
        let tails = self.tails.entry(head).or_default();
        if !tails.contains(&tail) {
            tails.push(tail);
        }
    }

    /// Adds breaker `s` for tokens whose texts are `texts`; `tokenize` gives the tokens of a
    /// breaker's rest.
    fn add(&mut self, s: &[u8], texts: &[Vec<u8>], tokenize: impl Fn(&str) -> Vec<u32>) {
        for (id, word) in texts.iter().enumerate() {
            if word.windows(s.len()).any(|w| w == s) {
                self.insert(id as u32, Vec::new());
                continue;
            }
            // Every place the word's end is a start of the breaker.
            for start in (0..word.len()).filter(|&i| word[i] == s[0]) {
                let overlap = word.len() - start;
                if overlap < s.len() && word[start..] == s[..overlap] {
                    let rest = String::from_utf8_lossy(&s[overlap..]);
                    self.insert(id as u32, tokenize(&rest));
                }
            }
        }
    }

    /// Whether `token` is a breaker on its own.
    fn is_single(&self, token: u32) -> bool {
        self.tails
            .get(&token)
            .is_some_and(|t| t.iter().any(Vec::is_empty))
    }

    /// Tokens from the end of `window` that may repeat: up to the last complete breaker.
    fn limit(&self, window: &[u32]) -> usize {
        let n = window.len();
        for back in 0..n {
            let Some(tails) = self.tails.get(&window[n - 1 - back]) else {
                continue;
            };
            // The longest breaker with this head whose tail follows it in the window.
            let longest = tails
                .iter()
                .filter(|t| t.len() <= back)
                .filter(|t| {
                    t.iter()
                        .enumerate()
                        .all(|(j, &x)| window[n - back + j] == x)
                })
                .map(Vec::len)
                .max();
            if let Some(len) = longest {
                return back - len;
            }
        }
        n
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Dry {
    pub multiplier: f32,
    pub base: f32,
    pub allowed_length: usize,
    /// How many of the most recent tokens are searched (0: none).
    pub last_n: usize,
    pub breakers: Arc<Breakers>,
}

impl Dry {
    pub fn is_active(&self) -> bool {
        self.multiplier != 0.0 && self.base >= 1.0 && self.last_n > 0
    }

    /// Subtracts each token's penalty from its logit, given the sequence's tokens so far.
    pub fn apply(&self, logits: &mut [f32], history: &[u32]) {
        if !self.is_active() {
            return;
        }
        let window = &history[history.len().saturating_sub(self.last_n)..];
        let n = window.len();
        if n <= self.allowed_length {
            return;
        }
        let limit = self.breakers.limit(window);
        if limit < self.allowed_length {
            return;
        }
        // z[k]: how many tokens ending k positions before the end match the window's last
        // tokens (the Z-function of the reversed window).
        let rev: Vec<u32> = window.iter().rev().copied().collect();
        let z = z_function(&rev);
        let mut longest: HashMap<u32, usize> = HashMap::new();
        for (k, &matched) in z.iter().enumerate().skip(1) {
            let len = matched.min(limit);
            if len >= self.allowed_length {
                // The token after that stretch would extend it.
                let next = window[n - k];
                let e = longest.entry(next).or_default();
                *e = (*e).max(len);
            }
        }
        // base^e overflows f32 past ln(f32::MAX) / ln(base).
        let max_exp = if self.base > 1.000_001 {
            (88.722_84 / self.base.ln()) as usize
        } else {
            usize::MAX
        };
        for (token, len) in longest {
            if self.breakers.is_single(token) {
                continue;
            }
            if let Some(l) = logits.get_mut(token as usize) {
                let exp = (len - self.allowed_length).min(max_exp);
                *l -= self.multiplier * self.base.powi(exp as i32);
            }
        }
    }
}

/// `z[k]` = the length of the longest common prefix of `s` and `s[k..]` (`z[0] = 0`).
fn z_function(s: &[u32]) -> Vec<usize> {
    let n = s.len();
    let mut z = vec![0; n];
    // [lo, hi): the rightmost window found so far that matches a prefix of `s`.
    let (mut lo, mut hi) = (0, 0);
    for k in 1..n {
        let mut len = if k < hi { z[k - lo].min(hi - k) } else { 0 };
        while k + len < n && s[len] == s[k + len] {
            len += 1;
        }
        if k + len > hi {
            (lo, hi) = (k, k + len);
        }
        z[k] = len;
    }
    z
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dry(last_n: usize, breakers: &[Vec<u32>]) -> Dry {
        Dry {
            multiplier: 0.8,
            base: 1.75,
            allowed_length: 2,
            last_n,
            breakers: Arc::new(Breakers::from_sequences(breakers)),
        }
    }

    fn penalties(d: &Dry, history: &[u32]) -> Vec<f32> {
        let mut l = vec![0.0; 10];
        d.apply(&mut l, history);
        l.iter().map(|x| -x).collect()
    }

    #[test]
    fn z_function_by_definition() {
        let s = [1, 2, 1, 2, 1, 3, 1, 2];
        let z = z_function(&s);
        for k in 1..s.len() {
            let want = (0..s.len() - k).take_while(|&i| s[i] == s[k + i]).count();
            assert_eq!(z[k], want, "{k}");
        }
    }

    #[test]
    fn a_token_that_extends_a_repeat_is_penalized_by_its_length() {
        // a b c d a b c: "d" would make "a b c" repeat once more (3 tokens, allowed 2).
        let p = penalties(&dry(64, &[]), &[1, 2, 3, 4, 1, 2, 3]);
        assert!((p[4] - 0.8 * 1.75).abs() < 1e-6, "{p:?}");
        assert_eq!(p.iter().filter(|&&x| x != 0.0).count(), 1);
        // Shorter than allowed: nothing.
        assert!(penalties(&dry(64, &[]), &[1, 2, 4, 1])
            .iter()
            .all(|&x| x == 0.0));
        // The window: only the last 4 tokens are searched.
        assert!(penalties(&dry(4, &[]), &[1, 2, 3, 4, 1, 2, 3])
            .iter()
            .all(|&x| x == 0.0));
    }

    #[test]
    fn breakers_bound_repeats_and_are_never_penalized() {
        // "7 9 2 3" repeats (4 tokens), but with 9 a breaker only "2 3" counts.
        let h = [7, 9, 2, 3, 4, 7, 9, 2, 3];
        let free = penalties(&dry(64, &[]), &h)[4];
        assert!((free - 0.8 * 1.75f32.powi(2)).abs() < 1e-5, "{free}");
        let bounded = penalties(&dry(64, &[vec![9]]), &h)[4];
        assert!((bounded - 0.8).abs() < 1e-6, "{bounded}");
        // Right after a breaker nothing is long enough to repeat.
        let h = [1, 2, 3, 4, 1, 2, 3, 9];
        assert!(penalties(&dry(64, &[vec![9]]), &h)
            .iter()
            .all(|&x| x == 0.0));
        // A two-token breaker "5 6" counts only whole.
        let h = [1, 2, 3, 7, 1, 5, 2, 3];
        assert!(penalties(&dry(64, &[vec![5, 6]]), &h)[7] > 0.0);
        // A breaker token that would extend a repeat is left alone.
        let h = [1, 2, 9, 1, 2];
        assert_eq!(penalties(&dry(64, &[vec![9]]), &h)[9], 0.0);
    }
}

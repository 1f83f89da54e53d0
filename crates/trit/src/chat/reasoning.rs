//! Separates a thinking model's reasoning from its answer (Qwen3: `<think>…</think>answer`),
//! for `reasoning_content` in API responses and for re-rendering history.
//!
//! Whitespace follows what the Qwen3 template does when it re-renders a turn: the reasoning is
//! trimmed, the answer loses its leading newlines/spaces. When the prompt already ends with
//! `<think>` (Qwen3.5's generation prompt), the output starts inside the reasoning and only
//! contains the closing tag: pass `starts_in_reasoning = true`.

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";

/// A reply split into its parts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReasoningSplit {
    /// The reasoning, `None` when the reply has no reasoning block.
    pub reasoning: Option<String>,
    pub content: String,
}

/// Splits a complete reply. An unterminated reasoning block (generation stopped inside it) is
/// all reasoning and no content.
pub fn split_reasoning(text: &str, starts_in_reasoning: bool) -> ReasoningSplit {
    let body = if starts_in_reasoning {
        Some(text)
    } else {
        let trimmed = text.trim_start();
        trimmed.strip_prefix(THINK_OPEN)
    };
    let Some(body) = body else {
        return ReasoningSplit {
            reasoning: None,
            content: text.to_string(),
        };
    };
    match body.split_once(THINK_CLOSE) {
        Some((reasoning, content)) => ReasoningSplit {
            reasoning: Some(reasoning.trim().to_string()),
            content: content.trim_start().to_string(),
        },
        None => ReasoningSplit {
            reasoning: Some(body.trim().to_string()),
            content: String::new(),
        },
    }
}

/// Which part of the reply a streamed piece of text belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyPart {
    Reasoning,
    Content,
}

/// Incremental version of [`split_reasoning`] for streaming: feed text as it is decoded and
/// get `(part, text)` pieces. Text that might be the start of a tag is held back until it is
/// known not to be one; the tags themselves are never emitted. Whitespace right after a tag is
/// dropped like the non-streaming split does; whitespace right before `</think>` is kept.
#[derive(Debug, Clone)]
pub struct ReasoningStream {
    state: State,
    held: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet: an opening tag may still come.
    Start,
    /// Inside `<think>`; `bool` = still skipping the whitespace after the tag.
    Reasoning(bool),
    /// After `</think>` or without reasoning; `bool` = skipping whitespace after `</think>`.
    Content(bool),
}

impl ReasoningStream {
    pub fn new(starts_in_reasoning: bool) -> Self {
        ReasoningStream {
            state: if starts_in_reasoning {
                State::Reasoning(true)
            } else {
                State::Start
            },
            held: String::new(),
        }
    }

    /// Feeds decoded text; returns the pieces that can be emitted now.
    pub fn push(&mut self, text: &str) -> Vec<(ReplyPart, String)> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            match self.state {
                State::Start => {
                    let t = self.held.trim_start();
                    if let Some(after) = t.strip_prefix(THINK_OPEN) {
                        self.held = after.to_string();
                        self.state = State::Reasoning(true);
                    } else if t.is_empty() || THINK_OPEN.starts_with(t) {
                        return out; // undecided: wait for more text
                    } else {
                        self.state = State::Content(false);
                    }
                }
                State::Reasoning(skip_ws) | State::Content(skip_ws) => {
                    let in_reasoning = matches!(self.state, State::Reasoning(_));
                    if skip_ws {
                        let t = self.held.trim_start();
                        if t.is_empty() {
                            self.held.clear();
                            return out;
                        }
                        self.held = t.to_string();
                        self.state = if in_reasoning {
                            State::Reasoning(false)
                        } else {
                            State::Content(false)
                        };
                    }
                    let part = if in_reasoning {
                        ReplyPart::Reasoning
                    } else {
                        ReplyPart::Content
                    };
                    if !in_reasoning {
                        if !self.held.is_empty() {
                            out.push((part, std::mem::take(&mut self.held)));
                        }
                        return out;
                    }
                    if let Some(pos) = self.held.find(THINK_CLOSE) {
                        let before = self.held[..pos].to_string();
                        self.held = self.held[pos + THINK_CLOSE.len()..].to_string();
                        if !before.is_empty() {
                            out.push((part, before));
                        }
                        self.state = State::Content(true);
                        continue;
                    }
                    // Emit all but a suffix that could be the start of `</think>`.
                    let keep = partial_tag_suffix(&self.held, THINK_CLOSE);
                    let emit_len = self.held.len() - keep;
                    if emit_len > 0 {
                        let rest = self.held.split_off(emit_len);
                        out.push((part, std::mem::replace(&mut self.held, rest)));
                    }
                    return out;
                }
            }
        }
    }

    /// Emits text held back at the end of the reply.
    pub fn finish(&mut self) -> Option<(ReplyPart, String)> {
        let held = std::mem::take(&mut self.held);
        let part = match self.state {
            State::Reasoning(_) => ReplyPart::Reasoning,
            State::Start | State::Content(_) => ReplyPart::Content,
        };
        (!held.is_empty()).then_some((part, held))
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of `tag`.
fn partial_tag_suffix(s: &str, tag: &str) -> usize {
    (1..tag.len().min(s.len() + 1))
        .rev()
        .find(|&n| s.is_char_boundary(s.len() - n) && tag.starts_with(&s[s.len() - n..]))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_complete_replies() {
        let s = split_reasoning("<think>\nLet me think.\n</think>\n\nParis.", false);
        assert_eq!(s.reasoning.as_deref(), Some("Let me think."));
        assert_eq!(s.content, "Paris.");

        let s = split_reasoning("<think>\n\n</think>\n\nHi", false);
        assert_eq!(s.reasoning.as_deref(), Some(""));
        assert_eq!(s.content, "Hi");

        let s = split_reasoning("Just an answer with </think> inside", false);
        assert_eq!(s.reasoning, None);
        assert_eq!(s.content, "Just an answer with </think> inside");

        let s = split_reasoning("still thinking when cut off", true);
        assert_eq!(s.reasoning.as_deref(), Some("still thinking when cut off"));
        assert_eq!(s.content, "");

        let s = split_reasoning("prefilled opener\n</think>\n\nanswer", true);
        assert_eq!(s.reasoning.as_deref(), Some("prefilled opener"));
        assert_eq!(s.content, "answer");
        let s = split_reasoning("<think>unterminated", false);
        assert_eq!(s.reasoning.as_deref(), Some("unterminated"));
        assert_eq!(s.content, "");
    }

    fn stream_all(pieces: &[&str], starts_in_reasoning: bool) -> (String, String) {
        let mut st = ReasoningStream::new(starts_in_reasoning);
        let (mut r, mut c) = (String::new(), String::new());
        let mut sink = |parts: Vec<(ReplyPart, String)>| {
            for (p, t) in parts {
                match p {
                    ReplyPart::Reasoning => r.push_str(&t),
                    ReplyPart::Content => c.push_str(&t),
                }
            }
        };
        for p in pieces {
            sink(st.push(p));
        }
        sink(st.finish().into_iter().collect());
        (r, c)
    }

    #[test]
    fn stream_matches_split_for_every_chunking() {
        let texts = [
            "<think>\nWeigh options.\n</think>\n\nParis is the capital.",
            "  <think>a</think>b",
            "No reasoning here, <think> mid-text stays.",
            "<thi",
            "<think>\n\n</think>\n\n",
        ];
        for text in texts {
            let whole = split_reasoning(text, false);
            // Every way of cutting the text into two pieces, and one char at a time.
            let chars: Vec<(usize, char)> = text.char_indices().collect();
            let mut chunkings: Vec<Vec<&str>> = chars
                .iter()
                .map(|&(i, _)| vec![&text[..i], &text[i..]])
                .collect();
            chunkings.push(
                chars
                    .iter()
                    .map(|&(i, c)| &text[i..i + c.len_utf8()])
                    .collect(),
            );
            for pieces in chunkings {
                let (r, c) = stream_all(&pieces, false);
                assert_eq!(
                    r.trim_end(),
                    whole.reasoning.clone().unwrap_or_default(),
                    "{pieces:?}"
                );
                assert_eq!(c, whole.content, "{pieces:?}");
            }
        }
    }

    #[test]
    fn stream_prefilled_reasoning() {
        let (r, c) = stream_all(&["Think", "ing.\n</th", "ink>\n\nDone"], true);
        assert_eq!((r.as_str(), c.as_str()), ("Thinking.\n", "Done"));
    }
}

//! Chat templates trit supplies for models that ship none.
//!
//! BitNet b1.58 2B4T: `<|begin_of_text|>`, then `System: …<|eot_id|>`, `User: …<|eot_id|>`,
//! `Assistant: …<|eot_id|>` turns (contents trimmed), generation prompt `Assistant: ` — the
//! format of llama.cpp's `bitnet` chat template (models.md §8). Written here as Jinja so it runs
//! through the same renderer as every shipped template.

/// The BitNet b1.58 template (`bos_token` is `<|begin_of_text|>` with its Llama-3 tokenizer).
pub const BITNET: &str = "{{ bos_token }}{% for m in messages %}\
{% if m.role == 'system' %}System: {{ m.content | trim }}<|eot_id|>\
{% elif m.role == 'user' %}User: {{ m.content | trim }}<|eot_id|>\
{% elif m.role == 'assistant' %}Assistant: {{ m.content | trim }}<|eot_id|>\
{% endif %}{% endfor %}{% if add_generation_prompt %}Assistant: {% endif %}";

/// `<|eot_id|>` in the Llama-3 vocabulary BitNet 2B4T uses (its end of turn).
pub const LLAMA3_EOT: u32 = 128_009;
/// Rows of the Llama-3 vocabulary (128,000 + 256 special tokens).
pub const LLAMA3_VOCAB: usize = 128_256;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ChatTemplate;
    use serde_json::json;

    #[test]
    fn renders_the_bitnet_turns() {
        let t = ChatTemplate::new(BITNET, "<|begin_of_text|>", "<|eot_id|>").unwrap();
        let messages = json!([
            {"role": "system", "content": " Be brief. "},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!\n"},
            {"role": "user", "content": "2+2?"}
        ]);
        let out = t
            .render(
                messages.as_array().unwrap(),
                true,
                None,
                &Default::default(),
            )
            .unwrap();
        assert_eq!(
            out,
            "<|begin_of_text|>System: Be brief.<|eot_id|>User: Hi<|eot_id|>Assistant: \
             Hello!<|eot_id|>User: 2+2?<|eot_id|>Assistant: "
        );
    }
}

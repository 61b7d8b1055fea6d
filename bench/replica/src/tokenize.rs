//! Prompt tokens: a real BPE tokenizer (tiktoken `cl100k_base`, built once, lazily)
//! and a documented chat template.
//!
//! Chat template: each message becomes `<|{role}|>\n{content}\n`, then
//! `<|assistant|>\n` is appended (the generation prompt). The markers are encoded
//! as ordinary text, not special tokens, so a user cannot inject them and the same
//! chat always gives the same token ids (hence the same prefix-cache blocks).

use std::sync::OnceLock;

use tiktoken_rs::CoreBPE;

use super::request::PromptInput;

static CL100K: OnceLock<Result<CoreBPE, String>> = OnceLock::new();

fn bpe() -> Result<&'static CoreBPE, String> {
    CL100K
        .get_or_init(|| tiktoken_rs::cl100k_base().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| format!("tokenizer unavailable: {e}"))
}

/// Builds the tokenizer now (call from a blocking task at startup).
pub fn warm_up() -> Result<(), String> {
    bpe().map(|_| ())
}

/// The chat template described in the module docs.
pub fn render_chat(messages: &[(String, String)]) -> String {
    let mut s = String::new();
    for (role, content) in messages {
        s.push_str("<|");
        s.push_str(role);
        s.push_str("|>\n");
        s.push_str(content);
        s.push('\n');
    }
    s.push_str("<|assistant|>\n");
    s
}

/// Token ids of a prompt (token-id prompts pass through unchanged).
pub fn prompt_token_ids(prompt: &PromptInput) -> Result<Vec<u32>, String> {
    match prompt {
        PromptInput::Tokens(ids) => Ok(ids.clone()),
        PromptInput::Text(text) => Ok(bpe()?.encode_ordinary(text)),
        PromptInput::Messages(m) => Ok(bpe()?.encode_ordinary(&render_chat(m))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_tokenized_with_cl100k() {
        let ids = prompt_token_ids(&PromptInput::Text("hello world".into())).expect("bpe");
        assert_eq!(ids.len(), 2);
    }

    #[test]
    fn chat_template_is_stable_and_role_tagged() {
        let m = vec![
            ("system".to_string(), "be brief".to_string()),
            ("user".into(), "hi".into()),
        ];
        assert_eq!(
            render_chat(&m),
            "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
        );
        let a = prompt_token_ids(&PromptInput::Messages(m.clone())).expect("bpe");
        let b = prompt_token_ids(&PromptInput::Messages(m)).expect("bpe");
        assert_eq!(a, b);
    }
}

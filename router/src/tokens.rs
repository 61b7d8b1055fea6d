//! Prompt measurement: token counts and chained prefix-block hashes.
//!
//! Invariant: equal leading content gives equal leading block hashes, because each
//! block's hash is seeded with its parent's (a chain), so a match on block `i` implies
//! a match on every block before it.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, OnceLock},
};

use crate::{bpe_cache::CachedBpe, segment_cache::SegmentCache};
use headroom_core::blocks::chain;
pub use headroom_core::blocks::{PromptShape, shape_of_ids};

/// Bytes per token the estimator starts from (English text under BPE vocabularies);
/// nodes refine it per model from the prompt token counts replicas report.
pub const EST_BYTES_PER_TOKEN: f64 = 4.0;

/// Bytes hashed per prefix block with the estimator (a fixed size, so block hashes do
/// not move when the learned ratio does).
const EST_BLOCK_BYTES_PER_TOKEN: usize = 4;

/// How a model's prompts are measured.
#[derive(Clone)]
pub enum Tokenizer {
    /// A tiktoken BPE vocabulary, with its cache of segments already tokenized
    /// (exact: see [`crate::bpe_cache`]).
    Bpe(Arc<CachedBpe>),
    /// The served model's own Hugging Face tokenizer (and chat template): counts and
    /// block boundaries equal the engine's.
    Hf(Arc<HfTokenizer>),
    /// Bytes / (bytes per token), with byte-chunk block hashing: cheap, approximate;
    /// the ratio is learned per model from the replicas' usage reports.
    Estimate,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Tokenizer::Bpe(_) => f.write_str("Tokenizer::Bpe"),
            Tokenizer::Hf(h) => write!(f, "Tokenizer::Hf({})", h.path.display()),
            Tokenizer::Estimate => f.write_str("Tokenizer::Estimate"),
        }
    }
}

/// Errors naming a tokenizer.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error(
        "unknown tokenizer `{0}` (expected cl100k, o200k, estimate or hf:/path/to/tokenizer.json)"
    )]
    Unknown(String),
    #[error("failed to load tokenizer `{0}`: {1}")]
    Load(String, String),
    #[error("tokenizer file `{path}`: {why}")]
    File { path: PathBuf, why: String },
    #[error("chat template for tokenizer `{tokenizer}`: {source}")]
    Chat {
        tokenizer: PathBuf,
        source: crate::chat::ChatError,
    },
    #[error("`chat_template` needs an `hf:` tokenizer, not `{0}`")]
    TemplateWithoutHf(String),
}

/// A Hugging Face `tokenizer.json` with the model's chat template, if it has one.
pub struct HfTokenizer {
    tok: tokenizers::Tokenizer,
    /// Where the tokenizer may run segment by segment ([`crate::hf_segments`]): the
    /// segments' cache and the special ids put around them. None: every text whole.
    segments: Option<HfSegments>,
    /// None: the chat path counts the flattened messages plus a per-message allowance.
    pub chat: Option<crate::chat::ChatTemplate>,
    pub path: PathBuf,
}

impl HfTokenizer {
    /// Loads `tokenizer.json` and the chat template (see
    /// [`crate::chat::ChatTemplate::discover`]). Reads local files only.
    pub fn load(path: &Path, chat_template: Option<&Path>) -> Result<Self, TokenizerError> {
        let file_err = |why: String| TokenizerError::File {
            path: path.to_path_buf(),
            why,
        };
        let bytes = std::fs::read(path).map_err(|e| file_err(e.to_string()))?;
        let mut tok = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| file_err(format!("not a tokenizer.json: {e}")))?;
        // A tokenizer.json may carry truncation or padding settings; vLLM counts the
        // whole prompt, unpadded.
        tok.with_truncation(None)
            .map_err(|e| file_err(e.to_string()))?;
        tok.with_padding(None);
        let chat = crate::chat::ChatTemplate::discover(path, chat_template).map_err(|source| {
            TokenizerError::Chat {
                tokenizer: path.to_path_buf(),
                source,
            }
        })?;
        let mut h = HfTokenizer {
            tok,
            segments: None,
            chat,
            path: path.to_path_buf(),
        };
        let json: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| file_err(format!("not a tokenizer.json: {e}")))?;
        match crate::hf_segments::check(&json).and_then(|()| {
            crate::hf_segments::specials(|t, special| h.encode_whole(t, special))
                .ok_or_else(|| "post-processor changes the ids".to_string())
        }) {
            Ok((prefix, suffix)) => {
                h.segments = Some(HfSegments {
                    cache: SegmentCache::default(),
                    prefix,
                    suffix,
                })
            }
            Err(why) => tracing::info!(
                tokenizer = %path.display(),
                "every prompt is tokenized whole (no reuse of seen segments): {why}"
            ),
        }
        Ok(h)
    }

    /// The segment cache's counters, where this tokenizer has one.
    pub fn segment_cache(&self) -> Option<&SegmentCache> {
        self.segments.as_ref().map(|s| &s.cache)
    }

    /// Token ids of `text`; `special`: add the tokenizer's special tokens (BOS...),
    /// as vLLM does for completions (`add_special_tokens` true) and not for rendered
    /// chat (the template writes them). None if the tokenizer fails on the text.
    pub fn encode(&self, text: &str, special: bool) -> Option<Vec<u32>> {
        let Some(seg) = &self.segments else {
            return self.encode_whole(text, special);
        };
        let mut ids = Vec::with_capacity(text.len() / 3 + seg.prefix.len() + seg.suffix.len());
        if special {
            ids.extend_from_slice(&seg.prefix);
        }
        seg.cache
            .encode_into(text, |s| self.encode_whole(s, false), &mut ids)?;
        if special {
            ids.extend_from_slice(&seg.suffix);
        }
        Some(ids)
    }

    /// As [`HfTokenizer::encode`], the whole text at once (no cache).
    pub fn encode_whole(&self, text: &str, special: bool) -> Option<Vec<u32>> {
        match self.tok.encode_fast(text, special) {
            Ok(enc) => Some(enc.get_ids().to_vec()),
            Err(e) => {
                tracing::debug!(tokenizer = %self.path.display(), "tokenizer failed: {e}");
                None
            }
        }
    }
}

/// See [`HfTokenizer::segments`].
struct HfSegments {
    cache: SegmentCache,
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

static CL100K: OnceLock<Result<Arc<CachedBpe>, String>> = OnceLock::new();
static O200K: OnceLock<Result<Arc<CachedBpe>, String>> = OnceLock::new();

impl Tokenizer {
    /// Builds a tokenizer by name; BPE tables are loaded once per process.
    pub fn by_name(name: &str) -> Result<Self, TokenizerError> {
        let load = |cell: &'static OnceLock<Result<Arc<CachedBpe>, String>>,
                    f: fn() -> anyhow::Result<tiktoken_rs::CoreBPE>| {
            cell.get_or_init(|| {
                f().map(|b| Arc::new(CachedBpe::new(b)))
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map(Tokenizer::Bpe)
            .map_err(|e| TokenizerError::Load(name.to_string(), e))
        };
        match name {
            "cl100k" | "cl100k_base" => load(&CL100K, tiktoken_rs::cl100k_base),
            "o200k" | "o200k_base" => load(&O200K, tiktoken_rs::o200k_base),
            "estimate" => Ok(Tokenizer::Estimate),
            other => Err(TokenizerError::Unknown(other.to_string())),
        }
    }

    /// A model's tokenizer from its config: a name (see [`Tokenizer::by_name`]) or
    /// `hf:PATH` to a `tokenizer.json`, with an optional chat template file (only for
    /// `hf:`; without one the template is looked up beside the tokenizer).
    pub fn from_config(spec: &str, chat_template: Option<&Path>) -> Result<Self, TokenizerError> {
        match spec.strip_prefix("hf:") {
            Some(path) => Ok(Tokenizer::Hf(Arc::new(HfTokenizer::load(
                Path::new(path),
                chat_template,
            )?))),
            None if chat_template.is_some() => Err(TokenizerError::TemplateWithoutHf(spec.into())),
            None => Self::by_name(spec),
        }
    }
}

/// Token ids of a chat request rendered through the model's chat template, tokenized
/// as vLLM tokenizes it. None when the tokenizer has no template or this request
/// cannot be rendered exactly (media parts, a template that raises).
pub fn ids_of_chat(tok: &Tokenizer, body: &[u8]) -> Option<Vec<u32>> {
    let Tokenizer::Hf(h) = tok else {
        return None;
    };
    let chat = h.chat.as_ref()?;
    match chat.render_body(body) {
        Ok((text, special)) => h.encode(&text, special),
        Err(e) => {
            tracing::debug!(template = %chat.source.display(), "chat prompt estimated: {e}");
            None
        }
    }
}

/// Shape of a chat request from [`ids_of_chat`]; None when those are unknown: the
/// caller estimates.
pub fn shape_of_chat(
    tok: &Tokenizer,
    body: &[u8],
    block_tokens: usize,
    max_blocks: usize,
) -> Option<PromptShape> {
    ids_of_chat(tok, body).map(|ids| shape_of_ids(&ids, block_tokens, max_blocks))
}

/// Token ids of a text prompt with a real tokenizer (None with the estimator).
pub fn ids_of_text(tok: &Tokenizer, text: &str) -> Option<Vec<u32>> {
    match tok {
        Tokenizer::Bpe(bpe) => Some(bpe.encode(text)),
        // vLLM's completions path adds special tokens (BOS) to a text prompt.
        Tokenizer::Hf(h) => h.encode(text, true),
        Tokenizer::Estimate => None,
    }
}

/// Shape of a text prompt.
pub fn shape_of_text(
    tok: &Tokenizer,
    text: &str,
    block_tokens: usize,
    max_blocks: usize,
    bytes_per_token: f64,
) -> PromptShape {
    if let Some(ids) = ids_of_text(tok, text) {
        return shape_of_ids(&ids, block_tokens, max_blocks);
    }
    let bytes = text.as_bytes();
    let ratio = if bytes_per_token.is_finite() && bytes_per_token >= 0.5 {
        bytes_per_token
    } else {
        EST_BYTES_PER_TOKEN
    };
    let tokens = (bytes.len() as f64 / ratio).ceil();
    PromptShape {
        tokens: tokens.min(u32::MAX as f64) as u32,
        blocks: chain(bytes, block_tokens * EST_BLOCK_BYTES_PER_TOKEN, max_blocks),
        ids: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefix_gives_shared_leading_blocks() {
        let t = Tokenizer::Estimate;
        let base = "The quick brown fox jumps over the lazy dog. ".repeat(40);
        let a = shape_of_text(
            &t,
            &format!("{base}{}", "first question ".repeat(20)),
            16,
            1000,
            4.0,
        );
        let b = shape_of_text(
            &t,
            &format!("{base}{}", "second ask ".repeat(30)),
            16,
            1000,
            4.0,
        );
        let common = a
            .blocks
            .iter()
            .zip(&b.blocks)
            .take_while(|(x, y)| x == y)
            .count();
        assert!(common >= base.len() / 64 - 1, "common {common}");
        assert!(common < a.blocks.len().max(b.blocks.len()));
    }

    #[test]
    fn chain_means_a_different_start_changes_every_block() {
        let a = shape_of_ids(&(0..64).collect::<Vec<_>>(), 16, 100);
        let mut ids: Vec<u32> = (0..64).collect();
        ids[0] = 999;
        let b = shape_of_ids(&ids, 16, 100);
        assert_eq!(a.blocks.len(), 4);
        assert!(a.blocks.iter().zip(&b.blocks).all(|(x, y)| x != y));
    }

    #[test]
    fn bpe_counts_real_tokens() {
        let t = Tokenizer::by_name("cl100k").unwrap();
        let s = shape_of_text(&t, "hello world", 16, 10, 4.0);
        assert_eq!(s.tokens, 2);
        assert!(Tokenizer::by_name("nope").is_err());
    }

    #[test]
    fn estimator_uses_the_given_ratio_but_hashes_fixed_chunks() {
        let t = Tokenizer::Estimate;
        let text = "x".repeat(1000);
        let a = shape_of_text(&t, &text, 16, 100, 4.0);
        let b = shape_of_text(&t, &text, 16, 100, 2.5);
        assert_eq!((a.tokens, b.tokens), (250, 400));
        assert_eq!(
            a.blocks, b.blocks,
            "block hashes must not depend on the ratio"
        );
        assert_eq!(shape_of_text(&t, &text, 16, 100, f64::NAN).tokens, 250);
    }

    /// The captured real-vLLM responses and the tokenizer they came from.
    fn fixtures() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/vllm/fixtures")
    }

    fn fixture(name: &str) -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(fixtures().join(name)).unwrap()).unwrap()
    }

    /// The template `scripts/vllm/make-tiny-model.py` writes into tokenizer_config.json.
    const TINY_TEMPLATE: &str = "{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}";

    /// A model dir like the tiny model's: tokenizer.json and tokenizer_config.json.
    fn tiny_model_dir(config: Option<serde_json::Value>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::copy(
            fixtures().join("tiny-llama-tokenizer.json"),
            dir.path().join("tokenizer.json"),
        )
        .unwrap();
        if let Some(c) = config {
            std::fs::write(
                dir.path().join("tokenizer_config.json"),
                serde_json::to_vec(&c).unwrap(),
            )
            .unwrap();
        }
        dir
    }

    fn hf(dir: &Path) -> Tokenizer {
        let spec = format!("hf:{}", dir.join("tokenizer.json").display());
        Tokenizer::from_config(&spec, None).unwrap()
    }

    #[test]
    fn hf_tokenizer_counts_what_vllm_reported_for_completions_and_chat() {
        let dir = tiny_model_dir(Some(serde_json::json!({
            "bos_token": "<s>", "eos_token": "</s>", "chat_template": TINY_TEMPLATE
        })));
        let tok = hf(dir.path());
        let index = fixture("index.json");
        // Completions: vLLM's /tokenize ids (BOS first) and usage.prompt_tokens.
        let prompt = index["completion.json"]["request"]["prompt"]
            .as_str()
            .unwrap();
        let Tokenizer::Hf(h) = &tok else {
            panic!("not hf")
        };
        let want_ids: Vec<u32> = fixture("tokenize.json")["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        assert_eq!(h.encode(prompt, true).unwrap(), want_ids);
        let s = shape_of_text(&tok, prompt, 4, 100, 4.0);
        assert_eq!(
            s.tokens as u64,
            fixture("completion.json")["usage"]["prompt_tokens"]
                .as_u64()
                .unwrap()
        );
        assert_eq!(s, shape_of_ids(&want_ids, 4, 100), "blocks over vLLM's ids");
        // Chat: rendered through the template, no specials added.
        let body = serde_json::to_vec(&index["chat.json"]["request"]).unwrap();
        let chat = shape_of_chat(&tok, &body, 16, 100).expect("renders");
        assert_eq!(
            chat.tokens as u64,
            fixture("chat.json")["usage"]["prompt_tokens"]
                .as_u64()
                .unwrap()
        );
        assert_eq!(chat.blocks.len(), chat.tokens as usize / 16);
        // The streamed chat reported the same count.
        let sse = std::fs::read_to_string(fixtures().join("chat-stream-usage.sse")).unwrap();
        assert!(
            sse.contains(&format!("\"prompt_tokens\":{}", chat.tokens)),
            "{sse}"
        );
    }

    #[test]
    fn hf_without_a_template_leaves_chat_to_the_estimate() {
        let dir = tiny_model_dir(None);
        let tok = hf(dir.path());
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
        assert!(shape_of_chat(&tok, body, 16, 100).is_none());
        assert!(shape_of_chat(&Tokenizer::Estimate, body, 16, 100).is_none());
        // Text still counts with the real vocabulary.
        assert!(shape_of_text(&tok, "hello world", 16, 100, 4.0).tokens >= 2);
    }

    #[test]
    fn explicit_chat_template_file_wins_over_tokenizer_config() {
        let dir = tiny_model_dir(Some(serde_json::json!({"chat_template": TINY_TEMPLATE})));
        let file = dir.path().join("plain.jinja");
        std::fs::write(&file, "{% for m in messages %}{{ m.content }}{% endfor %}").unwrap();
        let spec = format!("hf:{}", dir.path().join("tokenizer.json").display());
        let tok = Tokenizer::from_config(&spec, Some(&file)).unwrap();
        let body = br#"{"model":"m","messages":[{"role":"user","content":"hello"}]}"#;
        let Tokenizer::Hf(h) = &tok else {
            panic!("not hf")
        };
        let s = shape_of_chat(&tok, body, 16, 100).unwrap();
        assert_eq!(s.tokens as usize, h.encode("hello", false).unwrap().len());
    }

    #[test]
    fn bad_tokenizer_configs_fail_naming_the_file() {
        let err = |spec: &str, tpl: Option<&Path>| {
            Tokenizer::from_config(spec, tpl).unwrap_err().to_string()
        };
        let e = err("hf:/no/such/dir/tokenizer.json", None);
        assert!(e.contains("/no/such/dir/tokenizer.json"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let garbage = dir.path().join("tokenizer.json");
        std::fs::write(&garbage, "{\"not\": \"a tokenizer\"}").unwrap();
        let e = err(&format!("hf:{}", garbage.display()), None);
        assert!(
            e.contains(&garbage.display().to_string()) && e.contains("not a tokenizer.json"),
            "{e}"
        );
        let bad_tpl = tiny_model_dir(Some(serde_json::json!({"chat_template": "{% if %}"})));
        let cfg = bad_tpl.path().join("tokenizer_config.json");
        let e = err(
            &format!("hf:{}", bad_tpl.path().join("tokenizer.json").display()),
            None,
        );
        assert!(
            e.contains(&cfg.display().to_string()) && e.contains("does not compile"),
            "{e}"
        );
        let bad_json = tiny_model_dir(None);
        std::fs::write(bad_json.path().join("tokenizer_config.json"), "{oops").unwrap();
        let e = err(
            &format!("hf:{}", bad_json.path().join("tokenizer.json").display()),
            None,
        );
        assert!(
            e.contains("tokenizer_config.json") && e.contains("not JSON"),
            "{e}"
        );
        let plain = tiny_model_dir(None);
        let e = err(
            &format!("hf:{}", plain.path().join("tokenizer.json").display()),
            Some(Path::new("/no/such/template.jinja")),
        );
        assert!(e.contains("/no/such/template.jinja"), "{e}");
        let e = err("cl100k", Some(Path::new("t.jinja")));
        assert!(e.contains("needs an `hf:` tokenizer"), "{e}");
    }

    #[test]
    fn max_blocks_caps_work() {
        let ids: Vec<u32> = (0..10_000).collect();
        assert_eq!(shape_of_ids(&ids, 16, 7).blocks.len(), 7);
        assert_eq!(shape_of_ids(&ids, 16, 7).tokens, 10_000);
    }
}

//! Chat templates: a chat request rendered to the prompt text the engine tokenizes.
//!
//! vLLM (with a Hugging Face tokenizer) turns `/v1/chat/completions` messages into a
//! "conversation" (content parts joined or wrapped, tool-call arguments parsed from
//! their JSON strings), renders the model's Jinja chat template over it the way
//! `transformers` does (`trim_blocks`, `lstrip_blocks`, loop controls, `tojson`,
//! `raise_exception`, `strftime_now`, the special tokens as variables) and tokenizes
//! the result without adding special tokens (the template writes BOS itself). This
//! module reproduces the rendering so the router counts the same prompt tokens and
//! cuts the same prefix blocks as the engine.
//!
//! Invariant: rendering either yields the text vLLM would build for the same request
//! body, or an error; it never guesses. Callers fall back to the estimate on errors.
//!
//! Not covered (an error, so the estimate): media content parts (the engine adds
//! placeholder tokens the router cannot see). Models vLLM serves with
//! `--tokenizer-mode mistral` (mistral_common, not a Jinja template) are outside this
//! path altogether. Content
//! format "auto" is approximated: a template that loops over a message's `content`
//! gets the list of parts, any other the joined string.

use std::{
    io::Write,
    path::{Path, PathBuf},
};

use indexmap::IndexMap;
use minijinja::{Environment, Error, ErrorKind, Value, value::Kwargs};
use serde::Deserialize;

/// Name of the template used when a tokenizer names no other.
const DEFAULT: &str = "default";
/// Name transformers picks when the request carries tools and the tokenizer has it.
const TOOL_USE: &str = "tool_use";

/// Why a template could not be loaded or a request not rendered.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("cannot read `{path}`: {why}")]
    Read { path: PathBuf, why: String },
    #[error("`{path}`: {why}")]
    Config { path: PathBuf, why: String },
    #[error("chat template `{name}` from `{path}` does not compile: {why}")]
    Compile {
        name: String,
        path: PathBuf,
        why: String,
    },
    #[error("cannot render this request: {0}")]
    Request(String),
    #[error("chat template failed: {0}")]
    Render(String),
}

/// How message content reaches the template (vLLM's `chat_template_content_format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ContentFormat {
    /// Text parts joined with `\n` into one string.
    String,
    /// A list of `{"type": "text", "text": ...}` parts.
    OpenAi,
}

/// A model's chat template(s), compiled once at startup.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Names of the compiled templates (`default`, `tool_use`, ...).
    names: Vec<String>,
    formats: IndexMap<String, ContentFormat>,
    /// `bos_token`, `eos_token`, ... as template variables.
    special: IndexMap<String, String>,
    /// Where the template came from (for messages).
    pub source: PathBuf,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source", &self.source)
            .field("names", &self.names)
            .finish()
    }
}

fn read(path: &Path) -> Result<String, ChatError> {
    std::fs::read_to_string(path).map_err(|e| ChatError::Read {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// A special token in `tokenizer_config.json`: a string or an `AddedToken` object.
fn token_text(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// The chat template for the tokenizer at `tokenizer_json`: `explicit` if given,
    /// else `chat_template.jinja` beside it, else the `chat_template` field of
    /// `tokenizer_config.json` beside it (a string, or a list of named templates).
    /// Special tokens come from that `tokenizer_config.json` when it exists. `None`:
    /// there is no template anywhere.
    pub fn discover(
        tokenizer_json: &Path,
        explicit: Option<&Path>,
    ) -> Result<Option<ChatTemplate>, ChatError> {
        let dir = tokenizer_json.parent().unwrap_or(Path::new("."));
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: Option<serde_json::Value> = if cfg_path.is_file() {
            let text = read(&cfg_path)?;
            Some(serde_json::from_str(&text).map_err(|e| ChatError::Config {
                path: cfg_path.clone(),
                why: format!("not JSON: {e}"),
            })?)
        } else {
            None
        };
        // transformers also reads special_tokens_map.json; tokenizer_config.json wins.
        let map_path = dir.join("special_tokens_map.json");
        let token_map: Option<serde_json::Value> = if map_path.is_file() {
            Some(
                serde_json::from_str(&read(&map_path)?).map_err(|e| ChatError::Config {
                    path: map_path.clone(),
                    why: format!("not JSON: {e}"),
                })?,
            )
        } else {
            None
        };
        let mut special = IndexMap::new();
        for key in [
            "bos_token",
            "eos_token",
            "unk_token",
            "sep_token",
            "pad_token",
            "cls_token",
            "mask_token",
        ] {
            let found = [&cfg, &token_map]
                .into_iter()
                .flatten()
                .find_map(|src| src.get(key).and_then(token_text));
            if let Some(t) = found {
                special.insert(key.to_string(), t);
            }
        }
        let jinja_file = dir.join("chat_template.jinja");
        let (source, templates): (PathBuf, Vec<(String, String)>) = if let Some(p) = explicit {
            (p.to_path_buf(), vec![(DEFAULT.into(), read(p)?)])
        } else if jinja_file.is_file() {
            let t = read(&jinja_file)?;
            (jinja_file, vec![(DEFAULT.into(), t)])
        } else {
            let field = cfg.as_ref().and_then(|c| c.get("chat_template"));
            let bad = |why: &str| ChatError::Config {
                path: cfg_path.clone(),
                why: why.to_string(),
            };
            match field {
                None | Some(serde_json::Value::Null) => return Ok(None),
                Some(serde_json::Value::String(s)) => {
                    (cfg_path.clone(), vec![(DEFAULT.into(), s.clone())])
                }
                Some(serde_json::Value::Array(list)) => {
                    let mut out = Vec::new();
                    for item in list {
                        let name = item.get("name").and_then(|v| v.as_str());
                        let tpl = item.get("template").and_then(|v| v.as_str());
                        match (name, tpl) {
                            (Some(n), Some(t)) => out.push((n.to_string(), t.to_string())),
                            _ => {
                                return Err(bad(
                                    "each `chat_template` entry needs string `name` and `template`",
                                ));
                            }
                        }
                    }
                    if out.is_empty() {
                        return Err(bad("`chat_template` is an empty list"));
                    }
                    (cfg_path.clone(), out)
                }
                Some(_) => {
                    return Err(bad(
                        "`chat_template` must be a string or a list of {name, template}",
                    ));
                }
            }
        };
        Self::compile(source, templates, special).map(Some)
    }

    /// Compiles `templates` (name, source); `special` are the special-token variables.
    pub fn compile(
        source: PathBuf,
        templates: Vec<(String, String)>,
        special: IndexMap<String, String>,
    ) -> Result<ChatTemplate, ChatError> {
        let mut env = Environment::new();
        // transformers renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks,
        // lstrip_blocks); whitespace differences would change the token count.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Render(e.to_string()))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        let mut names = Vec::new();
        let mut formats = IndexMap::new();
        for (name, text) in templates {
            let text = generation_as_if(&text);
            formats.insert(name.clone(), detect_content_format(&text));
            env.add_template_owned(name.clone(), text)
                .map_err(|e| ChatError::Compile {
                    name: name.clone(),
                    path: source.clone(),
                    why: describe(&e),
                })?;
            names.push(name);
        }
        Ok(ChatTemplate {
            env,
            names,
            formats,
            special,
            source,
        })
    }

    /// Which template renders a request (transformers' choice): the only one; else
    /// `tool_use` when the request has tools and it exists; else `default`.
    fn pick(&self, has_tools: bool) -> Result<&str, ChatError> {
        if self.names.len() == 1 {
            return Ok(&self.names[0]);
        }
        let want = if has_tools && self.names.iter().any(|n| n == TOOL_USE) {
            TOOL_USE
        } else {
            DEFAULT
        };
        self.names
            .iter()
            .find(|n| n.as_str() == want)
            .map(String::as_str)
            .ok_or_else(|| {
                ChatError::Render(format!(
                    "no `{want}` template among {:?} in `{}`",
                    self.names,
                    self.source.display()
                ))
            })
    }

    /// Renders a `/v1/chat/completions` body. Returns the prompt text and whether it
    /// is tokenized with special tokens added (the request's `add_special_tokens`,
    /// false by default, as in vLLM).
    pub fn render_body(&self, body: &[u8]) -> Result<(String, bool), ChatError> {
        let req: ChatBody =
            serde_json::from_slice(body).map_err(|e| ChatError::Request(e.to_string()))?;
        let has_tools = req.tools.as_ref().is_some_and(|t| !t.is_none());
        let name = self.pick(has_tools)?;
        let format = self
            .formats
            .get(name)
            .copied()
            .unwrap_or(ContentFormat::String);
        let mut messages = Vec::with_capacity(req.messages.len());
        for (i, m) in req.messages.iter().enumerate() {
            messages.push(
                conversation_message(m, format)
                    .map_err(|why| ChatError::Request(format!("message {i}: {why}")))?,
            );
        }
        let final_content = messages
            .last()
            .map(|m| final_text(&m.get_attr("content").unwrap_or_default()));
        let tools = match req.tools {
            Some(t) if !t.is_none() => normalize_tools(&t).map_err(ChatError::Request)?,
            _ => Value::from(()),
        };
        let mut ctx: IndexMap<Value, Value> = IndexMap::new();
        for (k, v) in &self.special {
            ctx.insert(Value::from(k.as_str()), Value::from(v.as_str()));
        }
        // Template kwargs first so the fixed variables below win on a name clash.
        if let Some(kw) = &req.chat_template_kwargs
            && let Ok(keys) = kw.try_iter()
        {
            for k in keys {
                let v = kw.get_item(&k).unwrap_or_default();
                ctx.insert(k, v);
            }
        }
        ctx.insert(Value::from("messages"), Value::from(messages));
        ctx.insert(Value::from("tools"), tools);
        ctx.insert(
            Value::from("documents"),
            req.documents.unwrap_or(Value::from(())),
        );
        let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
        ctx.insert(
            Value::from("add_generation_prompt"),
            Value::from(add_generation_prompt),
        );
        let tpl = self
            .env
            .get_template(name)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        let mut text = tpl
            .render(Value::from(ctx))
            .map_err(|e| ChatError::Render(describe(&e)))?;
        if req.continue_final_message.unwrap_or(false) {
            // transformers: cut the render right after the final message's text, so
            // the model continues it instead of starting a new turn.
            let last = final_content.unwrap_or_default();
            let last = last.trim();
            match text.rfind(last) {
                Some(at) if !last.is_empty() => text.truncate(at + last.len()),
                _ => {
                    return Err(ChatError::Render(
                        "continue_final_message: the final message is not in the render".into(),
                    ));
                }
            }
        }
        Ok((text, req.add_special_tokens.unwrap_or(false)))
    }
}

/// The fields of a chat body the template sees; the rest is ignored.
#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<Value>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    documents: Option<Value>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
}

fn attr(v: &Value, key: &str) -> Option<Value> {
    v.get_attr(key)
        .ok()
        .filter(|x| !x.is_undefined() && !x.is_none())
}

/// The text of a content value (string, or the last text part).
fn final_text(content: &Value) -> String {
    if let Some(s) = content.as_str() {
        return s.to_string();
    }
    content
        .try_iter()
        .ok()
        .and_then(|parts| {
            parts
                .filter_map(|p| attr(&p, "text").and_then(|t| t.as_str().map(str::to_string)))
                .last()
        })
        .unwrap_or_default()
}

fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::from(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect::<IndexMap<Value, Value>>(),
    )
}

/// One request message as vLLM's `parse_chat_messages` hands it to the template:
/// `role`, `content` (joined text or text parts), then `tool_calls` (arguments
/// parsed to objects), `reasoning`/`reasoning_content`, `tool_call_id`, `name`, and
/// a developer message's `tools`.
fn conversation_message(m: &Value, format: ContentFormat) -> Result<Value, String> {
    let role = attr(m, "role")
        .and_then(|r| r.as_str().map(str::to_string))
        .ok_or("needs a string `role`")?;
    let mut texts: Vec<String> = Vec::new();
    match attr(m, "content") {
        None => {}
        Some(c) if c.as_str().is_some() => texts.push(c.as_str().unwrap_or_default().into()),
        Some(c) => {
            let parts = c
                .try_iter()
                .map_err(|_| "`content` must be a string or a list of parts")?;
            for p in parts {
                if let Some(s) = p.as_str() {
                    texts.push(s.to_string());
                    continue;
                }
                let kind = attr(&p, "type").and_then(|t| t.as_str().map(str::to_string));
                match kind.as_deref() {
                    Some("text" | "input_text" | "output_text") => {
                        // vLLM skips a text part without text.
                        if let Some(t) = attr(&p, "text") {
                            texts.push(t.as_str().ok_or("part `text` must be a string")?.into());
                        }
                    }
                    Some("refusal") => {
                        if let Some(t) = attr(&p, "refusal") {
                            texts.push(t.as_str().ok_or("`refusal` must be a string")?.into());
                        }
                    }
                    Some("thinking") => {
                        if let Some(t) = attr(&p, "thinking") {
                            texts.push(t.as_str().ok_or("`thinking` must be a string")?.into());
                        }
                    }
                    // Media parts add placeholders and engine-side tokens the router
                    // cannot count.
                    Some(other) => return Err(format!("content part type `{other}` is not text")),
                    None => return Err("content part without `type`".into()),
                }
            }
        }
    }
    let content = match format {
        ContentFormat::String => Value::from(texts.join("\n")),
        ContentFormat::OpenAi => Value::from(
            texts
                .into_iter()
                .map(|t| {
                    map(vec![
                        ("type", Value::from("text")),
                        ("text", Value::from(t)),
                    ])
                })
                .collect::<Vec<_>>(),
        ),
    };
    let mut out: Vec<(&str, Value)> =
        vec![("role", Value::from(role.as_str())), ("content", content)];
    match role.as_str() {
        "assistant" => {
            if let Some(calls) = attr(m, "tool_calls") {
                let calls: Vec<Value> = calls
                    .try_iter()
                    .map_err(|_| "`tool_calls` must be a list")?
                    .collect();
                // vLLM drops an empty list so templates take the plain assistant path.
                if !calls.is_empty() {
                    let mut fixed = Vec::with_capacity(calls.len());
                    for c in &calls {
                        fixed.push(tool_call(c)?);
                    }
                    out.push(("tool_calls", Value::from(fixed)));
                }
            }
            if let Some(r) = attr(m, "reasoning") {
                out.push(("reasoning", r.clone()));
                out.push(("reasoning_content", r));
            }
        }
        "tool" => {
            if let Ok(id) = m.get_attr("tool_call_id")
                && !id.is_undefined()
            {
                out.push(("tool_call_id", id));
            }
        }
        _ => {}
    }
    if let Some(n) = attr(m, "name").filter(|n| n.as_str().is_some()) {
        out.push(("name", n));
    }
    if role == "developer" {
        out.push(("tools", m.get_attr("tools").unwrap_or(Value::from(()))));
    }
    Ok(map(out))
}

/// Copies `v` (a map) with `key` replaced by `new`, keeping the key order.
fn replace_key(v: &Value, key: &str, new: Value) -> Result<Value, String> {
    let keys = v.try_iter().map_err(|_| "expected an object".to_string())?;
    let mut out: IndexMap<Value, Value> = IndexMap::new();
    for k in keys {
        let val = if k.as_str() == Some(key) {
            new.clone()
        } else {
            v.get_item(&k).unwrap_or_default()
        };
        out.insert(k, val);
    }
    out.entry(Value::from(key)).or_insert(new);
    Ok(Value::from(out))
}

/// A tool call with `function.arguments` parsed from its JSON string (empty → {}).
fn tool_call(c: &Value) -> Result<Value, String> {
    let Some(f) = attr(c, "function") else {
        return Ok(c.clone());
    };
    let args = match attr(&f, "arguments") {
        Some(a) if a.as_str().is_some_and(|s| !s.is_empty()) => {
            let s = a.as_str().unwrap_or_default();
            serde_json::from_str::<Value>(s)
                .map_err(|e| format!("tool call arguments are not JSON: {e}"))?
        }
        Some(a) if a.kind() == minijinja::value::ValueKind::Map => a,
        Some(a) if a.kind() == minijinja::value::ValueKind::Seq => a,
        _ => Value::from(IndexMap::<Value, Value>::new()),
    };
    let f = replace_key(&f, "arguments", args)?;
    replace_key(c, "function", f)
}

/// Tools as vLLM's pydantic models dump them: `type` (default `function`), then
/// `function` with `name`, `description`, `parameters` (null when absent) and any
/// extra keys, then the tool's extra keys.
fn normalize_tools(tools: &Value) -> Result<Value, String> {
    let list = tools.try_iter().map_err(|_| "`tools` must be a list")?;
    let mut out = Vec::new();
    for t in list {
        let f = attr(&t, "function").ok_or("each tool needs a `function`")?;
        if attr(&f, "name")
            .and_then(|n| n.as_str().map(str::to_string))
            .is_none()
        {
            return Err("each tool function needs a string `name`".into());
        }
        let mut func: IndexMap<Value, Value> = IndexMap::new();
        for k in ["name", "description", "parameters"] {
            func.insert(
                Value::from(k),
                f.get_attr(k)
                    .ok()
                    .filter(|v| !v.is_undefined())
                    .unwrap_or(Value::from(())),
            );
        }
        for k in f.try_iter().map_err(|_| "`function` must be an object")? {
            if !func.contains_key(&k) {
                let v = f.get_item(&k).unwrap_or_default();
                func.insert(k, v);
            }
        }
        let mut tool: IndexMap<Value, Value> = IndexMap::new();
        tool.insert(
            Value::from("type"),
            attr(&t, "type").unwrap_or(Value::from("function")),
        );
        tool.insert(Value::from("function"), Value::from(func));
        for k in t.try_iter().map_err(|_| "each tool must be an object")? {
            if !tool.contains_key(&k) {
                let v = t.get_item(&k).unwrap_or_default();
                tool.insert(k, v);
            }
        }
        out.push(Value::from(tool));
    }
    Ok(Value::from(out))
}

/// vLLM's "auto" content format, approximated: a template that loops over a
/// message's `content` wants the OpenAI list of parts; any other wants a string.
pub fn detect_content_format(template: &str) -> ContentFormat {
    let mut rest = template;
    while let Some(at) = rest.find("{%") {
        rest = &rest[at + 2..];
        let end = rest.find("%}").unwrap_or(rest.len());
        let tag = rest[..end].trim_start_matches(['-', '+']).trim();
        if let Some(body) = tag.strip_prefix("for ")
            && let Some((_, iterable)) = body.split_once(" in ")
            && iterable.contains("content")
        {
            return ContentFormat::OpenAi;
        }
        rest = &rest[end..];
    }
    ContentFormat::String
}

/// transformers' `{% generation %}...{% endgeneration %}` only marks assistant text
/// for training masks and renders its body unchanged: rewritten as `{% if true %}...
/// {% endif %}`, keeping the tags' whitespace control, so minijinja compiles it.
fn generation_as_if(template: &str) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find("{%") {
        out.push_str(&rest[..at]);
        let Some(len) = rest[at..].find("%}") else {
            // Unclosed: left as is for minijinja to report.
            out.push_str(&rest[at..]);
            return out;
        };
        let tag = &rest[at..at + len + 2];
        let inner = &tag[2..tag.len() - 2];
        let body = inner.trim_matches(['-', '+']).trim();
        let new = match body {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match new {
            Some(kw) => {
                out.push_str(&tag.replacen(body, kw, 1));
            }
            None => out.push_str(tag),
        }
        rest = &rest[at + len + 2..];
    }
    out.push_str(rest);
    out
}

/// The error and where in the template it happened (minijinja keeps the line).
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    s
}

fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, msg))
}

/// transformers' `strftime_now`: the local time formatted with a strftime pattern.
fn strftime_now(fmt: String) -> Result<Value, Error> {
    let now = jiff::Zoned::now();
    jiff::fmt::strtime::format(fmt.as_str(), &now)
        .map(Value::from)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: {e}")))
}

/// Python's `json.dumps` layout (transformers' `tojson`): `", "` and `": "` between
/// items without an indent, one item per line with one; keys in insertion order.
struct PyFormatter {
    item_sep: Vec<u8>,
    key_sep: Vec<u8>,
    indent: Option<Vec<u8>>,
    level: usize,
    has_value: bool,
}

impl PyFormatter {
    fn newline<W: ?Sized + Write>(&self, w: &mut W) -> std::io::Result<()> {
        if let Some(ind) = &self.indent {
            w.write_all(b"\n")?;
            for _ in 0..self.level {
                w.write_all(ind)?;
            }
        }
        Ok(())
    }
    fn open<W: ?Sized + Write>(&mut self, w: &mut W, c: &[u8]) -> std::io::Result<()> {
        self.level += 1;
        self.has_value = false;
        w.write_all(c)
    }
    fn close<W: ?Sized + Write>(&mut self, w: &mut W, c: &[u8]) -> std::io::Result<()> {
        self.level -= 1;
        if self.has_value {
            self.newline(w)?;
        }
        self.has_value = true;
        w.write_all(c)
    }
    fn item<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if !first {
            w.write_all(&self.item_sep)?;
        }
        self.newline(w)
    }
}

impl serde_json::ser::Formatter for PyFormatter {
    fn begin_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"[")
    }
    fn end_array<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"]")
    }
    fn begin_array_value<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn end_array_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.open(w, b"{")
    }
    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.close(w, b"}")
    }
    fn begin_object_key<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        self.item(w, first)
    }
    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(&self.key_sep)
    }
    fn end_object_value<W: ?Sized + Write>(&mut self, _w: &mut W) -> std::io::Result<()> {
        self.has_value = true;
        Ok(())
    }
}

/// `tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False)`
/// as transformers defines it (minijinja's own escapes `<`, `>`, `&`, `'` for HTML
/// and would change the prompt).
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(i) => Some(i),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent: Option<usize> = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(usize::try_from(v)?),
    };
    let ensure_ascii: bool = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys: bool = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([i, k]) => (i.clone(), k.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson: separators must be two strings",
            ));
        }
        // Python's json.dumps defaults: no trailing space after "," once indented.
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let fmt = PyFormatter {
        item_sep: item_sep.into_bytes(),
        key_sep: key_sep.into_bytes(),
        indent: indent.map(|n| vec![b' '; n]),
        level: 0,
        has_value: false,
    };
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, fmt);
    let res = if sort_keys {
        // serde_json's own map type is ordered by key (no preserve_order here).
        serde_json::to_value(&value).and_then(|v| serde::Serialize::serialize(&v, &mut ser))
    } else {
        serde::Serialize::serialize(&value, &mut ser)
    };
    res.map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut s = String::from_utf8(out)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    if ensure_ascii {
        let mut esc = String::with_capacity(s.len());
        for ch in s.chars() {
            if ch.is_ascii() {
                esc.push(ch);
            } else {
                let mut buf = [0u16; 2];
                for unit in ch.encode_utf16(&mut buf) {
                    esc.push_str(&format!("\\u{unit:04x}"));
                }
            }
        }
        s = esc;
    }
    Ok(Value::from_safe_string(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const LLAMA3: &str = include_str!("../tests/fixtures/chat/llama3.jinja");
    const QWEN25: &str = include_str!("../tests/fixtures/chat/qwen2.5.jinja");

    fn template(src: &str, special: &[(&str, &str)]) -> ChatTemplate {
        ChatTemplate::compile(
            PathBuf::from("test.jinja"),
            vec![(DEFAULT.into(), src.into())],
            special
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
        .unwrap()
    }

    fn render(t: &ChatTemplate, body: serde_json::Value) -> Result<String, ChatError> {
        t.render_body(&serde_json::to_vec(&body).unwrap())
            .map(|(s, _)| s)
    }

    #[test]
    fn llama3_renders_bos_headers_trimmed_content_and_the_generation_prompt() {
        let t = template(LLAMA3, &[("bos_token", "<|begin_of_text|>")]);
        let got = render(
            &t,
            json!({"model":"m","messages":[
                {"role":"system","content":"Be brief."},
                {"role":"user","content":"  Hi there \n"}]}),
        )
        .unwrap();
        assert_eq!(
            got,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );
        let no_prompt = render(
            &t,
            json!({"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false}),
        )
        .unwrap();
        assert_eq!(
            no_prompt,
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nx<|eot_id|>"
        );
    }

    #[test]
    fn chatml_renders_system_default_and_joined_text_parts() {
        let t = template(QWEN25, &[]);
        assert_eq!(
            render(
                &t,
                json!({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}]})
            )
            .unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        // vLLM joins text parts with a newline for string-content templates.
        assert_eq!(
            render(
                &t,
                json!({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})
            )
            .unwrap(),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
             <|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn chatml_tools_and_tool_calls_render_like_vllm_in_the_clients_key_order() {
        let t = template(QWEN25, &[]);
        // Keys deliberately out of alphabetical order: Python keeps insertion order.
        let body = r#"{"model":"m","tools":[{"type":"function","function":{"name":"get_weather",
            "parameters":{"type":"object","properties":{"unit":{"type":"string"},"city":{"type":"string"}}}}}],
            "messages":[{"role":"user","content":"Weather in Paris?"},
              {"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function",
                "function":{"name":"get_weather","arguments":"{\"unit\": \"c\", \"city\": \"Paris\"}"}}]},
              {"role":"tool","tool_call_id":"c1","content":"21"}]}"#;
        let (got, special) = t.render_body(body.as_bytes()).unwrap();
        assert!(
            !special,
            "chat prompts are tokenized without added specials"
        );
        let want = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n\
# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n\
{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"description\": null, \"parameters\": \
{\"type\": \"object\", \"properties\": {\"unit\": {\"type\": \"string\"}, \"city\": {\"type\": \"string\"}}}}}\n</tools>\n\n\
For each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n\
<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n\
<|im_start|>user\nWeather in Paris?<|im_end|>\n\
<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"unit\": \"c\", \"city\": \"Paris\"}}\n</tool_call><|im_end|>\n\
<|im_start|>user\n<tool_response>\n21\n</tool_response><|im_end|>\n<|im_start|>assistant\n";
        assert_eq!(got, want);
    }

    #[test]
    fn what_cannot_be_rendered_is_an_error_not_a_guess() {
        let t = template(QWEN25, &[]);
        let image = render(
            &t,
            json!({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}),
        )
        .unwrap_err();
        assert!(image.to_string().contains("image_url"), "{image}");
        let no_role = render(&t, json!({"messages":[{"content":"x"}]})).unwrap_err();
        assert!(no_role.to_string().contains("role"), "{no_role}");
        let strict = template(
            "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}ok",
            &[],
        );
        let e = render(
            &strict,
            json!({"messages":[{"role":"system","content":"x"}]}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("first must be user"), "{e}");
        assert_eq!(
            render(&strict, json!({"messages":[{"role":"user","content":"x"}]})).unwrap(),
            "ok"
        );
    }

    #[test]
    fn python_helpers_hf_templates_use() {
        let t = template(
            "{{ messages[0].content.strip() }}|{{ messages[0].content.split(',')[1] }}|\
             {{ {'b': 1, 'a': [1, 2]} | tojson }}|{{ {'b': 1, 'a': []} | tojson(indent=2) }}|\
             {{ 'é<&>' | tojson }}|{{ 'é' | tojson(ensure_ascii=true) }}|\
             {% for m in messages %}{% if loop.first %}{% continue %}{% endif %}{{ m.role }}{% endfor %}",
            &[],
        );
        let got = render(
            &t,
            json!({"messages":[{"role":"user","content":" a,b "},{"role":"assistant","content":"y"}]}),
        )
        .unwrap();
        assert_eq!(
            got,
            "a,b|b |{\"b\": 1, \"a\": [1, 2]}|{\n  \"b\": 1,\n  \"a\": []\n}|\"é<&>\"|\"\\u00e9\"|assistant"
        );
        let date = template("{{ strftime_now('%Y') }}", &[]);
        let year = render(&date, json!({"messages":[{"role":"user","content":"x"}]})).unwrap();
        assert_eq!(year, jiff::Zoned::now().year().to_string());
    }

    #[test]
    fn qwen3_and_llama31_idioms_render() {
        // Constructs from the Qwen3 and Llama 3.1 templates: reversed slices,
        // namespace(), `is string`, Python string methods, `| items`, tojson(indent).
        let t = template(
            "{%- set ns = namespace(last_user=-1) %}\
             {%- for m in messages[::-1] %}{%- set i = (messages|length - 1) - loop.index0 %}\
             {%- if ns.last_user < 0 and m.role == 'user' %}{%- set ns.last_user = i %}{%- endif %}{%- endfor %}\
             last user {{ ns.last_user }};\
             {%- for m in messages %}{%- if m.content is string and '</think>' in m.content %}\
             {{ m.content.split('</think>')[-1].lstrip('\\n') }}{%- endif %}{%- endfor %};\
             {%- for c in messages[1].tool_calls %}{%- for k, v in c.function.arguments | items %}{{ k }}={{ v }},{%- endfor %}{%- endfor %};\
             {{- tools[0] | tojson(indent=4) }}",
            &[],
        );
        let got = render(
            &t,
            json!({"tools":[{"type":"function","function":{"name":"f"}}],
                   "messages":[{"role":"user","content":"q"},
                   {"role":"assistant","content":"<think>hm</think>\n\nA","tool_calls":[{"type":"function","function":{"name":"f","arguments":"{\"b\": 2, \"a\": 1}"}}]},
                   {"role":"user","content":"again"}]}),
        )
        .unwrap();
        assert_eq!(
            got,
            "last user 2;A;b=2,a=1,;{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"f\",\n        \"description\": null,\n        \"parameters\": null\n    }\n}"
        );
    }

    #[test]
    fn continue_final_message_stops_after_its_text() {
        let t = template(QWEN25, &[]);
        let got = render(
            &t,
            json!({"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hel"}],
                   "add_generation_prompt":false,"continue_final_message":true}),
        )
        .unwrap();
        assert!(got.ends_with("<|im_start|>assistant\nHel"), "{got:?}");
    }

    #[test]
    fn content_format_follows_whether_the_template_loops_over_content() {
        assert_eq!(detect_content_format(QWEN25), ContentFormat::String);
        assert_eq!(detect_content_format(LLAMA3), ContentFormat::String);
        let vl = "{% for m in messages %}{%- for part in m['content'] %}{{ part.text }}{% endfor %}{% endfor %}";
        assert_eq!(detect_content_format(vl), ContentFormat::OpenAi);
        let t = template(vl, &[]);
        assert_eq!(
            render(
                &t,
                json!({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
                                   {"role":"user","content":"c"}]})
            )
            .unwrap(),
            "abc"
        );
    }

    #[test]
    fn named_templates_pick_tool_use_when_tools_are_given() {
        let t = ChatTemplate::compile(
            PathBuf::from("x"),
            vec![
                ("default".into(), "plain".into()),
                ("tool_use".into(), "tools".into()),
            ],
            IndexMap::new(),
        )
        .unwrap();
        let msgs = json!([{"role":"user","content":"x"}]);
        assert_eq!(render(&t, json!({"messages": msgs})).unwrap(), "plain");
        assert_eq!(
            render(
                &t,
                json!({"messages": msgs, "tools":[{"type":"function","function":{"name":"f"}}]})
            )
            .unwrap(),
            "tools"
        );
    }

    #[test]
    fn discovery_prefers_chat_template_jinja_and_reads_special_tokens_from_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let tok = dir.path().join("tokenizer.json");
        let none = ChatTemplate::discover(&tok, None).unwrap();
        assert!(none.is_none(), "no template anywhere");
        std::fs::write(
            dir.path().join("tokenizer_config.json"),
            r#"{"chat_template": "config:{{ bos_token }}{{ eos_token }}", "eos_token": "</s>"}"#,
        )
        .unwrap();
        // An AddedToken object, as transformers writes it.
        std::fs::write(
            dir.path().join("special_tokens_map.json"),
            r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "<ignored>"}"#,
        )
        .unwrap();
        let body = json!({"messages":[{"role":"user","content":"x"}]});
        let t = ChatTemplate::discover(&tok, None).unwrap().unwrap();
        assert_eq!(render(&t, body.clone()).unwrap(), "config:<s></s>");
        std::fs::write(
            dir.path().join("chat_template.jinja"),
            "jinja:{{ bos_token }}",
        )
        .unwrap();
        let t = ChatTemplate::discover(&tok, None).unwrap().unwrap();
        assert_eq!(render(&t, body).unwrap(), "jinja:<s>");
        assert!(t.source.ends_with("chat_template.jinja"));
    }

    #[test]
    fn generation_tags_render_their_body_unchanged() {
        let t = template(
            "{% for m in messages %}[{%- generation -%}\n {{ m.content }} {%- endgeneration %}]{% endfor %}",
            &[],
        );
        let got = render(&t, json!({"messages":[{"role":"assistant","content":"a"}]})).unwrap();
        assert_eq!(got, "[a]");
        assert_eq!(
            generation_as_if("x{%- generation %}y{% endgeneration -%}"),
            "x{%- if true %}y{% endif -%}"
        );
        assert_eq!(
            generation_as_if("{{ a }}{% if b %}c{% endif %}"),
            "{{ a }}{% if b %}c{% endif %}"
        );
        assert_eq!(generation_as_if("unclosed {% tag"), "unclosed {% tag");
    }

    #[test]
    fn a_template_that_does_not_compile_names_its_file() {
        let e = ChatTemplate::compile(
            PathBuf::from("/models/x/tokenizer_config.json"),
            vec![(DEFAULT.into(), "{% for m in messages %}".into())],
            IndexMap::new(),
        )
        .unwrap_err();
        let s = e.to_string();
        assert!(
            s.contains("/models/x/tokenizer_config.json") && s.contains("does not compile"),
            "{s}"
        );
    }
}

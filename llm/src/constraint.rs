//! Constrained decoding (structured output) through `llguidance`: a [`ConstraintCompiler`]
//! holds the token trie of one tokenizer (built once per pipeline or engine, every token id's
//! raw bytes, special tokens marked) and compiles a [`ResponseFormat`] into a [`Constraint`],
//! the shared compiled grammar. Each generation starts its own [`ConstraintState`] from it,
//! which gives the allowed tokens of every step, consumes the chosen one and says when the
//! grammar is complete. Failing closed: a grammar that does not compile, a step that allows no
//! token, or a token the grammar rejects is an [`LlmError::Constraint`], never unconstrained
//! output.

use std::fmt;
use std::sync::Arc;

use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory, TokenParser};
use serde_json::{json, Value};

use crate::error::LlmError;
use crate::tokenizer::Tokenizer;

/// What a reply must be.
#[derive(Clone, Debug, PartialEq)]
pub enum ResponseFormat {
    /// Any JSON object (OpenAI's `json_object`).
    JsonObject,
    /// JSON valid under `schema` (OpenAI's `json_schema`). Both values of `strict` enforce the
    /// schema fully: OpenAI's `strict: false` promises less, never more.
    JsonSchema { schema: Value, strict: bool },
    /// A grammar in llguidance's Lark syntax: quoted literals match text (a non-special added
    /// token such as Qwen's `<tool_call>` is text), `<|im_end|>` unquoted matches a special
    /// token, `<[151657]>` a token id, and `%json { schema }` embeds a JSON schema.
    Lark(String),
}

impl ResponseFormat {
    fn describe(&self) -> &'static str {
        match self {
            ResponseFormat::JsonObject => "json_object",
            ResponseFormat::JsonSchema { .. } => "json_schema",
            ResponseFormat::Lark(_) => "lark grammar",
        }
    }
}

/// llguidance's JSON options when a schema gives none (`x-guidance`): whitespace as Python's
/// `json.dumps` writes it and nowhere else, so a model cannot pad the reply with whitespace
/// forever, and replies read as models are trained to write them.
fn json_options() -> Value {
    json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
}

/// The tokenizer as llguidance sees it: the trie, and canonical tokenization of forced text.
struct Env {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // Text that is not UTF-8 (or that the tokenizer refuses) falls back to the trie's
        // greedy tokenization, which is still a valid spelling of the bytes.
        std::str::from_utf8(s)
            .ok()
            .and_then(|text| self.tokenizer.encode(text, false).ok())
            .map(|enc| enc.get_ids().to_vec())
            .unwrap_or_else(|| self.trie.greedy_tokenize(s))
    }
}

/// Every token id's raw bytes, for `vocab_size` ids (the model's logits width): special added
/// tokens as llguidance's marker byte 0xFF then their text (so only a grammar's `<|name|>`
/// matches them, never text), other tokens as [`Tokenizer::token_bytes`] gives them (added
/// tokens' text, vocabulary tokens through the byte-level alphabet); ids without a token
/// (padding past the tokenizer) get no bytes, which no grammar allows.
fn token_bytes(tokenizer: &Tokenizer, vocab_size: usize) -> Result<Vec<Vec<u8>>, LlmError> {
    let inner = tokenizer.inner();
    if !matches!(inner.get_decoder(), Some(tokenizers::DecoderWrapper::ByteLevel(_))) {
        return Err(LlmError::Constraint(
            "constrained decoding needs a byte-level BPE tokenizer (as Qwen's): this tokenizer's decoder is not ByteLevel"
                .into(),
        ));
    }
    let added = inner.get_added_tokens_decoder();
    let mut words = Vec::with_capacity(vocab_size);
    for id in 0..vocab_size as u32 {
        let bytes = match added.get(&id) {
            Some(token) if token.special => {
                let mut bytes = Vec::with_capacity(token.content.len() + 1);
                bytes.push(TokTrie::SPECIAL_TOKEN_MARKER);
                bytes.extend_from_slice(token.content.as_bytes());
                bytes
            }
            _ => tokenizer.token_bytes(id).unwrap_or_default(),
        };
        words.push(bytes);
    }
    Ok(words)
}

/// Compiles response formats against one tokenizer; share it (`Arc`) across requests.
pub struct ConstraintCompiler {
    factory: ParserFactory,
    vocab_size: usize,
}

impl fmt::Debug for ConstraintCompiler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConstraintCompiler({} tokens)", self.vocab_size)
    }
}

impl ConstraintCompiler {
    /// The trie of `tokenizer` over `vocab_size` ids (the model's logits width, at least the
    /// tokenizer's ids), with `eos_token_ids` (the generation config's) as the tokens that end
    /// a reply once the grammar accepts. Errors: a tokenizer that is not byte-level, no EOS id,
    /// an EOS id outside the vocabulary.
    pub fn new(
        tokenizer: &Tokenizer,
        eos_token_ids: &[u32],
        vocab_size: usize,
    ) -> Result<ConstraintCompiler, LlmError> {
        let Some(&first_eos) = eos_token_ids.first() else {
            return Err(LlmError::Constraint("constrained decoding needs an EOS token id".into()));
        };
        if let Some(bad) = eos_token_ids.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(LlmError::Constraint(format!("EOS token id {bad} is outside the vocabulary ({vocab_size})")));
        }
        let vocab = u32::try_from(vocab_size)
            .map_err(|_| LlmError::Constraint(format!("a vocabulary of {vocab_size} tokens is too large")))?;
        let words = token_bytes(tokenizer, vocab_size)?;
        let info = TokRxInfo::new(vocab, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos_token_ids);
        let env: TokEnv = Arc::new(Env { trie, tokenizer: tokenizer.inner().clone() });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|e| LlmError::Constraint(format!("building the token trie: {e}")))?;
        // Errors come back as values; nothing goes to standard error.
        factory.quiet();
        Ok(ConstraintCompiler { factory, vocab_size })
    }

    /// [`ConstraintCompiler::new`] for `pipeline`'s tokenizer, model vocabulary and default EOS
    /// ids.
    pub fn for_pipeline(pipeline: &crate::pipeline::Pipeline) -> Result<ConstraintCompiler, LlmError> {
        ConstraintCompiler::new(
            pipeline.tokenizer(),
            &pipeline.loaded.default_eos_token_ids,
            pipeline.model().config().vocab_size,
        )
    }

    /// The ids a mask covers (the model's vocabulary).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Compile `format`. Errors name what is wrong: a schema that is not an object, a keyword
    /// llguidance does not support, a grammar that does not parse, or one that allows no reply.
    pub fn compile(&self, format: &ResponseFormat) -> Result<Constraint, LlmError> {
        let what = format.describe();
        let grammar = match format {
            ResponseFormat::JsonObject => json_grammar(json!({"type": "object"})),
            ResponseFormat::JsonSchema { schema, .. } => {
                let Value::Object(map) = schema else {
                    return Err(LlmError::Constraint(format!("{what}: the schema must be a JSON object")));
                };
                json_grammar(Value::Object(map.clone()))
            }
            ResponseFormat::Lark(text) => TopLevelGrammar::from_lark(text.clone()),
        };
        // llguidance reports most problems as errors; panics are caught as well, so none
        // crosses this boundary.
        let factory = &self.factory;
        let parser =
            llguidance::panic_utils::catch_unwind(std::panic::AssertUnwindSafe(|| factory.create_parser(grammar)))
                .map_err(|e| LlmError::Constraint(format!("{what}: {}", first_line(&e.to_string()))))?;
        let constraint = Constraint { inner: Arc::new(Compiled { parser, what, vocab_size: self.vocab_size }) };
        // Some problems (a lexer too complex, an unsatisfiable start) show only at the first
        // mask: find them now, before any request runs.
        let mut state = constraint.start()?;
        state.mask()?;
        Ok(constraint)
    }
}

/// `text` as a literal of a Lark grammar ([`ResponseFormat::Lark`]): a JSON string, which
/// llguidance's Lark reads with the same escapes.
pub fn lark_literal(text: &str) -> String {
    Value::from(text).to_string()
}

/// `schema` as a `%json { ... }` item of a Lark grammar, with the whitespace of
/// [`ResponseFormat::JsonSchema`] unless the schema sets llguidance's own options. A forced
/// tool call, for example: `start: "<tool_call>\n" %json {...} "\n</tool_call>"`.
pub fn lark_json(schema: &Value) -> String {
    let mut schema = schema.clone();
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_options);
    }
    format!("%json {schema}")
}

/// A JSON-schema grammar with our whitespace unless the schema sets llguidance's own options.
fn json_grammar(mut schema: Value) -> TopLevelGrammar {
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_options);
    }
    TopLevelGrammar {
        grammars: vec![GrammarWithLexer { json_schema: Some(schema), ..Default::default() }],
        max_tokens: None,
    }
}

/// llguidance's errors may append the grammar and parser state: keep the message.
fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s).trim()
}

struct Compiled {
    /// Fresh (not started): each request starts a clone.
    parser: TokenParser,
    what: &'static str,
    vocab_size: usize,
}

/// A compiled response format, shared by the requests that use it (cloning is cheap).
#[derive(Clone)]
pub struct Constraint {
    inner: Arc<Compiled>,
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Constraint({})", self.inner.what)
    }
}

/// The same compiled grammar (there is no cheaper sound comparison of grammars).
impl PartialEq for Constraint {
    fn eq(&self, other: &Constraint) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl Constraint {
    /// A generation's own matcher state, at the start of the reply.
    pub fn start(&self) -> Result<ConstraintState, LlmError> {
        let matcher = Matcher::new(Ok(self.inner.parser.clone()));
        if let Some(e) = matcher.get_error() {
            return Err(LlmError::Constraint(format!("{}: {}", self.inner.what, first_line(&e))));
        }
        Ok(ConstraintState { matcher, what: self.inner.what, vocab_size: self.inner.vocab_size, mask: None, steps: 0 })
    }

    /// The ids its masks cover.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }
}

/// One generation's progress through its grammar.
pub struct ConstraintState {
    matcher: Matcher,
    what: &'static str,
    vocab_size: usize,
    /// This step's allowed tokens, once computed.
    mask: Option<Vec<bool>>,
    /// Tokens consumed.
    steps: usize,
}

impl ConstraintState {
    fn error(&self, what: impl fmt::Display) -> LlmError {
        LlmError::Constraint(format!("{} after {} token(s): {what}", self.what, self.steps))
    }

    /// Which token ids may come next (`vocab_size` entries). An error when the grammar is in an
    /// error state, finished, or allows no token at all.
    pub fn mask(&mut self) -> Result<&[bool], LlmError> {
        if self.mask.is_none() {
            if self.matcher.is_stopped() {
                return Err(self.error("the grammar is complete: no token may follow"));
            }
            let vob = self.matcher.compute_mask().map_err(|e| self.error(first_line(&e.to_string())))?;
            let mut mask = vec![false; self.vocab_size];
            vob.iter_set_entries(|i| {
                if let Some(m) = mask.get_mut(i) {
                    *m = true;
                }
            });
            if !mask.contains(&true) {
                return Err(self.error("the grammar allows no token here"));
            }
            self.mask = Some(mask);
        }
        Ok(self.mask.as_deref().unwrap_or(&[]))
    }

    /// Set `-inf` in `adjustment` (a step's additive logit adjustment, the model's logits
    /// width) at every id the grammar does not allow now, ids past the mask included.
    pub(crate) fn apply_mask(&mut self, adjustment: &mut [f32]) -> Result<(), LlmError> {
        let mask = self.mask()?;
        let mut allowed = 0;
        for (i, d) in adjustment.iter_mut().enumerate() {
            if mask.get(i).copied().unwrap_or(false) {
                allowed += 1;
            } else {
                *d = f32::NEG_INFINITY;
            }
        }
        if allowed == 0 {
            let width = adjustment.len();
            return Err(self.error(format!("the grammar allows no token among the model's {width} logits")));
        }
        Ok(())
    }

    /// Advance past `token` (the one chosen). An error when the grammar does not allow it.
    pub fn consume(&mut self, token: u32) -> Result<(), LlmError> {
        if let Some(mask) = &self.mask {
            if !mask.get(token as usize).copied().unwrap_or(false) {
                return Err(self.error(format!("token {token} is not allowed here")));
            }
        }
        self.matcher.consume_token(token).map_err(|e| self.error(first_line(&e.to_string())))?;
        self.mask = None;
        self.steps += 1;
        Ok(())
    }

    /// Whether the grammar is complete and nothing may follow (not even more whitespace): the
    /// generation must end here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the reply so far is a complete match (EOS would be allowed).
    pub fn is_accepting(&mut self) -> Result<bool, LlmError> {
        self.matcher.is_accepting().map_err(|e| self.error(first_line(&e.to_string())))
    }
}

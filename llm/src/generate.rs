//! Generation settings and results: `GreedyGenerationConfig` /
//! `SamplingGenerationConfig`, RuvLLM-style [`GenerateParams`] (stop sequences, repetition
//! penalty), [`GeneratedText`], and the streaming text splitter.

use crate::constraint::Constraint;
use crate::error::LlmError;

/// Greedy (maximum-logit) decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GreedyGenerationConfig {
    pub max_new_tokens: usize,
    /// Generation stops after emitting any of these (the pipeline's `loaded.default_eos_token_ids`
    /// are the model's).
    pub eos_token_ids: Vec<u32>,
}

/// Temperature, top-k, top-p and min-p sampling (applied in that order, as vLLM does).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Logits are divided by it; must be positive (use greedy generation for maximum-logit
    /// decoding).
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; `0` keeps all.
    pub top_k: usize,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p`, in `(0, 1]`.
    pub top_p: f32,
    /// The random stream; `None` draws a seed from the clock. A seed fixes the sequence of
    /// draws, not numerical agreement across backends.
    pub seed: Option<u64>,
    /// After top-p, drop tokens whose probability is below `min_p` × the largest one's, in
    /// `[0, 1]`; `0` is off.
    pub min_p: f32,
}

impl Default for SamplingConfig {
    fn default() -> SamplingConfig {
        SamplingConfig { temperature: 1.0, top_k: 0, top_p: 1.0, seed: None, min_p: 0.0 }
    }
}

/// Sampled decoding.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingGenerationConfig {
    pub max_new_tokens: usize,
    pub eos_token_ids: Vec<u32>,
    pub sampling: SamplingConfig,
}

/// Every generation setting (RuvLLM's `GenerateParams`): greedy when `sampling` is `None`.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerateParams {
    pub max_new_tokens: usize,
    pub eos_token_ids: Vec<u32>,
    pub sampling: Option<SamplingConfig>,
    /// Generation stops when the generated text contains one of these; the reply ends before it.
    pub stop_sequences: Vec<String>,
    /// transformers' `repetition_penalty`: the logit of every token already in the prompt or the
    /// reply is divided by it when positive, multiplied when negative. `1.0` is off.
    pub repetition_penalty: f32,
    /// OpenAI's `presence_penalty` (-2 to 2): subtracted once from the logit of every token the
    /// reply holds, after the repetition penalty. `0.0` is off.
    pub presence_penalty: f32,
    /// OpenAI's `frequency_penalty` (-2 to 2): subtracted from a token's logit once per time the
    /// reply holds it. `0.0` is off.
    pub frequency_penalty: f32,
    /// OpenAI's `logit_bias`: `(token id, bias in -100..=100)` added to that token's logit after
    /// the penalties, before temperature (-100 bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// A compiled response format ([`crate::ConstraintCompiler::compile`]): every token is
    /// chosen among those its grammar allows (after the penalties and bias, before sampling),
    /// and generation ends when the grammar is complete ([`StopReason::Grammar`]). Each
    /// generation runs its own matcher over the shared grammar.
    pub constraint: Option<Constraint>,
    /// `Some(n)`: report each generated token's [`TokenLogprobs`] with the `n` most likely
    /// tokens (`n` ≤ [`MAX_TOP_LOGPROBS`]); `None` (the default) computes nothing.
    pub logprobs: Option<usize>,
}

/// The most top tokens [`GenerateParams::logprobs`] asks for (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = ruda_ops::api::LOGPROBS_MAX_TOP;

/// The log-probabilities of one generated token: the log-softmax of the model's raw logits at
/// that step (before penalties, bias and temperature, as vLLM's default `raw_logprobs`), in f32.
/// A step whose logits hold a NaN or an infinity has NaN values (see `ruda_ops`' `logprobs`).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The chosen token and its log-probability.
    pub token: u32,
    pub logprob: f32,
    /// The `n` most likely tokens, most likely first (ties to the lower id).
    pub top: Vec<(u32, f32)>,
}

impl Default for GenerateParams {
    fn default() -> GenerateParams {
        GenerateParams {
            max_new_tokens: 32,
            eos_token_ids: Vec::new(),
            sampling: None,
            stop_sequences: Vec::new(),
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            logit_bias: Vec::new(),
            logprobs: None,
            constraint: None,
        }
    }
}

impl From<GreedyGenerationConfig> for GenerateParams {
    fn from(c: GreedyGenerationConfig) -> GenerateParams {
        GenerateParams { max_new_tokens: c.max_new_tokens, eos_token_ids: c.eos_token_ids, ..Default::default() }
    }
}

impl From<SamplingGenerationConfig> for GenerateParams {
    fn from(c: SamplingGenerationConfig) -> GenerateParams {
        GenerateParams {
            max_new_tokens: c.max_new_tokens,
            eos_token_ids: c.eos_token_ids,
            sampling: Some(c.sampling),
            ..Default::default()
        }
    }
}

impl GenerateParams {
    /// [`validate`](Self::validate), and every `logit_bias` token id inside a vocabulary of
    /// `vocab_size` (checked when a request is queued, so a bad id is that request's error and
    /// never fails a batch it would have joined).
    pub(crate) fn validate_for(&self, vocab_size: usize) -> Result<(), LlmError> {
        self.validate()?;
        if let Some((id, _)) = self.logit_bias.iter().find(|(id, _)| *id as usize >= vocab_size) {
            return Err(LlmError::InvalidArgument(format!(
                "logit_bias: token id {id} is outside the vocabulary ({vocab_size})"
            )));
        }
        Ok(())
    }

    /// Reject settings that cannot generate.
    pub(crate) fn validate(&self) -> Result<(), LlmError> {
        let bad = |m: String| Err(LlmError::InvalidArgument(m));
        if self.max_new_tokens == 0 {
            return bad("max_new_tokens must be at least 1".into());
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!("repetition_penalty must be finite and positive, got {}", self.repetition_penalty));
        }
        if self.stop_sequences.iter().any(String::is_empty) {
            return bad("stop sequences must not be empty".into());
        }
        for (name, v) in [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(format!("{name} must be in -2..=2, got {v}"));
            }
        }
        if let Some((id, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return bad(format!("logit_bias of token {id} must be in -100..=100, got {b}"));
        }
        if let Some(n) = self.logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            return bad(format!("logprobs asks for {n} top tokens, at most {MAX_TOP_LOGPROBS} are offered"));
        }
        if let Some(s) = &self.sampling {
            if !(s.temperature.is_finite() && s.temperature > 0.0) {
                return bad(format!(
                    "temperature must be finite and positive, got {} (use greedy generation for maximum-logit decoding)",
                    s.temperature
                ));
            }
            if !(s.top_p > 0.0 && s.top_p <= 1.0) {
                return bad(format!("top_p must be in (0, 1], got {}", s.top_p));
            }
            if !(0.0..=1.0).contains(&s.min_p) {
                return bad(format!("min_p must be in [0, 1], got {}", s.min_p));
            }
            if u32::try_from(s.top_k).is_err() {
                return bad(format!("top_k = {} is too large", s.top_k));
            }
        }
        Ok(())
    }
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An EOS token was generated (it is the last of `generated_token_ids`).
    Eos,
    /// `max_new_tokens` were generated.
    Length,
    /// The reply reached a stop sequence (cut before it).
    StopSequence,
    /// The streaming callback asked to stop.
    Callback,
    /// The response format's grammar is complete and allows nothing more (no EOS token was
    /// generated).
    Grammar,
}

impl StopReason {
    /// `eos`, `length`, `stop_sequence`, `callback` or `grammar`.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Eos => "eos",
            StopReason::Length => "length",
            StopReason::StopSequence => "stop_sequence",
            StopReason::Callback => "callback",
            StopReason::Grammar => "grammar",
        }
    }
}

/// What a streaming callback wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamControl {
    Continue,
    Stop,
}

/// The result of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct GeneratedText {
    /// The prompt and the reply, decoded together.
    pub text: String,
    /// The reply alone.
    pub generated_text: String,
    pub prompt_token_ids: Vec<u32>,
    /// Every generated token, including a final EOS.
    pub generated_token_ids: Vec<u32>,
    pub stopped_on_eos: bool,
    pub stop_reason: StopReason,
    /// From the start of the prompt's forward pass to the first token chosen.
    pub prefill_ms: f64,
    /// Tokens after the first per second of decoding (0 when only one token was generated).
    pub decode_tokens_per_second: f64,
    /// With [`GenerateParams::logprobs`], one entry per generated token (else empty).
    pub logprobs: Vec<TokenLogprobs>,
}

/// Splits a growing reply into streamable pieces: never inside a UTF-8 character (a decoded
/// reply that ends in U+FFFD is waiting for the rest of a character's bytes) and never into
/// text that may turn out to start a stop sequence.
pub(crate) struct TextStream<'a> {
    stop_sequences: &'a [String],
    /// Bytes of the reply already handed out.
    emitted: usize,
}

impl<'a> TextStream<'a> {
    pub(crate) fn new(stop_sequences: &'a [String]) -> TextStream<'a> {
        TextStream { stop_sequences, emitted: 0 }
    }

    /// A stream whose first `emitted` bytes were handed out already.
    pub(crate) fn resuming(stop_sequences: &'a [String], emitted: usize) -> TextStream<'a> {
        TextStream { stop_sequences, emitted }
    }

    /// Where the reply `text` ends at its first stop sequence, if it contains one.
    pub(crate) fn stop_at(&self, text: &str) -> Option<usize> {
        self.stop_sequences.iter().filter_map(|s| text.find(s.as_str())).min()
    }

    /// The new piece of `text` (the whole reply so far) that is safe to hand out, or `""`.
    /// With `finished`, everything not yet handed out.
    pub(crate) fn next<'t>(&mut self, text: &'t str, finished: bool) -> &'t str {
        if !text.is_char_boundary(self.emitted) || self.emitted > text.len() {
            // The decoded prefix changed under us (a tokenizer that rewrites earlier text):
            // hold everything until it settles.
            return "";
        }
        let mut end = text.len();
        if !finished {
            end = text.trim_end_matches('\u{FFFD}').len();
            // Hold back the longest tail that a stop sequence could start with.
            let held = self
                .stop_sequences
                .iter()
                .flat_map(|s| (1..s.len()).filter(|&n| s.is_char_boundary(n)).map(move |n| &s[..n]))
                .filter(|prefix| text[..end].ends_with(prefix))
                .map(str::len)
                .max()
                .unwrap_or(0);
            end -= held;
        }
        if end <= self.emitted {
            return "";
        }
        let piece = &text[self.emitted..end];
        self.emitted = end;
        piece
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream_all(pieces: &[&str], stops: &[String]) -> Vec<String> {
        let mut s = TextStream::new(stops);
        let mut out = Vec::new();
        for (i, text) in pieces.iter().enumerate() {
            let piece = s.next(text, i + 1 == pieces.len());
            if !piece.is_empty() {
                out.push(piece.to_string());
            }
        }
        out
    }

    #[test]
    fn incomplete_characters_are_held_back() {
        // "é" arriving one byte at a time decodes as U+FFFD first.
        let out = stream_all(&["ab", "ab\u{FFFD}", "abé", "abéc"], &[]);
        assert_eq!(out, ["ab", "é", "c"]);
    }

    #[test]
    fn stop_sequence_prefixes_are_held_back() {
        let stops = vec!["END".to_string()];
        let out = stream_all(&["x", "xE", "xEN", "xENx", "xENxy"], &stops);
        assert_eq!(out, ["x", "ENx", "y"]);
        assert_eq!(TextStream::new(&stops).stop_at("abENDc"), Some(2));
        assert_eq!(TextStream::new(&stops).stop_at("abEN"), None);
    }

    #[test]
    fn the_end_flushes_everything() {
        let stops = vec!["END".to_string()];
        assert_eq!(stream_all(&["aE"], &stops), ["aE"]);
        assert_eq!(stream_all(&["a", "a\u{FFFD}"], &[]), ["a", "\u{FFFD}"]);
    }

    #[test]
    fn invalid_settings_are_errors() {
        let ok = GenerateParams::default();
        assert!(ok.validate().is_ok());
        for bad in [
            GenerateParams { max_new_tokens: 0, ..ok.clone() },
            GenerateParams { repetition_penalty: 0.0, ..ok.clone() },
            GenerateParams { repetition_penalty: f32::NAN, ..ok.clone() },
            GenerateParams { stop_sequences: vec![String::new()], ..ok.clone() },
            GenerateParams { presence_penalty: 2.5, ..ok.clone() },
            GenerateParams { frequency_penalty: f32::NAN, ..ok.clone() },
            GenerateParams { logit_bias: vec![(3, -101.0)], ..ok.clone() },
            GenerateParams { sampling: Some(SamplingConfig { temperature: 0.0, ..Default::default() }), ..ok.clone() },
            GenerateParams { sampling: Some(SamplingConfig { top_p: 0.0, ..Default::default() }), ..ok.clone() },
            GenerateParams { sampling: Some(SamplingConfig { top_p: 1.5, ..Default::default() }), ..ok.clone() },
            GenerateParams { sampling: Some(SamplingConfig { min_p: -0.5, ..Default::default() }), ..ok.clone() },
            GenerateParams { sampling: Some(SamplingConfig { min_p: f32::NAN, ..Default::default() }), ..ok.clone() },
            GenerateParams { logprobs: Some(21), ..ok.clone() },
        ] {
            let err = bad.validate().unwrap_err().to_string();
            assert!(!err.is_empty());
        }
    }

    #[test]
    fn a_logit_bias_outside_the_vocabulary_is_an_error_before_generation() {
        let biased = GenerateParams { logit_bias: vec![(5, 1.0), (9, -1.0)], ..GenerateParams::default() };
        assert!(biased.validate_for(10).is_ok());
        let err = biased.validate_for(9).unwrap_err().to_string();
        assert!(err.contains("token id 9 is outside the vocabulary (9)"), "{err}");
    }
}

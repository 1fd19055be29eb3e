//! The host side of batched generation that needs no executor: the requests of a JSONL prompt
//! file (one JSON object per line, as `ruda-llm batch --prompts` reads it) and the incremental
//! stop-sequence check each active request runs on its decoded reply after every token.

use serde::Deserialize;

use crate::error::LlmError;
use crate::generate::{GenerateParams, SamplingConfig};
use crate::tokenizer::Tokenizer;

/// One request of a prompt file: its prompt text and the generation settings of its line.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchRequest {
    /// The 0-based line of the file this request came from (the `index` of its output line).
    pub index: usize,
    pub prompt: String,
    pub params: GenerateParams,
}

/// The keys a prompt line may hold; only `prompt` is required. Unknown keys are an error so a
/// misspelt setting is not silently ignored.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptLine {
    prompt: String,
    max_new_tokens: Option<usize>,
    temperature: Option<f32>,
    top_k: Option<usize>,
    top_p: Option<f32>,
    min_p: Option<f32>,
    seed: Option<u64>,
    repetition_penalty: Option<f32>,
    #[serde(default)]
    stop: Vec<String>,
}

/// Parses a JSONL prompt file. `defaults` gives each line's settings where the line leaves them
/// out (its `max_new_tokens` and `eos_token_ids` in particular). A line is greedy unless it sets
/// `temperature`; `top_k`, `top_p`, `min_p` and `seed` without it are an error rather than ignored. Blank
/// lines are skipped but still counted, so `index` is the line number minus one. Errors name
/// `source` (the file) and the 1-based line.
pub fn parse_prompt_lines(text: &str, source: &str, defaults: &GenerateParams) -> Result<Vec<BatchRequest>, LlmError> {
    let mut requests = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = |message: String| LlmError::InvalidArgument(format!("{source}: line {}: {message}", index + 1));
        let parsed: PromptLine = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
        let mut params = defaults.clone();
        if let Some(n) = parsed.max_new_tokens {
            params.max_new_tokens = n;
        }
        if let Some(p) = parsed.repetition_penalty {
            if !(p.is_finite() && p != 0.0) {
                return Err(at(format!("repetition_penalty must be finite and nonzero, got {p}")));
            }
            params.repetition_penalty = p;
        }
        match parsed.temperature {
            Some(temperature) => {
                if !(temperature.is_finite() && temperature > 0.0) {
                    return Err(at(format!(
                        "temperature must be positive, got {temperature} (leave it out for greedy)"
                    )));
                }
                let top_p = parsed.top_p.unwrap_or(1.0);
                if !(top_p > 0.0 && top_p <= 1.0) {
                    return Err(at(format!("top_p must be in (0, 1], got {top_p}")));
                }
                let min_p = parsed.min_p.unwrap_or(0.0);
                if !(0.0..=1.0).contains(&min_p) {
                    return Err(at(format!("min_p must be in [0, 1], got {min_p}")));
                }
                params.sampling = Some(SamplingConfig {
                    temperature,
                    top_k: parsed.top_k.unwrap_or(0),
                    top_p,
                    seed: parsed.seed,
                    min_p,
                });
            }
            None => {
                if parsed.top_k.is_some() || parsed.top_p.is_some() || parsed.min_p.is_some() || parsed.seed.is_some() {
                    return Err(at(
                        "top_k, top_p, min_p and seed need a temperature (without one the line is greedy)".into()
                    ));
                }
            }
        }
        if parsed.stop.iter().any(String::is_empty) {
            return Err(at("a stop sequence is empty".into()));
        }
        params.stop_sequences.extend(parsed.stop);
        requests.push(BatchRequest { index, prompt: parsed.prompt, params });
    }
    if requests.is_empty() {
        return Err(LlmError::InvalidArgument(format!("{source}: no prompts (one JSON object per line)")));
    }
    Ok(requests)
}

/// Finds the first stop sequence in a reply that grows one token at a time, rescanning only the
/// text added since the last call plus the longest stop sequence's length less one (a match can
/// straddle the boundary), so a long reply costs linear time overall.
#[derive(Clone, Debug)]
pub struct StopSequenceMatcher {
    stops: Vec<String>,
    longest: usize,
    scanned: usize,
}

impl StopSequenceMatcher {
    pub fn new(stops: &[String]) -> StopSequenceMatcher {
        let longest = stops.iter().map(String::len).max().unwrap_or(0);
        StopSequenceMatcher { stops: stops.to_vec(), longest, scanned: 0 }
    }

    /// `text` is the whole decoded reply so far (each call extends the previous one). Returns the
    /// byte length the reply keeps (it ends before the earliest stop sequence), or `None`.
    pub fn check(&mut self, text: &str) -> Option<usize> {
        if self.stops.is_empty() {
            return None;
        }
        let mut start = self.scanned.saturating_sub(self.longest.saturating_sub(1)).min(text.len());
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        self.scanned = text.len();
        let window = &text[start..];
        self.stops.iter().filter_map(|stop| window.find(stop.as_str())).min().map(|at| start + at)
    }
}

/// A reply's text kept up to date one token at a time without decoding the whole reply again
/// (vLLM's offsets): each token decodes only the window from the last settled piece, and text is
/// appended once it no longer ends inside a UTF-8 character. [`IncrementalDecoder::finish`]
/// decodes the whole reply once, so the final text is exactly the tokenizer's.
#[derive(Clone, Debug, Default)]
pub struct IncrementalDecoder {
    ids: Vec<u32>,
    /// Start of the window decoded for context, and end of the settled part.
    prefix_offset: usize,
    read_offset: usize,
    text: String,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    pub fn new(skip_special_tokens: bool) -> IncrementalDecoder {
        IncrementalDecoder { skip_special_tokens, ..Default::default() }
    }

    /// Add `id`; returns the reply's text so far.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<&str, LlmError> {
        self.ids.push(id);
        let skip = self.skip_special_tokens;
        let prefix = tokenizer.decode_generated(&self.ids[self.prefix_offset..self.read_offset], skip)?;
        let window = tokenizer.decode_generated(&self.ids[self.prefix_offset..], skip)?;
        if window.len() > prefix.len() && !window.ends_with('\u{FFFD}') && window.starts_with(&prefix) {
            self.text.push_str(&window[prefix.len()..]);
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
        }
        Ok(&self.text)
    }

    /// The reply's text so far (what is settled).
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The whole reply decoded at once (its final text).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<&str, LlmError> {
        self.text = tokenizer.decode_generated(&self.ids, self.skip_special_tokens)?;
        self.prefix_offset = self.ids.len();
        self.read_offset = self.ids.len();
        Ok(&self.text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_take_their_own_settings_and_count_blank_lines() {
        let defaults = GenerateParams { max_new_tokens: 7, eos_token_ids: vec![2], ..Default::default() };
        let text = "{\"prompt\": \"a\"}\n\n{\"prompt\": \"b\", \"max_new_tokens\": 3, \"temperature\": 0.5, \"top_k\": 4, \"min_p\": 0.1, \"seed\": 9, \"stop\": [\"\\n\"]}\n";
        let requests = parse_prompt_lines(text, "p.jsonl", &defaults).unwrap();
        assert_eq!(requests.len(), 2);
        assert_eq!((requests[0].index, requests[0].prompt.as_str()), (0, "a"));
        assert_eq!(requests[0].params, defaults);
        assert_eq!(requests[1].index, 2);
        assert_eq!(requests[1].params.max_new_tokens, 3);
        assert_eq!(requests[1].params.eos_token_ids, vec![2]);
        assert_eq!(
            requests[1].params.sampling,
            Some(SamplingConfig { temperature: 0.5, top_k: 4, top_p: 1.0, seed: Some(9), min_p: 0.1 })
        );
        assert_eq!(requests[1].params.stop_sequences, vec!["\n".to_string()]);
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let defaults = GenerateParams::default();
        for (text, wanted) in [
            ("{\"prompt\": \"a\"}\n{\"prompt\": 3}", "p.jsonl: line 2:"),
            ("{\"prompt\": \"a\"}\nnot json", "p.jsonl: line 2:"),
            ("{\"prompt\": \"a\", \"temprature\": 1}", "p.jsonl: line 1:"),
            ("{\"prompt\": \"a\", \"seed\": 1}", "need a temperature"),
            ("{\"prompt\": \"a\", \"temperature\": 0}", "temperature must be positive"),
            ("\n\n", "no prompts"),
        ] {
            let error = parse_prompt_lines(text, "p.jsonl", &defaults).unwrap_err().to_string();
            assert!(error.contains(wanted), "{text:?}: {error}");
        }
    }

    #[test]
    fn stop_sequences_match_across_token_boundaries() {
        let mut matcher = StopSequenceMatcher::new(&["END".to_string(), "é!".to_string()]);
        assert_eq!(matcher.check("abc E"), None);
        assert_eq!(matcher.check("abc EN"), None);
        assert_eq!(matcher.check("abc ENDx"), Some(4));
        let mut matcher = StopSequenceMatcher::new(&["é!".to_string()]);
        assert_eq!(matcher.check("xé"), None);
        assert_eq!(matcher.check("xé!"), Some(1));
        assert_eq!(StopSequenceMatcher::new(&[]).check("anything"), None);
    }
}

//! `tokenizer.json` through Hugging Face's `tokenizers` crate (pure Rust build), behind a
//! small wrapper whose failures are [`LoadError`]s naming the file.

use std::path::{Path, PathBuf};

use crate::error::LoadError;

/// A loaded tokenizer (byte-level BPE for Qwen, but any `tokenizer.json` the crate reads).
#[derive(Clone)]
pub struct Tokenizer {
    path: PathBuf,
    inner: tokenizers::Tokenizer,
}

impl Tokenizer {
    /// Read `dir/tokenizer.json`.
    pub fn load(dir: impl AsRef<Path>) -> Result<Tokenizer, LoadError> {
        Tokenizer::from_file(&dir.as_ref().join("tokenizer.json"))
    }

    /// Read a `tokenizer.json` at `path`.
    pub fn from_file(path: &Path) -> Result<Tokenizer, LoadError> {
        let text = crate::error::read_text(path)?;
        let inner = text
            .parse::<tokenizers::Tokenizer>()
            .map_err(|e| LoadError::Tokenizer { path: path.to_path_buf(), message: format!("cannot load: {e}") })?;
        Ok(Tokenizer { path: path.to_path_buf(), inner })
    }

    fn error(&self, what: String) -> LoadError {
        LoadError::Tokenizer { path: self.path.clone(), message: what }
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) are matched
    /// either way; `add_special_tokens` adds those the post-processor inserts (none for Qwen).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, LoadError> {
        let enc =
            self.inner.encode(text, add_special_tokens).map_err(|e| self.error(format!("encoding {text:?}: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// The text of `ids`; with `skip_special_tokens`, special tokens are left out. An id
    /// outside the vocabulary is an error.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, LoadError> {
        let size = self.vocab_size();
        if let Some(bad) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(self.error(format!("decoding: token id {bad} is not in the vocabulary ({size} tokens)")));
        }
        self.inner.decode(ids, skip_special_tokens).map_err(|e| self.error(format!("decoding {} ids: {e}", ids.len())))
    }

    /// The text of ids a model produced (each below its `vocab_size`), as transformers' decode
    /// gives it: an id past the tokenizer's vocabulary (a checkpoint's padding rows: Qwen2.5
    /// has 151936 embedding rows for 151665 tokens) has no text and is left out, where
    /// [`Tokenizer::decode`] refuses it. Generation decodes with this, so a sampled padding id
    /// cannot fail a request.
    pub fn decode_generated(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, LoadError> {
        if ids.iter().all(|&id| self.inner.id_to_token(id).is_some()) {
            return self.decode(ids, skip_special_tokens);
        }
        let known: Vec<u32> = ids.iter().copied().filter(|&id| self.inner.id_to_token(id).is_some()).collect();
        self.decode(&known, skip_special_tokens)
    }

    /// The id of a token string (`"<|im_end|>"`), if the vocabulary has it.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The token string of `id`, if any.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a special token the caller cannot work without, or an error naming it.
    pub fn special_id(&self, token: &str) -> Result<u32, LoadError> {
        self.token_to_id(token).ok_or_else(|| self.error(format!("no token {token:?} in the vocabulary")))
    }

    /// Refuse a tokenizer with token ids the model has no embedding row for (`vocab_size` in
    /// config.json): they would pass encoding and fail deep in the forward pass.
    pub fn check_fits(&self, vocab_size: usize) -> Result<(), LoadError> {
        let vocab = self.inner.get_vocab(true);
        let outside = vocab.values().filter(|&&id| id as usize >= vocab_size).count();
        match vocab.iter().max_by_key(|(_, &id)| id) {
            Some((token, &id)) if id as usize >= vocab_size => Err(self.error(format!(
                "token {token:?} has id {id}, outside the model's vocabulary (vocab_size {vocab_size} in config.json; {outside} token(s) past it)"
            ))),
            _ => Ok(()),
        }
    }

    /// The number of tokens, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The raw bytes of token `id` alone (for OpenAI's logprobs `bytes`): a byte-level BPE
    /// token's own bytes, even when they are part of a multi-byte character, an added token's
    /// text, else the token decoded alone. `None` for an id outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<Vec<u8>> {
        let piece = self.inner.id_to_token(id)?;
        if self.inner.get_added_tokens_decoder().contains_key(&id) {
            return Some(piece.into_bytes());
        }
        if matches!(self.inner.get_decoder(), Some(tokenizers::decoders::DecoderWrapper::ByteLevel(_))) {
            if let Some(bytes) = piece.chars().map(byte_level_byte).collect::<Option<Vec<u8>>>() {
                return Some(bytes);
            }
        }
        self.inner.decode(&[id], false).ok().map(String::into_bytes)
    }

    /// The underlying `tokenizers` tokenizer (streaming decode, offsets, batches).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// The byte a character of GPT-2's byte-level alphabet stands for: printable bytes (`!`..=`~`,
/// `¡`..=`¬`, `®`..=`ÿ`) stand for themselves, the other 68 bytes for U+0100 onwards in order.
pub(crate) fn byte_level_byte(c: char) -> Option<u8> {
    static ALPHABET: std::sync::OnceLock<std::collections::HashMap<char, u8>> = std::sync::OnceLock::new();
    let alphabet = ALPHABET.get_or_init(|| {
        let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
        let mut next = 256;
        (0u32..256)
            .map(|b| {
                let c = if printable(b) {
                    b
                } else {
                    next += 1;
                    next - 1
                };
                (char::from_u32(c).unwrap_or('\u{fffd}'), b as u8)
            })
            .collect()
    });
    alphabet.get(&c).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_alphabet() {
        assert_eq!(byte_level_byte('a'), Some(b'a'));
        assert_eq!(byte_level_byte('\u{100}'), Some(0));
        assert_eq!(byte_level_byte('Ġ'), Some(b' '));
        assert_eq!(byte_level_byte('Ċ'), Some(b'\n'));
        assert_eq!(byte_level_byte('\u{143}'), Some(0xad));
        assert_eq!(byte_level_byte('\u{144}'), None);
        assert_eq!(byte_level_byte(' '), None);
    }
}

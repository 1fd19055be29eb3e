//! Tokens of the text IR. Keywords, op names (`cmp.lt`, `cvt.rn.sat`), types and special
//! registers (`tid.x`) are all [`Tok::Ident`]s that the parser splits and looks up, so the lexer
//! stays small and an unknown name is reported with its whole spelling.

use std::ops::Range;

use logos::Logos;

#[derive(Logos, Clone, Copy, Debug, PartialEq, Eq)]
#[logos(skip r"[ \t\r]+")]
#[logos(skip r";[^\n]*")]
pub(super) enum Tok {
    #[token("\n")]
    Newline,
    /// `%17`
    #[regex(r"%[0-9]+")]
    Value,
    /// `@name`: kernel and shared-array names. Anything up to punctuation, so that names the
    /// verifier rejects (empty, leading digit, `-`) still parse and reach it.
    #[regex(r#"@[^ \t\r\n(){}\[\],:;"!%@<>=]*"#)]
    At,
    /// `.launch_bounds`, `.shared`
    #[regex(r"\.[A-Za-z_][A-Za-z0-9_]*")]
    Directive,
    #[regex(r"[A-Za-z_][A-Za-z0-9_.]*")]
    Ident,
    #[regex(r"0[xX][0-9a-fA-F]+")]
    Hex,
    #[regex(r"-?[0-9]+")]
    Int,
    /// A decimal float literal (`1.5`, `-2e-3`); printed kernels use hex bit patterns instead.
    #[regex(r"-?[0-9]+\.[0-9]+([eE][+-]?[0-9]+)?")]
    #[regex(r"-?[0-9]+[eE][+-]?[0-9]+")]
    Float,
    /// A string as Rust's `{:?}` writes it (the file of a `!loc`).
    #[regex(r#""([^"\\\n]|\\[^\n])*""#)]
    Str,
    #[token("!loc")]
    Loc,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("<")]
    Lt,
    #[token(">")]
    Gt,
    #[token(",")]
    Comma,
    #[token(":")]
    Colon,
    #[token("=")]
    Eq,
}

/// One lexed token; `tok` is `None` where the input matches no token.
#[derive(Clone, Debug)]
pub(super) struct Token {
    pub tok: Option<Tok>,
    pub span: Range<usize>,
}

pub(super) fn lex(src: &str) -> Vec<Token> {
    let mut lexer = Tok::lexer(src);
    let mut out = Vec::new();
    while let Some(result) = lexer.next() {
        out.push(Token { tok: result.ok(), span: lexer.span() });
    }
    out
}

/// Undo Rust's `{:?}` escaping of a string literal (without its quotes). `None` when an escape
/// is not one `{:?}` writes.
pub(super) fn unescape(body: &str) -> Option<String> {
    let mut out = String::with_capacity(body.len());
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            'r' => out.push('\r'),
            't' => out.push('\t'),
            '0' => out.push('\0'),
            '\\' => out.push('\\'),
            '"' => out.push('"'),
            '\'' => out.push('\''),
            'u' => {
                if chars.next()? != '{' {
                    return None;
                }
                let mut hex = String::new();
                loop {
                    match chars.next()? {
                        '}' => break,
                        h if h.is_ascii_hexdigit() && hex.len() < 6 => hex.push(h),
                        _ => return None,
                    }
                }
                out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
            }
            _ => return None,
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(src: &str) -> Vec<Option<Tok>> {
        lex(src).into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn tokens_of_an_instruction_line() {
        assert_eq!(
            kinds("%3: ptr<global,f32> = cvt.rn.sat %2 ; comment\n"),
            vec![
                Some(Tok::Value),
                Some(Tok::Colon),
                Some(Tok::Ident),
                Some(Tok::Lt),
                Some(Tok::Ident),
                Some(Tok::Comma),
                Some(Tok::Ident),
                Some(Tok::Gt),
                Some(Tok::Eq),
                Some(Tok::Ident),
                Some(Tok::Value),
                Some(Tok::Newline),
            ]
        );
        assert_eq!(
            kinds("0x3f800000 -12 1.5 -2e-3"),
            vec![Some(Tok::Hex), Some(Tok::Int), Some(Tok::Float), Some(Tok::Float)]
        );
        assert_eq!(kinds("# @a-b"), vec![None, Some(Tok::At)]);
    }

    #[test]
    fn unescape_inverts_debug_formatting() {
        for s in ["plain.rs", "a\"b\\c", "tab\there\nnl", "nul\0", "\u{200b}zero-width", "é ü"] {
            let debug = format!("{s:?}");
            assert_eq!(unescape(&debug[1..debug.len() - 1]).as_deref(), Some(s), "{debug}");
        }
        assert_eq!(unescape(r"\q"), None);
        assert_eq!(unescape(r"\u{110000}"), None);
        assert_eq!(unescape(r"\u{1234567}"), None);
        assert_eq!(unescape("\\"), None);
    }
}

//! Tokens of PTX text (a `logos` lexer) with their line numbers.

use logos::Logos;

/// One PTX token. Mnemonics keep their modifiers (`ld.global.v4.f32` is one [`Tok::Word`]),
/// special registers their component (`%tid.x` is one [`Tok::Reg`]).
#[derive(Logos, Clone, Copy, Debug, PartialEq)]
#[logos(skip r"[ \t\r\n\f]+")]
#[logos(skip r"//[^\n]*")]
pub(crate) enum Tok<'s> {
    /// `/* ... */`, dropped by [`lex`].
    #[token("/*", block_comment)]
    Comment,
    /// `.reg`, `.b32`, `.align`, ...
    #[regex(r"\.[A-Za-z_][A-Za-z0-9_]*(::[A-Za-z0-9_]+)*", |l| l.slice())]
    Directive(&'s str),
    /// Mnemonics with their modifiers, labels and symbol names.
    #[regex(r"[A-Za-z_$][A-Za-z0-9_$]*((\.|::)[A-Za-z0-9_$]+)*", |l| l.slice())]
    Word(&'s str),
    /// Registers, including special registers such as `%tid.x`.
    #[regex(r"%[A-Za-z_$][A-Za-z0-9_$]*(\.[A-Za-z0-9_]+)?", |l| l.slice())]
    Reg(&'s str),
    /// Integer literals (decimal, hex, octal, binary, optional `U` suffix).
    #[regex(r"0[xX][0-9A-Fa-f]+U?", |l| l.slice())]
    #[regex(r"0[bB][01]+U?", |l| l.slice())]
    #[regex(r"[0-9]+U?", |l| l.slice())]
    Int(&'s str),
    /// `0fXXXXXXXX`: the bits of an f32.
    #[regex(r"0[fF][0-9A-Fa-f]{8}", |l| l.slice())]
    F32Bits(&'s str),
    /// `0dXXXXXXXXXXXXXXXX`: the bits of an f64.
    #[regex(r"0[dD][0-9A-Fa-f]{16}", |l| l.slice())]
    F64Bits(&'s str),
    /// Decimal floating-point literals (also `.version 8.0`).
    #[regex(r"[0-9]+\.[0-9]*([eE][+-]?[0-9]+)?", |l| l.slice())]
    #[regex(r"[0-9]+[eE][+-]?[0-9]+", |l| l.slice())]
    Float(&'s str),
    #[regex(r#""[^"\n]*""#, |l| l.slice())]
    Str(&'s str),
    #[token(",")]
    Comma,
    #[token(";")]
    Semi,
    #[token(":")]
    Colon,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("<")]
    Lt,
    #[token(">")]
    Gt,
    #[token("@")]
    At,
    #[token("!")]
    Bang,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("=")]
    Eq,
    #[token("|")]
    Pipe,
}

/// Skip to the end of a block comment; an unterminated one is an error.
fn block_comment<'s>(lex: &mut logos::Lexer<'s, Tok<'s>>) -> bool {
    match lex.remainder().find("*/") {
        Some(end) => {
            lex.bump(end + 2);
            true
        }
        None => false,
    }
}

impl Tok<'_> {
    /// The token as the PTX text writes it, for messages.
    pub(crate) fn text(&self) -> String {
        match self {
            Tok::Directive(s)
            | Tok::Word(s)
            | Tok::Reg(s)
            | Tok::Int(s)
            | Tok::F32Bits(s)
            | Tok::F64Bits(s)
            | Tok::Float(s)
            | Tok::Str(s) => s.to_string(),
            Tok::Comment => "/* */".into(),
            Tok::Comma => ",".into(),
            Tok::Semi => ";".into(),
            Tok::Colon => ":".into(),
            Tok::LBracket => "[".into(),
            Tok::RBracket => "]".into(),
            Tok::LBrace => "{".into(),
            Tok::RBrace => "}".into(),
            Tok::LParen => "(".into(),
            Tok::RParen => ")".into(),
            Tok::Lt => "<".into(),
            Tok::Gt => ">".into(),
            Tok::At => "@".into(),
            Tok::Bang => "!".into(),
            Tok::Plus => "+".into(),
            Tok::Minus => "-".into(),
            Tok::Eq => "=".into(),
            Tok::Pipe => "|".into(),
        }
    }
}

/// A token and the 1-based line it starts on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Spanned<'s> {
    pub(crate) tok: Tok<'s>,
    pub(crate) line: u32,
}

/// Split `src` into tokens; an unknown character is an error naming its line.
pub(crate) fn lex(src: &str) -> Result<Vec<Spanned<'_>>, (u32, String)> {
    let mut out = Vec::new();
    let mut lexer = Tok::lexer(src);
    let mut line = 1u32;
    let mut scanned = 0usize;
    while let Some(tok) = lexer.next() {
        let span = lexer.span();
        line += src.as_bytes()[scanned..span.start].iter().filter(|&&b| b == b'\n').count() as u32;
        scanned = span.start;
        match tok {
            Ok(Tok::Comment) => {}
            Ok(tok) => out.push(Spanned { tok, line }),
            Err(()) => {
                let bad: String = src[span.clone()].chars().take(20).collect();
                return Err((line, format!("unexpected text {bad:?}")));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toks(s: &str) -> Vec<Tok<'_>> {
        lex(s).expect("lexes").into_iter().map(|t| t.tok).collect()
    }

    #[test]
    fn mnemonics_registers_and_literals() {
        assert_eq!(
            toks("@!%p1 ld.global.L2::128B.v4.f32 {%f1, _}, [%rd2+-8]; // c\n mov.u32 %r1, %tid.x;"),
            vec![
                Tok::At,
                Tok::Bang,
                Tok::Reg("%p1"),
                Tok::Word("ld.global.L2::128B.v4.f32"),
                Tok::LBrace,
                Tok::Reg("%f1"),
                Tok::Comma,
                Tok::Word("_"),
                Tok::RBrace,
                Tok::Comma,
                Tok::LBracket,
                Tok::Reg("%rd2"),
                Tok::Plus,
                Tok::Minus,
                Tok::Int("8"),
                Tok::RBracket,
                Tok::Semi,
                Tok::Word("mov.u32"),
                Tok::Reg("%r1"),
                Tok::Comma,
                Tok::Reg("%tid.x"),
                Tok::Semi,
            ]
        );
        assert_eq!(
            toks("0f3F800000 0d3FF0000000000000 0x1fU 7.0 $L__BB0_2:"),
            vec![
                Tok::F32Bits("0f3F800000"),
                Tok::F64Bits("0d3FF0000000000000"),
                Tok::Int("0x1fU"),
                Tok::Float("7.0"),
                Tok::Word("$L__BB0_2"),
                Tok::Colon,
            ]
        );
    }

    #[test]
    fn lines_count_through_comments() {
        let t = lex("a\n/* x\ny */ b\n\n// z\nc").expect("lexes");
        assert_eq!(t.iter().map(|s| s.line).collect::<Vec<_>>(), vec![1, 3, 6]);
        assert_eq!(lex("a\n#").unwrap_err().0, 2);
    }
}

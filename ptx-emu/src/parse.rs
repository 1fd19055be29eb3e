//! The PTX parser: tokens to a syntax tree of the module (directives, variables, functions,
//! statements). It knows the grammar, not the instruction set: `decode` gives instructions
//! their meaning, and rejects what it does not know.

use crate::lexer::{lex, Spanned, Tok};

/// A literal operand.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Imm {
    Int(i128),
    /// `0f...`: f32 bits.
    F32(u32),
    /// `0d...`: f64 bits.
    F64(u64),
    /// A decimal floating-point literal.
    Float(f64),
}

/// The base of an address operand `[base+offset]`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum AddrBase {
    Reg(String),
    Sym(String),
    /// `[1024]`: an absolute address.
    Abs,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Operand {
    Reg(String),
    /// `!%p`: a negated predicate.
    Not(Box<Operand>),
    Imm(Imm),
    /// A symbol (variable, parameter or label), possibly plus a byte offset.
    Sym(String, i64),
    Addr(AddrBase, i64),
    /// `{a, b, ...}` (also a parenthesised list).
    Vec(Vec<Operand>),
    /// `d|p`: two destinations.
    Pair(Box<Operand>, Box<Operand>),
    /// `_`: a destination that is discarded.
    Sink,
}

/// A state-space variable: `.shared .align 4 .b8 name[256];`.
#[derive(Clone, Debug)]
pub(crate) struct VarDecl {
    pub(crate) space: String,
    pub(crate) name: String,
    pub(crate) align: Option<u32>,
    /// The element type directive without its dot (`b8`, `u32`, ...).
    pub(crate) ty: String,
    /// `.v2`/`.v4` elements.
    pub(crate) vector: u32,
    /// `None`: a scalar; `Some(None)`: `name[]`; `Some(Some(n))`: `name[n]` (dimensions
    /// multiplied).
    pub(crate) len: Option<Option<u64>>,
    pub(crate) is_extern: bool,
    pub(crate) init: Vec<Imm>,
    pub(crate) line: u32,
}

/// An entry or function parameter.
#[derive(Clone, Debug)]
pub(crate) struct ParamDecl {
    pub(crate) name: String,
    pub(crate) ty: String,
    pub(crate) align: Option<u32>,
    pub(crate) len: Option<u64>,
    pub(crate) line: u32,
}

/// One `.reg` declarator: `%r<34>` (registers `%r0` to `%r33`) or `%SP`.
#[derive(Clone, Debug)]
pub(crate) enum RegDecl {
    Range(String, u32),
    One(String),
}

#[derive(Clone, Debug)]
pub(crate) struct Inst {
    /// `@p` or `@!p` (negated).
    pub(crate) guard: Option<(bool, String)>,
    pub(crate) mnemonic: String,
    pub(crate) operands: Vec<Operand>,
    pub(crate) line: u32,
}

#[derive(Clone, Debug)]
pub(crate) enum Stmt {
    Reg {
        ty: String,
        vector: bool,
        regs: Vec<RegDecl>,
        line: u32,
    },
    Var(VarDecl),
    Label(String, u32),
    Inst(Inst),
    /// `{`: a nested scope.
    Open,
    /// `}`.
    Close,
}

#[derive(Clone, Debug)]
pub(crate) struct Function {
    pub(crate) name: String,
    pub(crate) is_entry: bool,
    pub(crate) params: Vec<ParamDecl>,
    pub(crate) maxntid: Option<[u32; 3]>,
    pub(crate) reqntid: Option<[u32; 3]>,
    /// `None` for a declaration without a body.
    pub(crate) body: Option<Vec<Stmt>>,
    pub(crate) line: u32,
}

#[derive(Clone, Debug, Default)]
pub(crate) struct Module {
    pub(crate) version: Option<String>,
    pub(crate) target: Vec<String>,
    pub(crate) address_size: Option<u32>,
    pub(crate) vars: Vec<VarDecl>,
    pub(crate) functions: Vec<Function>,
}

pub(crate) type PResult<T> = Result<T, (u32, String)>;

/// Parse a whole module.
pub(crate) fn parse(src: &str) -> PResult<Module> {
    let toks = lex(src)?;
    let mut p = Parser { toks: &toks, pos: 0 };
    p.module()
}

struct Parser<'a, 's> {
    toks: &'a [Spanned<'s>],
    pos: usize,
}

/// The value of an integer literal token.
pub(crate) fn int_value(text: &str) -> Option<i128> {
    let t = text.strip_suffix('U').unwrap_or(text);
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        u64::from_str_radix(h, 16).ok().map(|v| v as i128)
    } else if let Some(b) = t.strip_prefix("0b").or_else(|| t.strip_prefix("0B")) {
        u64::from_str_radix(b, 2).ok().map(|v| v as i128)
    } else if t.len() > 1 && t.starts_with('0') {
        u64::from_str_radix(&t[1..], 8).ok().map(|v| v as i128)
    } else {
        t.parse::<u64>().ok().map(|v| v as i128)
    }
}

impl<'s> Parser<'_, 's> {
    fn peek(&self) -> Option<Tok<'s>> {
        self.toks.get(self.pos).map(|t| t.tok)
    }

    fn peek_at(&self, n: usize) -> Option<Tok<'s>> {
        self.toks.get(self.pos + n).map(|t| t.tok)
    }

    /// The line of the next token (or of the last one at the end).
    fn line(&self) -> u32 {
        self.toks.get(self.pos).or(self.toks.last()).map_or(1, |t| t.line)
    }

    fn bump(&mut self) -> Option<Tok<'s>> {
        let t = self.peek();
        self.pos += 1;
        t
    }

    fn err<T>(&self, message: impl Into<String>) -> PResult<T> {
        Err((self.line(), message.into()))
    }

    fn found(&self) -> String {
        self.peek().map_or_else(|| "the end of the text".into(), |t| format!("`{}`", t.text()))
    }

    fn expect(&mut self, want: Tok<'_>) -> PResult<()> {
        if self.peek() == Some(want) {
            self.pos += 1;
            Ok(())
        } else {
            self.err(format!("expected `{}`, found {}", want.text(), self.found()))
        }
    }

    fn eat(&mut self, want: Tok<'_>) -> bool {
        if self.peek() == Some(want) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn word(&mut self, what: &str) -> PResult<String> {
        match self.peek() {
            Some(Tok::Word(w)) => {
                self.pos += 1;
                Ok(w.to_string())
            }
            _ => self.err(format!("expected {what}, found {}", self.found())),
        }
    }

    fn uint(&mut self, what: &str) -> PResult<u64> {
        match self.peek() {
            Some(Tok::Int(t)) => {
                let v = int_value(t).and_then(|v| u64::try_from(v).ok());
                self.pos += 1;
                v.map_or_else(|| self.err(format!("{what} `{t}` is out of range")), Ok)
            }
            _ => self.err(format!("expected {what}, found {}", self.found())),
        }
    }

    fn u32(&mut self, what: &str) -> PResult<u32> {
        let v = self.uint(what)?;
        u32::try_from(v).map_or_else(|_| self.err(format!("{what} {v} is out of range")), Ok)
    }

    /// Skip the rest of the current line (`.loc`, `.file`).
    fn skip_line(&mut self, line: u32) {
        while self.toks.get(self.pos).is_some_and(|t| t.line == line) {
            self.pos += 1;
        }
    }

    fn skip_past_semi(&mut self) -> PResult<()> {
        while let Some(t) = self.bump() {
            if t == Tok::Semi {
                return Ok(());
            }
        }
        self.err("expected `;` before the end of the text")
    }

    /// Skip a balanced `{ ... }` group, the opening brace next.
    fn skip_braces(&mut self) -> PResult<()> {
        self.expect(Tok::LBrace)?;
        let mut depth = 1;
        while depth > 0 {
            match self.bump() {
                Some(Tok::LBrace) => depth += 1,
                Some(Tok::RBrace) => depth -= 1,
                Some(_) => {}
                None => return self.err("unbalanced `{`"),
            }
        }
        Ok(())
    }

    fn module(&mut self) -> PResult<Module> {
        let mut m = Module::default();
        let mut is_extern = false;
        while let Some(t) = self.peek() {
            let line = self.line();
            match t {
                Tok::Directive(".version") => {
                    self.pos += 1;
                    match self.bump() {
                        Some(Tok::Float(v) | Tok::Int(v)) => m.version = Some(v.to_string()),
                        _ => return Err((line, "expected a version after `.version`".into())),
                    }
                }
                Tok::Directive(".target") => {
                    self.pos += 1;
                    m.target.push(self.word("a target")?);
                    while self.eat(Tok::Comma) {
                        m.target.push(self.word("a target")?);
                    }
                }
                Tok::Directive(".address_size") => {
                    self.pos += 1;
                    m.address_size = Some(self.u32("an address size")?);
                }
                Tok::Directive(".file") => {
                    self.pos += 1;
                    self.skip_line(line);
                }
                Tok::Directive(".section") => {
                    self.pos += 1;
                    while !matches!(self.peek(), Some(Tok::LBrace) | None) {
                        self.pos += 1;
                    }
                    self.skip_braces()?;
                }
                Tok::Directive(".pragma") => self.skip_past_semi()?,
                Tok::Directive(".visible" | ".weak" | ".common") => self.pos += 1,
                Tok::Directive(".extern") => {
                    self.pos += 1;
                    is_extern = true;
                    continue;
                }
                Tok::Directive(".entry" | ".func") => {
                    let f = self.function()?;
                    m.functions.push(f);
                }
                Tok::Directive(".shared" | ".global" | ".const") => {
                    let v = self.var_decl(is_extern)?;
                    m.vars.push(v);
                }
                other => return Err((line, format!("unsupported module-level `{}`", other.text()))),
            }
            is_extern = false;
        }
        Ok(m)
    }

    /// `.entry NAME (params) directives { body }`, or a `.func`.
    fn function(&mut self) -> PResult<Function> {
        let line = self.line();
        let is_entry = self.bump() == Some(Tok::Directive(".entry"));
        if !is_entry && self.peek() == Some(Tok::LParen) {
            // The return parameters of a `.func`.
            self.params()?;
        }
        let name = self.word("a function name")?;
        let params = if self.peek() == Some(Tok::LParen) { self.params()? } else { vec![] };
        let (mut maxntid, mut reqntid) = (None, None);
        loop {
            match self.peek() {
                Some(Tok::Directive(d @ (".maxntid" | ".reqntid"))) => {
                    self.pos += 1;
                    let mut dims = [1u32; 3];
                    dims[0] = self.u32("a thread count")?;
                    for dim in dims.iter_mut().skip(1) {
                        if !self.eat(Tok::Comma) {
                            break;
                        }
                        *dim = self.u32("a thread count")?;
                    }
                    if d == ".maxntid" {
                        maxntid = Some(dims);
                    } else {
                        reqntid = Some(dims);
                    }
                }
                Some(Tok::Directive(
                    ".minnctapersm" | ".maxnctapersm" | ".maxnreg" | ".maxclusterrank" | ".reqnctapercluster",
                )) => {
                    self.pos += 1;
                    self.uint("a count")?;
                    while self.eat(Tok::Comma) {
                        self.uint("a count")?;
                    }
                }
                Some(Tok::Directive(".noreturn" | ".explicitcluster")) => self.pos += 1,
                Some(Tok::Directive(".pragma")) => self.skip_past_semi()?,
                _ => break,
            }
        }
        let body = if self.eat(Tok::Semi) { None } else { Some(self.body()?) };
        Ok(Function { name, is_entry, params, maxntid, reqntid, body, line })
    }

    fn params(&mut self) -> PResult<Vec<ParamDecl>> {
        self.expect(Tok::LParen)?;
        let mut params = vec![];
        if self.eat(Tok::RParen) {
            return Ok(params);
        }
        loop {
            let line = self.line();
            let mut ty = None;
            let mut align = None;
            match self.bump() {
                Some(Tok::Directive(".param" | ".reg")) => {}
                _ => return Err((line, "expected `.param`".into())),
            }
            let name = loop {
                match self.bump() {
                    Some(Tok::Directive(".align")) => align = Some(self.u32("an alignment")?),
                    Some(Tok::Directive(".ptr" | ".global" | ".shared" | ".const" | ".local")) => {}
                    Some(Tok::Directive(d)) => ty = Some(d[1..].to_string()),
                    Some(Tok::Word(w)) => break w.to_string(),
                    _ => return Err((line, "expected a parameter name".into())),
                }
            };
            let len = if self.eat(Tok::LBracket) {
                let n = self.uint("an array length")?;
                self.expect(Tok::RBracket)?;
                Some(n)
            } else {
                None
            };
            let ty = ty.ok_or((line, format!("parameter `{name}` has no type")))?;
            params.push(ParamDecl { name, ty, align, len, line });
            if self.eat(Tok::RParen) {
                return Ok(params);
            }
            self.expect(Tok::Comma)?;
        }
    }

    /// `[.extern] .space .align N .type name[len] [= init];`, the space directive next.
    fn var_decl(&mut self, is_extern: bool) -> PResult<VarDecl> {
        let line = self.line();
        let space = match self.bump() {
            Some(Tok::Directive(d)) => d[1..].to_string(),
            _ => return Err((line, "expected a state space".into())),
        };
        let (mut align, mut ty, mut vector) = (None, None, 1);
        let name = loop {
            match self.bump() {
                Some(Tok::Directive(".align")) => align = Some(self.u32("an alignment")?),
                Some(Tok::Directive(".v2")) => vector = 2,
                Some(Tok::Directive(".v4")) => vector = 4,
                Some(Tok::Directive(".v8")) => vector = 8,
                Some(Tok::Directive(d)) => ty = Some(d[1..].to_string()),
                Some(Tok::Word(w)) => break w.to_string(),
                _ => return Err((line, format!("expected the name of a .{space} variable"))),
            }
        };
        let ty = ty.ok_or((line, format!("variable `{name}` has no type")))?;
        let mut len: Option<Option<u64>> = None;
        while self.eat(Tok::LBracket) {
            if self.eat(Tok::RBracket) {
                len = Some(None);
                continue;
            }
            let n = self.uint("an array length")?;
            self.expect(Tok::RBracket)?;
            len = Some(Some(match len {
                Some(Some(m)) => m.saturating_mul(n),
                _ => n,
            }));
        }
        let mut init = vec![];
        if self.eat(Tok::Eq) {
            let braced = self.eat(Tok::LBrace);
            loop {
                match self.operand()? {
                    Operand::Imm(i) => init.push(i),
                    other => return Err((line, format!("unsupported initializer {other:?} of `{name}`"))),
                }
                if !self.eat(Tok::Comma) {
                    break;
                }
            }
            if braced {
                self.expect(Tok::RBrace)?;
            }
        }
        self.expect(Tok::Semi)?;
        Ok(VarDecl { space, name, align, ty, vector, len, is_extern, init, line })
    }

    fn body(&mut self) -> PResult<Vec<Stmt>> {
        self.expect(Tok::LBrace)?;
        let mut out = vec![];
        let mut depth = 0u32;
        loop {
            let line = self.line();
            let Some(t) = self.peek() else { return self.err("the function body has no closing `}`") };
            match t {
                Tok::RBrace => {
                    self.pos += 1;
                    if depth == 0 {
                        return Ok(out);
                    }
                    depth -= 1;
                    out.push(Stmt::Close);
                }
                Tok::LBrace => {
                    self.pos += 1;
                    depth += 1;
                    out.push(Stmt::Open);
                }
                Tok::Directive(".reg") => {
                    self.pos += 1;
                    out.push(self.reg_decl(line)?);
                }
                Tok::Directive(".local" | ".shared" | ".global" | ".const" | ".param") => {
                    out.push(Stmt::Var(self.var_decl(false)?));
                }
                Tok::Directive(".loc" | ".file") => {
                    self.pos += 1;
                    self.skip_line(line);
                }
                Tok::Directive(".pragma") => self.skip_past_semi()?,
                Tok::Word(w) if self.peek_at(1) == Some(Tok::Colon) => {
                    self.pos += 2;
                    out.push(Stmt::Label(w.to_string(), line));
                }
                Tok::At | Tok::Word(_) => out.push(Stmt::Inst(self.inst()?)),
                other => return Err((line, format!("unexpected `{}` in a function body", other.text()))),
            }
        }
    }

    fn reg_decl(&mut self, line: u32) -> PResult<Stmt> {
        let mut ty = None;
        let mut vector = false;
        while let Some(Tok::Directive(d)) = self.peek() {
            self.pos += 1;
            if matches!(d, ".v2" | ".v4" | ".v8") {
                vector = true;
            } else {
                ty = Some(d[1..].to_string());
            }
        }
        let ty = ty.ok_or((line, "`.reg` without a type".to_string()))?;
        let mut regs = vec![];
        loop {
            let name = match self.bump() {
                Some(Tok::Reg(r)) => r.to_string(),
                Some(Tok::Word(w)) => w.to_string(),
                _ => return Err((line, "expected a register name in `.reg`".into())),
            };
            if self.eat(Tok::Lt) {
                let n = self.u32("a register count")?;
                self.expect(Tok::Gt)?;
                regs.push(RegDecl::Range(name, n));
            } else {
                regs.push(RegDecl::One(name));
            }
            if !self.eat(Tok::Comma) {
                break;
            }
        }
        self.expect(Tok::Semi)?;
        Ok(Stmt::Reg { ty, vector, regs, line })
    }

    fn inst(&mut self) -> PResult<Inst> {
        let line = self.line();
        let guard = if self.eat(Tok::At) {
            let neg = self.eat(Tok::Bang);
            match self.bump() {
                Some(Tok::Reg(r)) => Some((neg, r.to_string())),
                _ => return Err((line, "expected a predicate register after `@`".into())),
            }
        } else {
            None
        };
        let mnemonic = self.word("an instruction")?;
        let mut operands = vec![];
        if !self.eat(Tok::Semi) {
            loop {
                operands.push(self.operand()?);
                if self.eat(Tok::Semi) {
                    break;
                }
                self.expect(Tok::Comma)?;
            }
        }
        Ok(Inst { guard, mnemonic, operands, line })
    }

    fn offset(&mut self) -> PResult<i64> {
        let mut off = 0i64;
        loop {
            let neg = if self.eat(Tok::Plus) {
                self.eat(Tok::Minus)
            } else if self.eat(Tok::Minus) {
                true
            } else {
                return Ok(off);
            };
            let v = self.uint("an offset")? as i64;
            off = off.wrapping_add(if neg { v.wrapping_neg() } else { v });
        }
    }

    fn operand(&mut self) -> PResult<Operand> {
        let line = self.line();
        let Some(t) = self.bump() else { return self.err("expected an operand") };
        let op = match t {
            Tok::Bang => Operand::Not(Box::new(self.operand()?)),
            Tok::Reg(r) => Operand::Reg(r.to_string()),
            Tok::Word("_") => Operand::Sink,
            Tok::Word(w) => {
                let off = self.offset()?;
                Operand::Sym(w.to_string(), off)
            }
            Tok::Minus => match self.operand()? {
                Operand::Imm(Imm::Int(v)) => Operand::Imm(Imm::Int(-v)),
                Operand::Imm(Imm::Float(v)) => Operand::Imm(Imm::Float(-v)),
                Operand::Imm(Imm::F32(b)) => Operand::Imm(Imm::F32(b ^ 0x8000_0000)),
                Operand::Imm(Imm::F64(b)) => Operand::Imm(Imm::F64(b ^ (1 << 63))),
                _ => return Err((line, "`-` before something other than a number".into())),
            },
            Tok::Int(s) => Operand::Imm(Imm::Int(int_value(s).ok_or((line, format!("bad integer `{s}`")))?)),
            Tok::F32Bits(s) => Operand::Imm(Imm::F32(
                u32::from_str_radix(&s[2..], 16).map_err(|_| (line, format!("bad literal `{s}`")))?,
            )),
            Tok::F64Bits(s) => Operand::Imm(Imm::F64(
                u64::from_str_radix(&s[2..], 16).map_err(|_| (line, format!("bad literal `{s}`")))?,
            )),
            Tok::Float(s) => Operand::Imm(Imm::Float(s.parse().map_err(|_| (line, format!("bad literal `{s}`")))?)),
            Tok::LBracket => {
                let base = match self.peek() {
                    Some(Tok::Reg(r)) => {
                        self.pos += 1;
                        AddrBase::Reg(r.to_string())
                    }
                    Some(Tok::Word(w)) => {
                        self.pos += 1;
                        AddrBase::Sym(w.to_string())
                    }
                    Some(Tok::Int(_)) => AddrBase::Abs,
                    _ => return self.err(format!("expected an address, found {}", self.found())),
                };
                let off = if base == AddrBase::Abs {
                    let v = self.uint("an address")?;
                    (v as i64).wrapping_add(self.offset()?)
                } else {
                    self.offset()?
                };
                self.expect(Tok::RBracket)?;
                Operand::Addr(base, off)
            }
            Tok::LBrace | Tok::LParen => {
                let close = if t == Tok::LBrace { Tok::RBrace } else { Tok::RParen };
                let mut items = vec![];
                if !self.eat(close) {
                    loop {
                        items.push(self.operand()?);
                        if self.eat(close) {
                            break;
                        }
                        self.expect(Tok::Comma)?;
                    }
                }
                Operand::Vec(items)
            }
            other => return Err((line, format!("unexpected `{}` in an operand", other.text()))),
        };
        if self.eat(Tok::Pipe) {
            let second = self.operand()?;
            return Ok(Operand::Pair(Box::new(op), Box::new(second)));
        }
        Ok(op)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_module_with_an_entry() {
        let m = parse(
            ".version 8.0\n.target sm_80\n.address_size 64\n.extern .shared .align 16 .b8 dyn[];\n\
             .visible .entry k(\n.param .u64 k_param_0,\n.param .align 8 .b8 k_param_1[16]\n)\n.maxntid 256, 1, 1\n{\n\
             .reg .b32 %r<3>;\n.local .align 8 .b8 __local_depot0[16];\n\
             $L0:\n@!%p1 bra $L0;\nshfl.sync.bfly.b32 %r1|%p2, %r2, 1, 0x1f, -1;\n{\n.reg .pred p;\n}\nld.param.u64 %rd1, [k_param_0+8];\nret;\n}\n",
        )
        .expect("parses");
        assert_eq!(m.version.as_deref(), Some("8.0"));
        assert_eq!(m.vars.len(), 1);
        assert!(m.vars[0].is_extern && m.vars[0].len == Some(None));
        let f = &m.functions[0];
        assert_eq!(f.params.len(), 2);
        assert_eq!(f.params[1].len, Some(16));
        assert_eq!(f.maxntid, Some([256, 1, 1]));
        let body = f.body.as_ref().expect("a body");
        assert_eq!(body.len(), 10);
        match &body[3] {
            Stmt::Inst(i) => {
                assert_eq!(i.guard, Some((true, "%p1".into())));
                assert_eq!(i.operands, vec![Operand::Sym("$L0".into(), 0)]);
            }
            other => panic!("{other:?}"),
        }
        match &body[4] {
            Stmt::Inst(i) => {
                assert!(matches!(i.operands[0], Operand::Pair(..)));
                assert_eq!(i.operands[4], Operand::Imm(Imm::Int(-1)));
            }
            other => panic!("{other:?}"),
        }
        match &body[8] {
            Stmt::Inst(i) => assert_eq!(i.operands[1], Operand::Addr(AddrBase::Sym("k_param_0".into()), 8)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_name_the_line() {
        let e = parse(".version 8.0\n.entry k()\n{\n add.s32 %r1, %r2 %r3;\n}").unwrap_err();
        assert_eq!(e.0, 4, "{e:?}");
        assert!(e.1.contains("expected `,`"), "{e:?}");
        let e = parse(".version 8.0\n.bogus 3").unwrap_err();
        assert_eq!(e, (2, "unsupported module-level `.bogus`".into()));
    }
}

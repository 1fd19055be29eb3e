//! The parser of the text IR: the exact inverse of [`crate::print`].
//!
//! `print_kernel(&parse_kernel(&print_kernel(k))?) == print_kernel(k)` for every kernel the
//! printer can write, with and without `!loc` locations. Value handles are the numbers in the
//! text (`%17` is `Value(17)`); numbers the text skips become unused `u32` placeholders in the
//! value arena. Besides what the printer writes, the parser accepts:
//!
//! - comments from `;` to the end of the line, and blank lines;
//! - decimal float constants (`const 1.5`, `const -2e-3`; f16 and bf16 round through f64) and
//!   hex bit patterns for integer constants;
//! - `if %c { ... }` without an `else` (an empty else region).
//!
//! The parser checks syntax, names (ops, types, special registers, shared arrays) and that
//! every value is defined once, textually before its uses. Everything else (types of
//! operands, scoping, result counts) is the verifier's job: a kernel that parses need not
//! verify. Bad input is a [`ParseError`], never a panic.

mod lexer;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use lexer::{lex, unescape, Tok, Token};

use crate::kernel::*;
use crate::types::{AddrSpace, ScalarType, Type};

/// Value numbers at or above this are rejected (the arena is allocated up to the largest).
pub const MAX_VALUES: u32 = 1 << 22;

/// How deeply `if` and `for` regions may nest.
pub const MAX_NESTING: usize = 64;

/// Where and why the text is not a kernel. Displays as `line:col: expected X, found Y`, then
/// the source line and a caret under the column.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column, in characters.
    pub col: usize,
    pub expected: String,
    pub found: String,
    /// The whole line the error is on, without its line break.
    pub source_line: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}:{}: expected {}, found {}", self.line, self.col, self.expected, self.found)?;
        writeln!(f, "{}", self.source_line)?;
        // Keep tabs so that the caret lines up under tab-indented text.
        let pad: String = self
            .source_line
            .chars()
            .take(self.col.saturating_sub(1))
            .map(|c| if c == '\t' { '\t' } else { ' ' })
            .collect();
        write!(f, "{pad}^")
    }
}

impl std::error::Error for ParseError {}

/// Parse one kernel from its text form.
pub fn parse_kernel(text: &str) -> Result<Kernel, ParseError> {
    let mut p = Parser {
        src: text,
        toks: lex(text),
        pos: 0,
        k: Kernel::new(""),
        defined: vec![],
        files: HashMap::new(),
        depth: 0,
    };
    p.kernel()?;
    Ok(p.k)
}

type PResult<T> = Result<T, ParseError>;

/// A value definition waiting to be entered: defined only once its instruction is complete, so
/// that an instruction cannot use its own results.
struct Def {
    id: u32,
    ty: Type,
    tok: usize,
}

struct Parser<'a> {
    src: &'a str,
    toks: Vec<Token>,
    pos: usize,
    k: Kernel,
    /// Per value number: whether the text has defined it yet.
    defined: Vec<bool>,
    /// `!loc` file names, shared between instructions.
    files: HashMap<String, Arc<str>>,
    /// Current nesting of `if`/`for` regions.
    depth: usize,
}

impl<'a> Parser<'a> {
    // ---- tokens -------------------------------------------------------------------------

    fn peek(&self) -> Option<Tok> {
        self.toks.get(self.pos).and_then(|t| t.tok)
    }

    fn at_end(&self) -> bool {
        self.pos >= self.toks.len()
    }

    fn slice(&self, i: usize) -> &'a str {
        let src: &'a str = self.src;
        self.toks.get(i).map_or("", |t| &src[t.span.clone()])
    }

    fn bump(&mut self) -> usize {
        self.pos += 1;
        self.pos - 1
    }

    fn eat(&mut self, tok: Tok) -> bool {
        if !self.at_end() && self.peek() == Some(tok) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    /// What the token at `i` is, for messages.
    fn describe(&self, i: usize) -> String {
        let Some(t) = self.toks.get(i) else { return "end of input".into() };
        let text = self.slice(i);
        let short: String = text.chars().take(40).collect();
        let short = if short.len() < text.len() { format!("{short}...") } else { short };
        match t.tok {
            Some(Tok::Newline) => "end of line".into(),
            None => format!("invalid character `{}`", short.escape_debug()),
            Some(_) => format!("`{}`", short.escape_debug()),
        }
    }

    fn err_at(&self, i: usize, expected: impl Into<String>, found: impl Into<String>) -> ParseError {
        let offset = self.toks.get(i).map_or(self.src.len(), |t| t.span.start);
        let line_start = self.src[..offset].rfind('\n').map_or(0, |n| n + 1);
        let line_end = self.src[offset..].find('\n').map_or(self.src.len(), |n| offset + n);
        ParseError {
            line: self.src[..offset].matches('\n').count() + 1,
            col: self.src[line_start..offset].chars().count() + 1,
            expected: expected.into(),
            found: found.into(),
            source_line: self.src[line_start..line_end].trim_end_matches('\r').to_string(),
        }
    }

    /// "expected `expected`, found <the current token>".
    fn unexpected(&self, expected: impl Into<String>) -> ParseError {
        self.err_at(self.pos, expected, self.describe(self.pos))
    }

    fn expect(&mut self, tok: Tok, what: &str) -> PResult<usize> {
        if self.eat(tok) {
            Ok(self.pos - 1)
        } else {
            Err(self.unexpected(what))
        }
    }

    fn ident(&mut self, what: &str) -> PResult<(usize, &'a str)> {
        let i = self.expect(Tok::Ident, what)?;
        Ok((i, self.slice(i)))
    }

    fn keyword(&mut self, word: &str) -> PResult<()> {
        if self.peek() == Some(Tok::Ident) && self.slice(self.pos) == word {
            self.pos += 1;
            Ok(())
        } else {
            Err(self.unexpected(format!("`{word}`")))
        }
    }

    fn end_of_line(&mut self) -> PResult<()> {
        if self.at_end() || self.eat(Tok::Newline) {
            Ok(())
        } else {
            Err(self.unexpected("end of line"))
        }
    }

    fn skip_blank_lines(&mut self) {
        while self.eat(Tok::Newline) {}
    }

    /// An unsigned decimal number that fits `T`.
    fn number<T: std::str::FromStr>(&mut self, what: &str) -> PResult<T> {
        let i = self.expect(Tok::Int, what)?;
        let text = self.slice(i);
        text.parse::<T>().map_err(|_| self.err_at(i, what, format!("`{text}`")))
    }

    // ---- values -------------------------------------------------------------------------

    fn value_number(&mut self) -> PResult<(usize, u32)> {
        let i = self.expect(Tok::Value, "a value such as `%0`")?;
        let text = self.slice(i);
        match text[1..].parse::<u32>() {
            Ok(n) if n < MAX_VALUES => Ok((i, n)),
            _ => Err(self.err_at(i, format!("a value number below {MAX_VALUES}"), format!("`{text}`"))),
        }
    }

    /// A use of a value defined earlier in the text.
    fn use_value(&mut self) -> PResult<Value> {
        let (i, n) = self.value_number()?;
        if self.defined.get(n as usize).copied().unwrap_or(false) {
            Ok(Value(n))
        } else {
            Err(self.err_at(i, "a value defined earlier", format!("`%{n}`, which is not defined before this use")))
        }
    }

    fn value_list(&mut self) -> PResult<Vec<Value>> {
        let mut vals = vec![self.use_value()?];
        while self.eat(Tok::Comma) {
            vals.push(self.use_value()?);
        }
        Ok(vals)
    }

    /// `%N: type`
    fn def(&mut self) -> PResult<Def> {
        let (tok, id) = self.value_number()?;
        self.expect(Tok::Colon, "`:`")?;
        let ty = self.ty()?;
        Ok(Def { id, ty, tok })
    }

    fn define(&mut self, d: &Def) -> PResult<Value> {
        let n = d.id as usize;
        if self.defined.get(n).copied().unwrap_or(false) {
            return Err(self.err_at(d.tok, "a value number not defined before", format!("`%{n}`, defined twice")));
        }
        if n >= self.k.values.len() {
            self.k.values.resize(n + 1, ValueData { ty: Type::U32 });
            self.defined.resize(n + 1, false);
        }
        self.k.values[n].ty = d.ty;
        self.defined[n] = true;
        Ok(Value(d.id))
    }

    // ---- types --------------------------------------------------------------------------

    fn scalar_type(&mut self) -> PResult<ScalarType> {
        let (i, name) = self.ident("a scalar type")?;
        ScalarType::from_name(name).ok_or_else(|| self.err_at(i, "a scalar type", format!("`{name}`")))
    }

    fn ty(&mut self) -> PResult<Type> {
        let (i, name) = self.ident("a type")?;
        if let Some(s) = ScalarType::from_name(name) {
            return Ok(Type::Scalar(s));
        }
        if name == "ptr" {
            self.expect(Tok::Lt, "`<`")?;
            let (j, space) = self.ident("an address space")?;
            let space = AddrSpace::from_name(space).ok_or_else(|| {
                self.err_at(j, "an address space (global, shared, local, param, const)", format!("`{space}`"))
            })?;
            self.expect(Tok::Comma, "`,`")?;
            let elem = self.scalar_type()?;
            self.expect(Tok::Gt, "`>`")?;
            return Ok(Type::Ptr(space, elem));
        }
        // `v4f32`: lanes, then the element type.
        if let Some(rest) = name.strip_prefix('v') {
            let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
            let lanes = rest[..digits].parse::<u8>().ok().filter(|n| (1..=16).contains(n));
            if let (Some(lanes), Some(elem)) = (lanes, ScalarType::from_name(&rest[digits..])) {
                return Ok(Type::Vector(elem, lanes));
            }
        }
        Err(self.err_at(i, "a type", format!("`{name}`")))
    }

    // ---- kernel -------------------------------------------------------------------------

    fn kernel(&mut self) -> PResult<()> {
        self.skip_blank_lines();
        self.keyword("kernel")?;
        let name = self.expect(Tok::At, "a kernel name such as `@scale`")?;
        self.k.name = self.slice(name)[1..].to_string();
        self.expect(Tok::LParen, "`(`")?;
        if !self.eat(Tok::RParen) {
            loop {
                let (tok, id) = self.value_number()?;
                let (_, pname) = self.ident("a parameter name")?;
                self.expect(Tok::Colon, "`:`")?;
                let ty = self.ty()?;
                let value = self.define(&Def { id, ty, tok })?;
                self.k.params.push(Param { name: pname.to_string(), value });
                if !self.eat(Tok::Comma) {
                    break;
                }
            }
            self.expect(Tok::RParen, "`,` or `)`")?;
        }
        self.expect(Tok::LBrace, "`{`")?;
        self.end_of_line()?;
        self.directives()?;
        let body = self.k.body;
        // The entry region never yields (`region` rejects a `yield` there).
        self.region(body)?;
        self.expect(Tok::RBrace, "an instruction or `}`")?;
        self.skip_blank_lines();
        if !self.at_end() {
            return Err(self.unexpected("end of input after the kernel"));
        }
        Ok(())
    }

    /// `.launch_bounds` and `.shared` lines, which come before the first instruction.
    fn directives(&mut self) -> PResult<()> {
        loop {
            self.skip_blank_lines();
            if self.peek() != Some(Tok::Directive) {
                return Ok(());
            }
            let i = self.bump();
            match self.slice(i) {
                ".launch_bounds" => {
                    if self.k.launch_bounds.is_some() {
                        return Err(self.err_at(i, "one `.launch_bounds`", "a second one"));
                    }
                    let max_threads = self.number("a thread count")?;
                    let min_blocks = if self.eat(Tok::Comma) { Some(self.number("a block count")?) } else { None };
                    self.k.launch_bounds = Some(LaunchBounds { max_threads, min_blocks });
                }
                ".shared" => {
                    let name = self.expect(Tok::At, "a shared array name such as `@tile`")?;
                    let name = self.slice(name)[1..].to_string();
                    self.expect(Tok::Colon, "`:`")?;
                    let elem = self.scalar_type()?;
                    self.expect(Tok::LBracket, "`[`")?;
                    let len = self.number("an array length")?;
                    self.expect(Tok::RBracket, "`]`")?;
                    self.keyword("align")?;
                    let align = self.number("an alignment in bytes")?;
                    self.k.shared.push(SharedDecl { name, elem, len, align });
                }
                other => {
                    return Err(self.err_at(i, "`.launch_bounds` or `.shared`", format!("`{other}`")));
                }
            }
            self.end_of_line()?;
        }
    }

    /// Instructions up to (not including) the region's closing `}`; returns the values of a
    /// `yield` line, which must be the region's last.
    fn region(&mut self, r: RegionId) -> PResult<Vec<Value>> {
        loop {
            self.skip_blank_lines();
            match self.peek() {
                _ if self.at_end() => return Err(self.unexpected("an instruction or `}`")),
                Some(Tok::RBrace) => return Ok(vec![]),
                Some(Tok::Ident) if self.slice(self.pos) == "yield" => {
                    if r == self.k.body {
                        return Err(self.unexpected("an instruction or `}` (only `if` and `for` regions yield)"));
                    }
                    self.bump();
                    let yields = self.value_list()?;
                    self.end_of_line()?;
                    self.skip_blank_lines();
                    if self.peek() != Some(Tok::RBrace) || self.at_end() {
                        return Err(self.unexpected("`}` after `yield`"));
                    }
                    return Ok(yields);
                }
                Some(Tok::Directive) => {
                    return Err(self.unexpected("an instruction (directives come before the first instruction)"));
                }
                _ => self.inst(r)?,
            }
        }
    }

    /// One instruction line (with its nested regions), appended to region `r`.
    fn inst(&mut self, r: RegionId) -> PResult<()> {
        let mut defs = vec![];
        if self.peek() == Some(Tok::Value) {
            loop {
                defs.push(self.def()?);
                if !self.eat(Tok::Comma) {
                    break;
                }
            }
            self.expect(Tok::Eq, "`,` or `=`")?;
        }
        let (op_tok, name) = self.ident("an operation")?;
        let op = self.op(op_tok, name, &defs)?;
        if let Some(Tok::Loc) = self.peek() {
            self.bump();
            let loc = self.loc()?;
            self.push(r, op, &defs, Some(loc))?;
        } else {
            self.push(r, op, &defs, None)?;
        }
        self.end_of_line()
    }

    fn push(&mut self, r: RegionId, op: Op, defs: &[Def], loc: Option<Loc>) -> PResult<()> {
        let results = defs.iter().map(|d| self.define(d)).collect::<PResult<Vec<_>>>()?;
        let id = self.k.push_inst(Inst { op, results, loc });
        self.k.regions[r.index()].insts.push(id);
        Ok(())
    }

    /// `"file":line:col` after `!loc`.
    fn loc(&mut self) -> PResult<Loc> {
        let i = self.expect(Tok::Str, "a quoted file name")?;
        let quoted = self.slice(i);
        let file = unescape(&quoted[1..quoted.len() - 1])
            .ok_or_else(|| self.err_at(i, "a string as Rust's `{:?}` escapes it", format!("`{quoted}`")))?;
        self.expect(Tok::Colon, "`:`")?;
        let line = self.number("a line number")?;
        self.expect(Tok::Colon, "`:`")?;
        let col = self.number("a column number")?;
        let file = self.files.entry(file).or_insert_with_key(|f| Arc::from(f.as_str())).clone();
        Ok(Loc { file, line, col })
    }

    /// The one result type of an op that takes its target type from it (`cvt`, `load`, ...).
    fn result_type(&self, op_tok: usize, name: &str, defs: &[Def]) -> PResult<Type> {
        match defs {
            [d] => Ok(d.ty),
            _ => Err(self.err_at(
                op_tok,
                format!("`{name}` to define exactly one value (its type is the result type)"),
                format!("{} definitions", defs.len()),
            )),
        }
    }

    fn result_scalar(&self, op_tok: usize, name: &str, defs: &[Def]) -> PResult<ScalarType> {
        let ty = self.result_type(op_tok, name, defs)?;
        ty.scalar()
            .ok_or_else(|| self.err_at(defs[0].tok, format!("a scalar result type for `{name}`"), format!("`{ty}`")))
    }

    fn result_pointer(&self, op_tok: usize, name: &str, defs: &[Def]) -> PResult<ScalarType> {
        match self.result_type(op_tok, name, defs)? {
            Type::Ptr(_, elem) => Ok(elem),
            ty => Err(self.err_at(defs[0].tok, format!("a pointer result type for `{name}`"), format!("`{ty}`"))),
        }
    }

    fn comma(&mut self) -> PResult<()> {
        self.expect(Tok::Comma, "`,`").map(|_| ())
    }

    fn two(&mut self) -> PResult<(Value, Value)> {
        let a = self.use_value()?;
        self.comma()?;
        Ok((a, self.use_value()?))
    }

    fn three(&mut self) -> PResult<(Value, Value, Value)> {
        let (a, b) = self.two()?;
        self.comma()?;
        Ok((a, b, self.use_value()?))
    }

    /// The operation named `name` (at token `op_tok`) and its operands.
    fn op(&mut self, op_tok: usize, name: &'a str, defs: &[Def]) -> PResult<Op> {
        let mut parts = name.split('.');
        let head = parts.next().unwrap_or("");
        let suffixes: Vec<&str> = parts.collect();
        let unknown = |p: &Self| p.err_at(op_tok, "an operation", format!("`{name}`"));
        let mode = |p: &Self| -> PResult<&'a str> {
            match suffixes.as_slice() {
                [m] => Ok(m),
                _ => Err(unknown(p)),
            }
        };
        if !suffixes.is_empty()
            && !matches!(head, "cmp" | "cvt" | "atomic" | "shfl" | "vote" | "mma" | "ldmatrix" | "cp")
        {
            return Err(unknown(self));
        }
        Ok(match head {
            "const" => {
                let ty = self.result_scalar(op_tok, name, defs)?;
                Op::Const(self.constant(ty)?)
            }
            "special" => {
                let (i, reg) = self.ident("a special register such as `tid.x`")?;
                Op::Special(
                    SpecialReg::from_name(reg)
                        .ok_or_else(|| self.err_at(i, "a special register such as `tid.x`", format!("`{reg}`")))?,
                )
            }
            "fma" => {
                let (a, b, c) = self.three()?;
                Op::Fma(a, b, c)
            }
            "cmp" => {
                let op = CmpOp::from_name(mode(self)?).ok_or_else(|| unknown(self))?;
                let (a, b) = self.two()?;
                Op::Cmp(op, a, b)
            }
            "select" => {
                let (c, a, b) = self.three()?;
                Op::Select(c, a, b)
            }
            "cvt" => {
                let (rounding, sat) = match suffixes.as_slice() {
                    [] => (None, false),
                    ["sat"] => (None, true),
                    [r] => (Some(Rounding::from_name(r).ok_or_else(|| unknown(self))?), false),
                    [r, "sat"] => (Some(Rounding::from_name(r).ok_or_else(|| unknown(self))?), true),
                    _ => return Err(unknown(self)),
                };
                let to = self.result_scalar(op_tok, name, defs)?;
                Op::Cvt(self.use_value()?, Cvt { to, rounding, sat })
            }
            "bitcast" => {
                let to = self.result_scalar(op_tok, name, defs)?;
                Op::Bitcast(self.use_value()?, to)
            }
            "ptradd" => {
                let (p, i) = self.two()?;
                Op::PtrAdd(p, i)
            }
            "ptrcast" => {
                let elem = self.result_pointer(op_tok, name, defs)?;
                Op::PtrCast(self.use_value()?, elem)
            }
            "shared_base" => {
                let i = self.expect(Tok::At, "a shared array name such as `@tile`")?;
                let wanted = &self.slice(i)[1..];
                let pos = self.k.shared.iter().position(|s| s.name == wanted);
                Op::SharedBase(SharedId(
                    pos.ok_or_else(|| self.err_at(i, "a shared array declared by `.shared`", format!("`@{wanted}`")))?
                        as u32,
                ))
            }
            "dyn_shared_base" => Op::DynSharedBase(self.result_pointer(op_tok, name, defs)?),
            "load" => {
                let lanes = match self.result_type(op_tok, name, defs)? {
                    Type::Scalar(_) => 1,
                    Type::Vector(_, n) => n,
                    ty => {
                        return Err(self.err_at(
                            defs[0].tok,
                            "a scalar or vector result type for `load`",
                            format!("`{ty}`"),
                        ))
                    }
                };
                Op::Load { ptr: self.use_value()?, lanes }
            }
            "store" => {
                let (ptr, value) = self.two()?;
                Op::Store { ptr, value }
            }
            "atomic" => {
                let op = AtomicOp::from_name(mode(self)?).ok_or_else(|| unknown(self))?;
                let (ptr, a) = self.two()?;
                // `atomic.cas %p, %compare, %value`; a third operand on other ops parses too,
                // so that the verifier can say why it is wrong.
                if self.eat(Tok::Comma) {
                    let value = self.use_value()?;
                    Op::Atomic { op, ptr, value, compare: Some(a) }
                } else {
                    Op::Atomic { op, ptr, value: a, compare: None }
                }
            }
            "barrier" => Op::Barrier,
            "shfl" => {
                let mode = ShflMode::from_name(mode(self)?).ok_or_else(|| unknown(self))?;
                let (value, lane) = self.two()?;
                Op::Shfl { mode, value, lane }
            }
            "vote" => {
                let mode = VoteMode::from_name(mode(self)?).ok_or_else(|| unknown(self))?;
                Op::Vote { mode, pred: self.use_value()? }
            }
            "mma" => {
                let ty = match suffixes.as_slice() {
                    ["m16n8k16", t] => MmaType::from_name(t).ok_or_else(|| unknown(self))?,
                    _ => return Err(unknown(self)),
                };
                let (a, b, c) = self.three()?;
                Op::Mma { ty, a, b, c }
            }
            "ldmatrix" => {
                let (count, trans) = match suffixes.as_slice() {
                    ["x1"] => (1, false),
                    ["x2"] => (2, false),
                    ["x4"] => (4, false),
                    ["x1", "trans"] => (1, true),
                    ["x2", "trans"] => (2, true),
                    ["x4", "trans"] => (4, true),
                    _ => return Err(unknown(self)),
                };
                Op::LdMatrix { ptr: self.use_value()?, count, trans }
            }
            "cp" => match suffixes.as_slice() {
                ["async", "commit_group"] => Op::CpAsyncCommit,
                ["async", "wait_group"] => Op::CpAsyncWait(self.number("a group count (0..=255)")?),
                // Any byte count parses, so that the verifier can say which sizes exist.
                ["async", size] => {
                    let size = size.parse().map_err(|_| unknown(self))?;
                    let (dst, src) = self.two()?;
                    let src_size = if self.eat(Tok::Comma) { Some(self.use_value()?) } else { None };
                    Op::CpAsync { dst, src, size, src_size }
                }
                _ => return Err(unknown(self)),
            },
            "extract" => {
                let v = self.use_value()?;
                self.comma()?;
                Op::Extract(v, self.number("a lane index (0..=255)")?)
            }
            "vector" => Op::MakeVector(self.value_list()?),
            "if" => self.if_op(op_tok)?,
            "for" => self.for_op(op_tok)?,
            _ => {
                if let Some(op) = UnaryOp::from_name(head) {
                    Op::Unary(op, self.use_value()?)
                } else if let Some(op) = BinaryOp::from_name(head) {
                    let (a, b) = self.two()?;
                    Op::Binary(op, a, b)
                } else {
                    return Err(unknown(self));
                }
            }
        })
    }

    /// The literal of a `const` of type `ty`.
    fn constant(&mut self, ty: ScalarType) -> PResult<Constant> {
        let i = self.pos;
        let text = self.slice(i);
        let bad = |p: &Self| p.err_at(i, format!("a {ty} constant"), p.describe(i));
        let bits = ty.bits();
        let max = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
        let value: u64 = match (self.peek(), ty) {
            (Some(Tok::Ident), ScalarType::Pred) => match text {
                "true" => 1,
                "false" => 0,
                _ => return Err(bad(self)),
            },
            (_, ScalarType::Pred) => return Err(bad(self)),
            (Some(Tok::Hex), _) => {
                u64::from_str_radix(&text[2..], 16).ok().filter(|v| *v <= max).ok_or_else(|| bad(self))?
            }
            (Some(Tok::Int), t) if t.is_signed_int() => {
                let v = text.parse::<i64>().map_err(|_| bad(self))?;
                let (lo, hi) =
                    if bits >= 64 { (i64::MIN, i64::MAX) } else { (-(1i64 << (bits - 1)), (1i64 << (bits - 1)) - 1) };
                if v < lo || v > hi {
                    return Err(bad(self));
                }
                v as u64 & max
            }
            (Some(Tok::Int), t) if t.is_unsigned_int() => {
                text.parse::<u64>().ok().filter(|v| *v <= max).ok_or_else(|| bad(self))?
            }
            (Some(Tok::Int | Tok::Float), t) if t.is_float() => {
                let v = text.parse::<f64>().map_err(|_| bad(self))?;
                match t {
                    ScalarType::F64 => v.to_bits(),
                    // Parsed directly so that f32 decimals round once.
                    ScalarType::F32 => text.parse::<f32>().map_err(|_| bad(self))?.to_bits() as u64,
                    ScalarType::F16 => half::f16::from_f64(v).to_bits() as u64,
                    _ => half::bf16::from_f64(v).to_bits() as u64,
                }
            }
            _ => return Err(bad(self)),
        };
        self.bump();
        Ok(Constant::new(ty, value))
    }

    fn nested(&mut self, op_tok: usize) -> PResult<()> {
        if self.depth >= MAX_NESTING {
            return Err(self.err_at(op_tok, format!("at most {MAX_NESTING} nested regions"), "one more"));
        }
        self.depth += 1;
        Ok(())
    }

    /// `{` NEWLINE, the region's lines, `}`; returns the yields.
    fn braced_region(&mut self, r: RegionId) -> PResult<Vec<Value>> {
        self.expect(Tok::LBrace, "`{`")?;
        self.end_of_line()?;
        let yields = self.region(r)?;
        self.expect(Tok::RBrace, "`}`")?;
        Ok(yields)
    }

    /// `if %c { ... } else { ... }` (the else part may be left out).
    fn if_op(&mut self, op_tok: usize) -> PResult<Op> {
        self.nested(op_tok)?;
        let cond = self.use_value()?;
        let then_region = self.k.new_region();
        let else_region = self.k.new_region();
        let yields = self.braced_region(then_region)?;
        self.k.regions[then_region.index()].yields = yields;
        if self.peek() == Some(Tok::Ident) && self.slice(self.pos) == "else" {
            self.bump();
            let yields = self.braced_region(else_region)?;
            self.k.regions[else_region.index()].yields = yields;
        }
        self.depth -= 1;
        Ok(Op::If { cond, then_region, else_region })
    }

    /// `for %iv: ty = %start to %end step %step iter(%p: ty = %init, ...) { ... }`
    fn for_op(&mut self, op_tok: usize) -> PResult<Op> {
        self.nested(op_tok)?;
        let iv = self.def()?;
        self.expect(Tok::Eq, "`=`")?;
        let start = self.use_value()?;
        self.keyword("to")?;
        let end = self.use_value()?;
        self.keyword("step")?;
        let step = self.use_value()?;
        let mut params = vec![iv];
        let mut init = vec![];
        if self.peek() == Some(Tok::Ident) && self.slice(self.pos) == "iter" {
            self.bump();
            self.expect(Tok::LParen, "`(`")?;
            loop {
                params.push(self.def()?);
                self.expect(Tok::Eq, "`=`")?;
                init.push(self.use_value()?);
                if !self.eat(Tok::Comma) {
                    break;
                }
            }
            self.expect(Tok::RParen, "`,` or `)`")?;
        }
        let body = self.k.new_region();
        let params = params.iter().map(|d| self.define(d)).collect::<PResult<Vec<_>>>()?;
        self.k.regions[body.index()].params = params;
        let yields = self.braced_region(body)?;
        self.k.regions[body.index()].yields = yields;
        self.depth -= 1;
        Ok(Op::For { start, end, step, init, body })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caret_points_at_the_column() {
        let e = parse_kernel("kernel @k() {\n  %0: u32 = frob %1\n}\n").unwrap_err();
        assert_eq!((e.line, e.col), (2, 13));
        assert_eq!(e.to_string(), "2:13: expected an operation, found `frob`\n  %0: u32 = frob %1\n            ^");
    }

    #[test]
    fn value_numbers_are_kept_and_gaps_filled() {
        let k = parse_kernel("kernel @k(%3 n: u32) {\n  %7: u32 = add %3, %3\n}\n").unwrap();
        assert_eq!(k.values.len(), 8);
        assert_eq!(k.params[0].value, Value(3));
        assert_eq!(k.ty(Value(7)), Type::U32);
        assert_eq!(k.inst(k.region(k.body).insts[0]).results, vec![Value(7)]);
    }
}

//! `ruda-ptx-emu`: a parser and CPU emulator for the PTX that RUDA's backends emit, so that a
//! wrong lowering shows up on machines without a GPU: the emitted PTX runs here and is compared
//! with the interpreter bit for bit.
//!
//! - [`Module::parse`] reads a PTX module (a `logos` lexer, then a parser of directives, entries,
//!   declarations, labels and predicated instructions) and decodes every entry into
//!   pre-decoded instructions over a flat per-thread register file. An instruction or modifier
//!   outside the modelled subset is an [`EmuError::Unsupported`] naming the line, never a
//!   silent skip (see `docs/ptx-emulator.md` for the coverage).
//! - [`Module::launch`] (or [`run_ptx`], with the interpreter's argument types) runs an entry
//!   on host buffers. Each thread runs on its own until it reaches a barrier or a warp-wide
//!   operation, which completes when every participating thread has arrived; blocks run in
//!   parallel on CPU threads. Memory accesses are checked for bounds and alignment; a barrier
//!   or warp operation that some thread never reaches is reported as a deadlock.
//!
//! Semantics follow the PTX ISA as the interpreter (`ruda_ir::interp`) models it: canonical
//! NaNs from float arithmetic, PTX's `min`/`max` rules, shifts clamped to the width, `cvt` in
//! every rounding mode without double rounding, saturating float-to-integer conversions with
//! PTX's NaN rule, and the `.approx` functions computed as the correctly rounded f64 result
//! rounded once to f32 (the interpreter's model, within the ISA's stated bounds). Global memory
//! uses the interpreter's addresses (buffer `i` at `(i + 1) << 40`); integer division by zero
//! is an error, as in the interpreter.

mod decode;
mod exec;
mod lexer;
mod memory;
mod num;
mod parse;
mod program;

use ruda_ir::interp::{KernelArg, LaunchConfig, MAX_SHARED_BYTES};
use ruda_ir::{Constant, ScalarType};

use exec::{thread_of, Fault, FaultKind, Launch, Worker};
use memory::{Buffer, Global, BUFFER_SHIFT};
use program::{ModuleVar, Program};

pub use ruda_ir::interp::global_buffer_address;

/// What kind of runtime error stopped a launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Out-of-bounds or misaligned access, or an access to no buffer.
    Memory,
    /// Integer division by zero.
    Arithmetic,
    /// `trap`, or a barrier used in a way PTX forbids.
    Trap,
    /// A barrier or warp operation some thread never reaches.
    Deadlock,
    /// A thread took more backward branches than [`Options::max_loops`].
    NonTermination,
}

/// Why PTX could not be parsed or run.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum EmuError {
    /// The text is not PTX this parser understands.
    #[error("PTX line {line}: {message}")]
    Parse { line: u32, message: String },
    /// Valid PTX outside the modelled subset.
    #[error("PTX line {line}: unsupported {message}: `{text}`")]
    Unsupported { line: u32, text: String, message: String },
    /// The launch does not fit the entry (shape, arguments, shared memory), or no such entry.
    #[error("entry `{entry}`: launch: {message}")]
    Launch { entry: String, message: String },
    /// A thread failed while running.
    #[error("entry `{entry}`: {message} at PTX line {line} (`{text}`) in block {block:?} thread {thread:?}")]
    Runtime {
        entry: String,
        kind: ErrorKind,
        line: u32,
        text: String,
        block: [u32; 3],
        thread: [u32; 3],
        message: String,
    },
}

/// One argument of [`Module::launch`].
pub enum Arg<'a> {
    /// A global buffer: the entry's `.u64` parameter receives its address.
    Buffer(&'a mut [u8]),
    /// A scalar; its size must be the parameter's, and an f32/f64 only goes to a float
    /// parameter (an integer to an integer one); `.b` parameters take either, and f16/bf16
    /// bits go to any 16-bit parameter.
    Scalar(Constant),
    /// The raw little-endian bytes of a parameter (any type, including `.b8` arrays).
    Bytes(&'a [u8]),
}

/// How a launch runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// CPU threads running blocks (0 counts as 1).
    pub threads: usize,
    /// Backward branches a thread may take before the launch fails as not terminating.
    pub max_loops: u64,
}

impl Default for Options {
    fn default() -> Options {
        Options { threads: std::thread::available_parallelism().map_or(1, |n| n.get()), max_loops: 1 << 30 }
    }
}

/// A parameter of an entry, as [`Module::params`] lists them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: String,
    /// The PTX type without its dot (`u64`, `f32`, `b8`, ...).
    pub ty: String,
    /// Size in bytes.
    pub size: u32,
}

/// A parsed and decoded PTX module.
pub struct Module {
    source: String,
    version: Option<String>,
    target: Vec<String>,
    entries: Vec<Program>,
    vars: Vec<ModuleVar>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("version", &self.version)
            .field("target", &self.target)
            .field("entries", &self.entries().collect::<Vec<_>>())
            .finish()
    }
}

fn line_text(source: &str, line: u32) -> String {
    source.lines().nth(line.saturating_sub(1) as usize).unwrap_or("").trim().to_string()
}

impl Module {
    /// Parse `ptx` and decode every entry.
    pub fn parse(ptx: &str) -> Result<Module, EmuError> {
        let ast = parse::parse(ptx).map_err(|(line, message)| EmuError::Parse { line, message })?;
        let (entries, vars) = decode::decode(&ast).map_err(|e| {
            if e.unsupported {
                EmuError::Unsupported { line: e.line, text: line_text(ptx, e.line), message: e.message }
            } else {
                EmuError::Parse { line: e.line, message: e.message }
            }
        })?;
        Ok(Module { source: ptx.to_string(), version: ast.version, target: ast.target, entries, vars })
    }

    /// The `.version` directive's value.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// The `.target` directive's values (`sm_80`, ...).
    pub fn target(&self) -> &[String] {
        &self.target
    }

    /// The names of the entries with a body, in order.
    pub fn entries(&self) -> impl Iterator<Item = &str> {
        self.entries.iter().map(|p| p.name.as_str())
    }

    fn program(&self, entry: &str) -> Result<&Program, EmuError> {
        self.entries.iter().find(|p| p.name == entry).ok_or_else(|| EmuError::Launch {
            entry: entry.to_string(),
            message: format!("no such entry; the module has {:?}", self.entries().collect::<Vec<_>>()),
        })
    }

    /// The parameters of `entry`, in order.
    pub fn params(&self, entry: &str) -> Result<Vec<ParamInfo>, EmuError> {
        Ok(self
            .program(entry)?
            .params
            .iter()
            .map(|p| ParamInfo { name: p.name.clone(), ty: p.ty.clone(), size: p.size })
            .collect())
    }

    /// Run `entry` on host buffers; the buffers hold the results afterwards (on an error,
    /// whatever the blocks wrote before it).
    pub fn launch(
        &self,
        entry: &str,
        cfg: &LaunchConfig,
        args: &mut [Arg<'_>],
        opts: &Options,
    ) -> Result<(), EmuError> {
        let prog = self.program(entry)?;
        let launch_err = |message: String| EmuError::Launch { entry: entry.to_string(), message };
        validate_shape(prog, cfg).map_err(launch_err)?;
        let shared_bytes = if cfg.dynamic_shared_bytes > 0 {
            prog.dyn_offset as u64 + cfg.dynamic_shared_bytes as u64
        } else {
            prog.static_shared as u64
        };
        if shared_bytes > MAX_SHARED_BYTES {
            return Err(launch_err(format!(
                "the block needs {shared_bytes} bytes of shared memory ({} static, {} dynamic), more than the {MAX_SHARED_BYTES} allowed",
                prog.static_shared, cfg.dynamic_shared_bytes
            )));
        }
        let params = bind_args(prog, args).map_err(launch_err)?;
        let mut global = Global {
            args: args
                .iter()
                .filter_map(|a| match a {
                    Arg::Buffer(b) => Some(Buffer::from_bytes(b)),
                    _ => None,
                })
                .collect(),
            vars: self.vars.iter().map(|v| Buffer::from_bytes(&v.init)).collect(),
        };
        let launch = Launch {
            prog,
            global: &global,
            params: &params,
            block: cfg.block,
            grid: cfg.grid,
            dyn_bytes: cfg.dynamic_shared_bytes,
            shared_bytes: shared_bytes as u32,
            max_loops: opts.max_loops,
        };
        let result = run_blocks(&launch, opts.threads);
        let fault = result.err();
        let global = std::mem::replace(&mut global, Global { args: vec![], vars: vec![] });
        let mut bufs = global.args.iter();
        for a in args.iter_mut() {
            if let Arg::Buffer(b) = a {
                if let Some(buf) = bufs.next() {
                    buf.copy_to(b);
                }
            }
        }
        match fault {
            None => Ok(()),
            Some((block, f)) => {
                let kind = match f.kind {
                    FaultKind::Memory => ErrorKind::Memory,
                    FaultKind::Arithmetic => ErrorKind::Arithmetic,
                    FaultKind::Trap => ErrorKind::Trap,
                    FaultKind::Deadlock => ErrorKind::Deadlock,
                    FaultKind::StepLimit => ErrorKind::NonTermination,
                };
                Err(EmuError::Runtime {
                    entry: entry.to_string(),
                    kind,
                    line: f.line,
                    text: line_text(&self.source, f.line),
                    block,
                    thread: thread_of(cfg.block, f.thread),
                    message: f.message,
                })
            }
        }
    }
}

/// Parse `ptx` and run `entry` with the interpreter's launch interface: buffer `i` is at
/// [`global_buffer_address`]`(i)`, as there.
pub fn run_ptx(ptx: &str, entry: &str, launch: &LaunchConfig, args: &mut [KernelArg<'_>]) -> Result<(), EmuError> {
    run_ptx_with(ptx, entry, launch, args, &Options::default())
}

/// [`run_ptx`] with explicit [`Options`].
pub fn run_ptx_with(
    ptx: &str,
    entry: &str,
    launch: &LaunchConfig,
    args: &mut [KernelArg<'_>],
    opts: &Options,
) -> Result<(), EmuError> {
    let module = Module::parse(ptx)?;
    let mut converted: Vec<Arg<'_>> = args
        .iter_mut()
        .map(|a| match a {
            KernelArg::Buffer(b) => Arg::Buffer(b),
            KernelArg::Scalar(c) => Arg::Scalar(*c),
        })
        .collect();
    module.launch(entry, launch, &mut converted, opts)
}

fn validate_shape(prog: &Program, cfg: &LaunchConfig) -> Result<(), String> {
    if cfg.grid.contains(&0) || cfg.block.contains(&0) {
        return Err(format!("grid {:?} and block {:?} must have no zero dimension", cfg.grid, cfg.block));
    }
    let threads = cfg.block.iter().map(|&d| d as u64).product::<u64>();
    if threads > 1024 || cfg.block[2] > 64 {
        return Err(format!(
            "block {:?} has {threads} threads; at most 1024 (and z at most 64) are allowed",
            cfg.block
        ));
    }
    if cfg.grid[0] > i32::MAX as u32 || cfg.grid[1] > 65535 || cfg.grid[2] > 65535 {
        return Err(format!("grid {:?} exceeds the limits (2^31-1, 65535, 65535)", cfg.grid));
    }
    if let Some(max) = prog.maxntid {
        let limit = max.iter().map(|&d| d as u64).product::<u64>();
        if threads > limit {
            return Err(format!("block {:?} has {threads} threads, more than the entry's .maxntid {max:?}", cfg.block));
        }
    }
    if let Some(req) = prog.reqntid {
        if req != cfg.block {
            return Err(format!("block {:?} differs from the entry's .reqntid {req:?}", cfg.block));
        }
    }
    Ok(())
}

fn is_float_param(ty: &str) -> bool {
    ty.starts_with('f')
}

/// The parameter window's bytes for `args`.
fn bind_args(prog: &Program, args: &[Arg<'_>]) -> Result<Vec<u8>, String> {
    if args.len() != prog.params.len() {
        return Err(format!("{} arguments given, the entry has {} parameters", args.len(), prog.params.len()));
    }
    let mut bytes = vec![0u8; prog.param_bytes as usize];
    let mut buffers = 0usize;
    for (p, a) in prog.params.iter().zip(args) {
        let value: Vec<u8> = match a {
            Arg::Buffer(buf) => {
                if p.size != 8 {
                    return Err(format!(
                        "parameter `{}` is .{} ({} bytes); a buffer needs a 64-bit parameter",
                        p.name, p.ty, p.size
                    ));
                }
                if buf.len() as u64 >= 1 << BUFFER_SHIFT {
                    return Err(format!(
                        "buffer for `{}` has {} bytes; at most 2^{BUFFER_SHIFT} are supported",
                        p.name,
                        buf.len()
                    ));
                }
                buffers += 1;
                global_buffer_address(buffers - 1).to_le_bytes().to_vec()
            }
            Arg::Scalar(c) => {
                if c.ty == ScalarType::Pred || c.ty.bytes() != p.size {
                    return Err(format!(
                        "parameter `{}` is .{} ({} bytes), the argument is {} {c}",
                        p.name, p.ty, p.size, c.ty
                    ));
                }
                // f16/bf16 are storage types: their bits go to any 16-bit parameter.
                let half = matches!(c.ty, ScalarType::F16 | ScalarType::BF16);
                if !half && !p.ty.starts_with('b') && c.ty.is_float() != is_float_param(&p.ty) {
                    return Err(format!("parameter `{}` is .{}, the argument is {} {c}", p.name, p.ty, c.ty));
                }
                c.bits.to_le_bytes()[..p.size as usize].to_vec()
            }
            Arg::Bytes(b) => {
                if b.len() != p.size as usize {
                    return Err(format!("parameter `{}` has {} bytes, {} given", p.name, p.size, b.len()));
                }
                b.to_vec()
            }
        };
        let at = p.offset as usize;
        bytes[at..at + value.len()].copy_from_slice(&value);
    }
    Ok(bytes)
}

/// Run every block; the error reported is that of the lowest linear block id that failed (the
/// interpreter's scheduler, so both engines report the same block).
fn run_blocks(launch: &Launch<'_>, threads: usize) -> Result<(), ([u32; 3], Fault)> {
    ruda_ir::interp::run_grid(launch.grid, threads, || Worker::new(launch), |w, block| w.run_block(block))
}

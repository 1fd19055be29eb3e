//! Random kernels for property tests and fuzzing: well typed, verifying, and free of
//! interpreter errors by construction, driven by a seed or by a fuzzer's bytes.
//!
//! ```
//! use ruda_ir::gen::{generate, run_generated, Entropy, GenConfig};
//!
//! let g = generate(&mut Entropy::from_seed(7), &GenConfig::default());
//! ruda_ir::verify(&g.kernel).expect("generated kernels verify");
//! let outputs = run_generated(&g, &g.kernel).expect("and run without errors");
//! assert_eq!(outputs.len(), g.buffer_count());
//! ```
//!
//! # What a kernel does
//!
//! Parameters are read-only input buffers (power-of-two lengths), one output buffer in which
//! every thread owns [`SLOTS`] slots of [`SLOT_BYTES`] bytes, optionally a buffer that only
//! atomics touch, a small `u32` trip count and a few scalars. The body is random straight-line
//! code, nested `if`s with yields and `for` loops with carried values, over every arithmetic
//! type, with conversions, bitcasts, vector and scalar loads and stores. What keeps every run
//! free of interpreter errors and its result independent of scheduling:
//!
//! - loads index with `value & (len - 1)` (aligned down for vectors), a constant, or a
//!   constant offset plus or minus masked halves; stores go only to the thread's own slots,
//!   which it may also read back;
//! - integer divisors are made odd (`x | 1`);
//! - shared memory is zeroed by the kernel first (a GPU does not), then used in exchanges:
//!   each thread stores into its own slot, a barrier, loads from anywhere, a barrier; all in
//!   block-uniform control flow (shared atomics on a counter array happen in the storing
//!   phase);
//! - warp shuffles (all modes, any lane operand) and votes only in warp-uniform control flow,
//!   with block sizes a multiple of 32;
//! - atomics are integer `add`, `min` and `max` into the atomics buffer or the shared
//!   counters, each kind on 16 bytes of its own (so they commute), their old values unused;
//!   or any atomic (`exch` and `cas` on floats too) on the thread's own output slot, whose old
//!   value is deterministic and is used;
//! - `mma` and `ldmatrix` only in warp-uniform control flow (`ldmatrix` in the load phase of
//!   an exchange, with 16-byte aligned rows); `cp.async` copies (some zero-filling past a
//!   source size) from an input buffer into the thread's own shared slot in the storing phase
//!   of an exchange, in one or two commit groups, read (by the thread itself) only after a
//!   `wait_group` that covers them and (by others) after the barrier;
//! - no float atomics; the approximate float functions are flagged
//!   ([`GeneratedKernel::uses_approx`]) for engines that compare them within error bounds;
//! - loop trip counts are small: constants, or a parameter or value masked to a few bits.
//!
//! Uniformity is tracked per value (block-uniform in the sense of
//! [`crate::verify::uniformity`], warp-uniform, or varying) and per point of control flow.
//!
//! Zero bytes (and a byte source that has run out) choose the simplest option everywhere, so a
//! shrinking fuzzer or `proptest` input shrinks toward small kernels.

use std::cell::{Cell, RefCell};

use crate::builder::KernelBuilder;
use crate::interp::{self, InterpError, KernelArg, LaunchConfig};
use crate::kernel::*;
use crate::types::{AddrSpace, ScalarType, Type};

use ScalarType::*;

/// Slots each thread owns in the output buffer.
pub const SLOTS: u32 = 8;

/// Bytes per output slot: room for the widest vector (4 x f64), aligned to it.
pub const SLOT_BYTES: u32 = 32;

// ---- entropy ------------------------------------------------------------------------------

/// The source of every random choice: a SplitMix64 stream from a seed, or a byte slice (a
/// fuzzer's input) that reads as zeros once it runs out.
#[derive(Clone, Debug)]
pub struct Entropy<'a> {
    source: Source<'a>,
}

#[derive(Clone, Debug)]
enum Source<'a> {
    Seed(u64),
    Bytes(&'a [u8]),
}

impl Entropy<'static> {
    pub fn from_seed(seed: u64) -> Entropy<'static> {
        Entropy { source: Source::Seed(seed) }
    }
}

impl<'a> Entropy<'a> {
    pub fn from_bytes(bytes: &'a [u8]) -> Entropy<'a> {
        Entropy { source: Source::Bytes(bytes) }
    }

    /// SplitMix64's output function over the next state.
    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// The next `n` (at most 8) bytes as a little-endian number.
    fn take(&mut self, n: usize) -> u64 {
        match &mut self.source {
            Source::Seed(state) => {
                let v = Self::splitmix(state);
                if n >= 8 {
                    v
                } else {
                    v & ((1u64 << (8 * n)) - 1)
                }
            }
            Source::Bytes(rest) => {
                let k = n.min(rest.len());
                let v = rest[..k].iter().rev().fold(0u64, |acc, &b| (acc << 8) | b as u64);
                *rest = &rest[k..];
                v
            }
        }
    }

    /// 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.take(8)
    }

    /// A number in `0..n` (0 when `n` is 0 or 1); reads only as many bytes as `n` needs.
    pub fn below(&mut self, n: u64) -> u64 {
        if n <= 1 {
            return 0;
        }
        let bytes = (64 - (n - 1).leading_zeros()).div_ceil(8) as usize;
        self.take(bytes) % n
    }

    /// True with probability `percent`/100; false on zero bytes.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) >= 100 - percent.min(100)
    }

    /// One of `items` (the first on zero bytes); the generator's lists are never empty.
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

// ---- configuration and results ------------------------------------------------------------

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// The kernel's name, `[A-Za-z_][A-Za-z0-9_]*` as the verifier requires (also the prefix
    /// of its shared arrays' names, so that kernels with distinct names can share one PTX
    /// module).
    pub name: String,
    /// Roughly the most instructions, each counted once per iteration of the loops around it;
    /// kernels are usually smaller.
    pub max_insts: u32,
    /// The deepest nesting of `if` and `for`.
    pub max_depth: u32,
    /// The most threads per block; block sizes are multiples of 32 up to this (at least 32,
    /// at most 1024).
    pub max_block_threads: u32,
    /// The most blocks in the grid (at least 1).
    pub max_blocks: u32,
    /// Static and dynamic shared memory with barriers.
    pub shared: bool,
    /// Warp shuffles and votes.
    pub warp: bool,
    /// Integer atomics.
    pub atomics: bool,
    /// What fast kernels are made of, in warp-uniform control flow: `mma.m16n8k16` (f16 and
    /// bf16), `ldmatrix` (x1/x2/x4, `.trans`) from shared memory, and `cp.async` into shared
    /// memory with commit and wait groups (sm_80 and later).
    pub tensor_core: bool,
    /// The approximate float functions (`rsqrt`, `ex2`, `lg2`, `tanh`, `sin`, `cos`).
    pub approx: bool,
    /// Leave out the conversions to bf16 that PTX has only from sm_90 on (rounding `rm`/`rp`,
    /// and sources `f64` or 32/64-bit integers), so that the kernel lowers for sm_80.
    pub sm80_conversions: bool,
}

impl Default for GenConfig {
    fn default() -> GenConfig {
        GenConfig {
            name: "gen".into(),
            max_insts: 160,
            max_depth: 3,
            max_block_threads: 128,
            max_blocks: 4,
            shared: true,
            warp: true,
            atomics: true,
            tensor_core: true,
            approx: true,
            sm80_conversions: false,
        }
    }
}

/// One kernel argument: a global buffer's initial contents (`elem` is the parameter's
/// element type), or a scalar.
#[derive(Clone, Debug, PartialEq)]
pub enum ArgSpec {
    Buffer { elem: ScalarType, bytes: Vec<u8> },
    Scalar(Constant),
}

/// A generated kernel and how to run it.
#[derive(Clone, Debug)]
pub struct GeneratedKernel {
    pub kernel: Kernel,
    pub launch: LaunchConfig,
    /// One per kernel parameter, in order.
    pub inputs: Vec<ArgSpec>,
    /// Whether the kernel uses an approximate float function (other engines compare its
    /// outputs within the PTX ISA's error bounds; the interpreter itself is exact and
    /// deterministic, so passes must keep its results bit for bit).
    pub uses_approx: bool,
}

impl GeneratedKernel {
    /// How many buffer arguments the kernel takes (the length of [`run_generated`]'s result).
    pub fn buffer_count(&self) -> usize {
        self.inputs.iter().filter(|a| matches!(a, ArgSpec::Buffer { .. })).count()
    }
}

/// Run `kernel` (the generated one, or a transformed copy with the same parameters) on the
/// generated inputs with [`interp::run`]; returns the final contents of every buffer argument,
/// in parameter order.
pub fn run_generated(g: &GeneratedKernel, kernel: &Kernel) -> Result<Vec<Vec<u8>>, InterpError> {
    run_generated_on(g, kernel, None)
}

/// [`run_generated`] on `threads` interpreter threads (`None`: as `RUDA_INTERP_THREADS` says),
/// so that tests can vary how blocks are scheduled.
pub fn run_generated_on(
    g: &GeneratedKernel,
    kernel: &Kernel,
    threads: Option<usize>,
) -> Result<Vec<Vec<u8>>, InterpError> {
    let mut buffers: Vec<Vec<u8>> = g
        .inputs
        .iter()
        .filter_map(|a| match a {
            ArgSpec::Buffer { bytes, .. } => Some(bytes.clone()),
            ArgSpec::Scalar(_) => None,
        })
        .collect();
    {
        let mut bufs = buffers.iter_mut();
        let mut args: Vec<KernelArg<'_>> = g
            .inputs
            .iter()
            .filter_map(|a| match a {
                ArgSpec::Buffer { .. } => bufs.next().map(|b| KernelArg::Buffer(b.as_mut_slice())),
                ArgSpec::Scalar(c) => Some(KernelArg::Scalar(*c)),
            })
            .collect();
        match threads {
            Some(t) => interp::run_with_threads(kernel, &g.launch, &mut args, t)?,
            None => interp::run(kernel, &g.launch, &mut args)?,
        }
    }
    Ok(buffers)
}

/// The kernel as a `test optimize` file test (format: `ir/filetests/README.md`) for the
/// pipeline `passes` (`default`, or pass names separated by commas): its launch, its
/// arguments, and `; expect` lines with the buffers the kernel *as given* leaves (so record it
/// before optimizing), the kernel text, and `comment` as `;;` lines. It has no `; expected:`
/// section: `RUDA_BLESS=1` writes one once the pipeline does the right thing.
pub fn filetest(g: &GeneratedKernel, passes: &str, comment: &str) -> Result<String, InterpError> {
    let outputs = run_generated(g, &g.kernel)?;
    let mut text = format!("; test optimize\n; passes: {passes}\n");
    let dims = |d: [u32; 3]| format!("{},{},{}", d[0], d[1], d[2]);
    text.push_str(&format!("; launch grid={} block={}", dims(g.launch.grid), dims(g.launch.block)));
    if g.launch.dynamic_shared_bytes > 0 {
        text.push_str(&format!(" shared={}", g.launch.dynamic_shared_bytes));
    }
    text.push('\n');
    let buffer = |elem: ScalarType, bytes: &[u8]| {
        let size = elem.bytes() as usize;
        let elems: Vec<String> = bytes
            .chunks(size)
            .map(|c| {
                let mut word = [0u8; 8];
                word[..size].copy_from_slice(c);
                format!("{:#x}", u64::from_le_bytes(word))
            })
            .collect();
        // The format fills a buffer from a single element.
        match elems.iter().all(|e| *e == elems[0]) {
            true if !elems.is_empty() => format!("{elem}[{}] {}", elems.len(), elems[0]),
            _ => format!("{elem}[{}] {}", elems.len(), elems.join(" ")),
        }
    };
    let mut expects = String::new();
    let mut outs = outputs.iter();
    for (param, arg) in g.kernel.params.iter().zip(&g.inputs) {
        match arg {
            ArgSpec::Buffer { elem, bytes } => {
                text.push_str(&format!("; arg {} = {}\n", param.value, buffer(*elem, bytes)));
                if let Some(out) = outs.next().filter(|out| *out != bytes) {
                    expects.push_str(&format!("; expect {} = {}\n", param.value, buffer(*elem, out)));
                }
            }
            ArgSpec::Scalar(c) => text.push_str(&format!("; arg {} = {} {:#x}\n", param.value, c.ty, c.bits)),
        }
    }
    text.push_str(&expects);
    for line in comment.lines() {
        text.push_str(&format!(";; {line}\n"));
    }
    text.push_str(&crate::print::print_kernel(&g.kernel));
    Ok(text)
}

/// Generate one kernel. It is meant to verify and to run without interpreter errors under
/// [`run_generated`]; this crate's tests check both over thousands of seeds, and a kernel that
/// does not is a bug in this generator.
pub fn generate(e: &mut Entropy<'_>, cfg: &GenConfig) -> GeneratedKernel {
    let launch = launch_shape(e, cfg);
    let threads: u32 = launch.block.iter().product();
    let mut b = KernelBuilder::new(cfg.name.clone());
    let mut inputs = vec![];
    let mut g = Gen {
        e,
        cfg,
        scopes: vec![vec![]],
        levels: vec![],
        budget: cfg.max_insts,
        dyn_budget: cfg.max_insts.saturating_mul(4),
        weight: 1,
        cf: Level::Block,
        depth: 0,
        buffers: vec![],
        out: Value(0),
        acc: None,
        shared: vec![],
        counters: None,
        ltid: Value(0),
        trip: Value(0),
        uses_approx: false,
    };

    // Parameters: input buffers, the output buffer, the atomics buffer, scalars.
    for i in 0..g.e.range(1, 3) {
        let elem = g.e.pick(&DATA);
        let len = 1u32 << g.e.range(2, 7);
        let v = b.param(format!("in{i}"), Type::Ptr(AddrSpace::Global, elem));
        let seed = g.e.next_u64();
        inputs.push(ArgSpec::Buffer { elem, bytes: random_bytes(seed, elem, len) });
        g.buffers.push(Buf { ptr: v, elem, len });
    }
    let out_elems = launch.grid.iter().product::<u32>() * threads * SLOTS * SLOT_BYTES / 8;
    // One value repeated: what a thread reads from a slot it has not written yet, and short
    // to write down in a file test.
    let out = b.param("out", Type::Ptr(AddrSpace::Global, U64));
    let fill = const_bits(g.e, U64).to_le_bytes();
    inputs.push(ArgSpec::Buffer { elem: U64, bytes: fill.repeat(out_elems as usize) });
    if cfg.atomics {
        let acc = b.param("acc", Type::Ptr(AddrSpace::Global, U64));
        let seed = g.e.next_u64();
        inputs.push(ArgSpec::Buffer { elem: U64, bytes: random_bytes(seed, U64, ACC_LEN) });
        g.acc = Some(acc);
    }
    g.trip = b.param("trip", Type::U32);
    inputs.push(ArgSpec::Scalar(Constant::u32(g.e.below(6) as u32)));
    g.define(g.trip, Level::Block);
    for i in 0..g.e.below(4) {
        let t = g.e.pick(&DATA);
        let v = b.param(format!("s{i}"), t);
        inputs.push(ArgSpec::Scalar(Constant::new(t, const_bits(g.e, t))));
        g.define(v, Level::Block);
    }

    // Shared memory: arrays with four elements per thread (room for a v4 store each), a
    // dynamic window of the same shape, and the counters atomics update.
    let mut launch = launch;
    // At most `SHARED_LIMIT` bytes in all, so that a GPU launches the kernel without opting in
    // to more (and ptxas accepts its static arrays).
    if cfg.shared {
        let len = threads.next_power_of_two() * 4;
        let mut left = SHARED_LIMIT;
        if cfg.atomics && g.e.chance(50) {
            let id = b.shared_array(format!("{}_counters", cfg.name), U64, COUNTERS);
            g.counters = Some(SharedBuf { array: Some(id), elem: U64, len: COUNTERS });
            left -= COUNTERS * 8;
        }
        for i in 0..g.e.below(3) {
            let elem = g.e.pick(&DATA);
            if len * elem.bytes() <= left {
                left -= len * elem.bytes();
                let id = b.shared_array(format!("{}_s{i}", cfg.name), elem, len);
                g.shared.push(SharedBuf { array: Some(id), elem, len });
            }
        }
        if g.e.chance(30) {
            let elem = g.e.pick(&DATA);
            // Static arrays are 16-byte aligned, so the dynamic window starts right after them.
            if len * elem.bytes() <= left {
                launch.dynamic_shared_bytes = len * elem.bytes();
                g.shared.push(SharedBuf { array: None, elem, len });
            }
        }
    }
    if g.e.chance(20) {
        let max = (threads + 32 * g.e.below(4) as u32).min(1024);
        // No more blocks per SM than its 2048 threads can hold.
        let min_blocks = g.e.chance(50).then(|| g.e.range(1, (2048 / max).clamp(1, 4) as u64) as u32);
        b.launch_bounds(max, min_blocks);
    }

    // Thread and block ids, linearised, and the thread's first output slot.
    let special = |b: &mut KernelBuilder, r| b.special(r);
    let (tx, ty_, tz) =
        (special(&mut b, SpecialReg::TidX), special(&mut b, SpecialReg::TidY), special(&mut b, SpecialReg::TidZ));
    let (nx, ny) = (special(&mut b, SpecialReg::NtidX), special(&mut b, SpecialReg::NtidY));
    let nz = special(&mut b, SpecialReg::NtidZ);
    let t = b.fma(tz, ny, ty_);
    let ltid = b.fma(t, nx, tx);
    let (cx, cy, cz) =
        (special(&mut b, SpecialReg::CtaidX), special(&mut b, SpecialReg::CtaidY), special(&mut b, SpecialReg::CtaidZ));
    let (gx, gy) = (special(&mut b, SpecialReg::NctaidX), special(&mut b, SpecialReg::NctaidY));
    let c = b.fma(cz, gy, cy);
    let block = b.fma(c, gx, cx);
    let nxy = b.mul(nx, ny);
    let nthreads = b.mul(nxy, nz);
    let gid = b.fma(block, nthreads, ltid);
    let per_thread = b.const_u32(SLOTS * SLOT_BYTES / 8);
    let first = b.mul(gid, per_thread);
    g.out = b.ptr_add(out, first);
    g.ltid = ltid;

    // Shared memory starts zeroed in the interpreter, not on a GPU: zero it here (each thread
    // every block-size-th element from its own), so that every engine computes the same.
    let mut arrays: Vec<(Option<SharedId>, ScalarType, u32)> =
        g.shared.iter().map(|s| (s.array, s.elem, s.len)).collect();
    arrays.extend(g.counters.as_ref().map(|c| (c.array, c.elem, c.len)));
    for &(array, elem, len) in &arrays {
        let base = Gen::shared_base(&mut b, array, elem);
        let end = b.const_u32(len);
        b.for_each(ltid, end, nthreads, |b, i| {
            let p = b.ptr_add(base, i);
            let zero = b.constant(Constant::new(elem, 0));
            b.store(p, zero);
        });
    }
    if !arrays.is_empty() {
        b.barrier();
    }
    g.define(ltid, Level::Thread);
    g.define(block, Level::Block);
    g.define(gid, Level::Thread);

    g.region(&mut b, 1);

    // Store the latest values of the entry region, so that most of the computation shows.
    let top: Vec<Value> = g.scopes[0].iter().rev().take(SLOTS as usize).copied().collect();
    for (slot, v) in top.into_iter().enumerate() {
        g.store_to_slot(&mut b, v, slot as u32);
    }
    let uses_approx = g.uses_approx;
    GeneratedKernel { kernel: b.finish_unverified(), launch, inputs, uses_approx }
}

// ---- the generator --------------------------------------------------------------------------

/// The atomics: order-independent integer operations, each on words of its own.
const ATOMIC_KINDS: [(ScalarType, AtomicOp); 11] = [
    (U32, AtomicOp::Add),
    (I32, AtomicOp::Add),
    (U64, AtomicOp::Add),
    (U32, AtomicOp::Min),
    (I32, AtomicOp::Min),
    (U64, AtomicOp::Min),
    (I64, AtomicOp::Min),
    (U32, AtomicOp::Max),
    (I32, AtomicOp::Max),
    (U64, AtomicOp::Max),
    (I64, AtomicOp::Max),
];
/// The most shared memory a kernel uses, static and dynamic: what a GPU gives a block without
/// opting in to more.
const SHARED_LIMIT: u32 = 48 * 1024;

/// Elements of the atomics buffer and of the shared counter array (`u64`): 16 bytes for each
/// kind of atomic, rounded up to a power of two (loads from the counters index with a mask).
const ACC_LEN: u32 = (2 * ATOMIC_KINDS.len() as u32).next_power_of_two();
const COUNTERS: u32 = ACC_LEN;

const ARITH: [ScalarType; 8] = [I16, U16, I32, U32, I64, U64, F32, F64];
const DATA: [ScalarType; 12] = [I8, I16, I32, I64, U8, U16, U32, U64, F16, BF16, F32, F64];
const INT32_64: [ScalarType; 4] = [I32, U32, I64, U64];

/// How far a value (or control flow) is the same across threads. The order matters:
/// `Block` < `Warp` < `Thread`, and combining takes the maximum. `Block` implies the
/// verifier's `uniformity`, which barriers need; `Warp` is what shuffles and votes need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Level {
    Block,
    Warp,
    Thread,
}

/// A global input buffer.
struct Buf {
    ptr: Value,
    elem: ScalarType,
    len: u32,
}

/// A shared array (`array: None` is the dynamic window).
struct SharedBuf {
    array: Option<SharedId>,
    elem: ScalarType,
    len: u32,
}

#[derive(Clone, Copy)]
enum Action {
    End,
    Arith,
    Cmp,
    Select,
    Cvt,
    Bitcast,
    Const,
    Special,
    Load,
    LoadOwn,
    Store,
    Vector,
    If,
    For,
    Exchange,
    Warp,
    Atomic,
    OwnAtomic,
    Mma,
}

struct Gen<'g, 'a> {
    e: &'g mut Entropy<'a>,
    cfg: &'g GenConfig,
    /// Values usable at the current point, one list per enclosing region, innermost last.
    scopes: Vec<Vec<Value>>,
    /// The level of each value, by index.
    levels: Vec<Level>,
    /// Instructions left to emit (static count), and weighted by enclosing loop trips.
    budget: u32,
    dyn_budget: u32,
    /// The product of the trip-count bounds of the enclosing loops.
    weight: u32,
    /// How uniform the current control flow is.
    cf: Level,
    depth: u32,
    buffers: Vec<Buf>,
    /// The thread's first output slot (`ptr<global,u64>`).
    out: Value,
    acc: Option<Value>,
    shared: Vec<SharedBuf>,
    counters: Option<SharedBuf>,
    /// The linear thread id within the block.
    ltid: Value,
    trip: Value,
    uses_approx: bool,
}

impl Gen<'_, '_> {
    fn define(&mut self, v: Value, level: Level) {
        if self.levels.len() <= v.index() {
            self.levels.resize(v.index() + 1, Level::Thread);
        }
        self.levels[v.index()] = level;
        self.scopes.last_mut().expect("a scope is open").push(v);
    }

    /// The level of a recorded value (`Thread`, the safe answer, for any other).
    fn level(&self, v: Value) -> Level {
        self.levels.get(v.index()).copied().unwrap_or(Level::Thread)
    }

    fn levels_of(&self, vs: &[Value]) -> Level {
        vs.iter().map(|v| self.level(*v)).max().unwrap_or(Level::Block)
    }

    /// Charge `n` instructions, weighted by the loops around them for the dynamic budget.
    fn charge(&mut self, n: u32) {
        self.budget = self.budget.saturating_sub(n);
        self.dyn_budget = self.dyn_budget.saturating_sub(n.saturating_mul(self.weight));
    }

    /// Values of type `ty` usable here and at most `max` varying, most recent last.
    fn candidates(&self, b: &KernelBuilder, ty: Type, max: Level) -> Vec<Value> {
        self.scopes.iter().flatten().copied().filter(|v| b.ty(*v) == ty && self.level(*v) <= max).collect()
    }

    /// A value of type `ty`: a recent one, an older one, or a new constant or conversion.
    fn operand(&mut self, b: &mut KernelBuilder, ty: Type) -> Value {
        self.operand_at_most(b, ty, Level::Thread)
    }

    fn operand_at_most(&mut self, b: &mut KernelBuilder, ty: Type, max: Level) -> Value {
        let c = self.candidates(b, ty, max);
        if c.is_empty() || self.e.chance(12) {
            return self.fresh(b, ty, max);
        }
        let recent = c.len().min(6) as u64;
        if self.e.chance(70) {
            c[c.len() - 1 - self.e.below(recent) as usize]
        } else {
            self.e.pick(&c)
        }
    }

    /// A new value of type `ty`: a constant, a conversion of a value of another type, a
    /// comparison (predicates) or a vector of scalars.
    fn fresh(&mut self, b: &mut KernelBuilder, ty: Type, max: Level) -> Value {
        match ty {
            Type::Scalar(Pred) if self.e.chance(60) => {
                let t = self.e.pick(&ARITH);
                let x = self.operand_at_most(b, Type::Scalar(t), max);
                let y = self.operand_at_most(b, Type::Scalar(t), max);
                let op = self.e.pick(&[CmpOp::Lt, CmpOp::Eq, CmpOp::Ne, CmpOp::Ge]);
                let v = b.cmp(op, x, y);
                self.define(v, self.levels_of(&[x, y]));
                v
            }
            Type::Scalar(t) => {
                let sources: Vec<Value> = self
                    .scopes
                    .iter()
                    .flatten()
                    .copied()
                    .filter(|v| {
                        matches!(b.ty(*v), Type::Scalar(s) if s != Pred && s != t && self.cvt_allowed(s, t))
                            && self.level(*v) <= max
                    })
                    .collect();
                if t != Pred && !sources.is_empty() && self.e.chance(50) {
                    let src = self.e.pick(&sources);
                    let cvt = self.random_cvt(b.ty(src).elem(), Some(t));
                    let v = b.cvt_with(src, cvt);
                    self.define(v, self.level(src));
                    v
                } else {
                    let v = b.constant(Constant::new(t, const_bits(self.e, t)));
                    self.define(v, Level::Block);
                    v
                }
            }
            Type::Vector(t, n) => {
                let elems: Vec<Value> = (0..n).map(|_| self.operand_at_most(b, Type::Scalar(t), max)).collect();
                let v = b.make_vector(&elems);
                self.define(v, self.levels_of(&elems));
                v
            }
            Type::Ptr(..) => unreachable!("pointers are never operands chosen from the pool"),
        }
    }

    fn random_type(&mut self) -> Type {
        match self.e.below(10) {
            0 => Type::PRED,
            1 => Type::Vector(self.e.pick(&DATA), self.e.pick(&[2, 4])),
            2 | 3 => Type::Scalar(self.e.pick(&DATA)),
            _ => Type::Scalar(self.e.pick(&ARITH)),
        }
    }

    /// A conversion from `from` (to `to`, or a random type), with a random rounding where one
    /// is needed or allowed, and random saturation on integer destinations.
    fn random_cvt(&mut self, from: ScalarType, to: Option<ScalarType>) -> Cvt {
        // Now and then the same type: for floats, rounding to an integral value.
        let to = to.unwrap_or_else(|| if self.e.chance(10) { from } else { self.e.pick(&DATA) });
        let sm80_limited = self.cfg.sm80_conversions && to == BF16 && from != BF16;
        let rounding = if crate::verify::cvt_needs_rounding(from, to) {
            if sm80_limited {
                Some(self.e.pick(&[Rounding::Rn, Rounding::Rz]))
            } else {
                Some(self.e.pick(Rounding::ALL))
            }
        } else if from.is_float() && from == to && self.e.chance(50) {
            Some(self.e.pick(Rounding::ALL))
        } else {
            None
        };
        let sat = to.is_int() && self.e.chance(50);
        Cvt { to, rounding, sat }
    }

    /// Whether the configuration allows a conversion `from -> to` (with some rounding): not
    /// when it is for sm_80 and only sm_90 can convert from `from` to bf16.
    fn cvt_allowed(&self, from: ScalarType, to: ScalarType) -> bool {
        let sm90_only = to == BF16 && (from == F64 || (from.is_int() && from.bits() >= 32));
        !(self.cfg.sm80_conversions && sm90_only)
    }

    fn region(&mut self, b: &mut KernelBuilder, end_weight: u64) {
        while self.budget > 0 && self.dyn_budget > 0 {
            let action = self.action(end_weight);
            let cost = match action {
                Action::End => return,
                Action::Arith => self.arith(b),
                Action::Cmp => self.compare(b),
                Action::Select => self.select(b),
                Action::Cvt => self.convert(b),
                Action::Bitcast => self.bitcast(b),
                Action::Const => {
                    let t = self.random_type().elem();
                    let v = b.constant(Constant::new(t, const_bits(self.e, t)));
                    self.define(v, Level::Block);
                    1
                }
                Action::Special => {
                    let r = self.e.pick(&SpecialReg::ALL);
                    let v = b.special(r);
                    self.define(v, if r.is_block_uniform() { Level::Block } else { Level::Thread });
                    1
                }
                Action::Load => self.load_input(b),
                Action::LoadOwn => self.load_own(b),
                Action::Store => {
                    // Never empty: the thread ids are defined before the first region.
                    let all: Vec<Value> = self.scopes.iter().flatten().copied().collect();
                    let v = self.e.pick(&all);
                    let slot = self.e.below(SLOTS as u64) as u32;
                    self.store_to_slot(b, v, slot);
                    4
                }
                Action::Vector => self.vector(b),
                Action::If => self.gen_if(b),
                Action::For => self.gen_for(b),
                Action::Exchange => self.exchange(b),
                Action::Warp => self.warp(b),
                Action::Atomic => self.atomic(b),
                Action::OwnAtomic => self.own_atomic(b),
                Action::Mma => self.mma(b),
            };
            self.charge(cost);
        }
    }

    fn action(&mut self, end_weight: u64) -> Action {
        let nest = self.depth < self.cfg.max_depth;
        let table: [(u64, Action); 19] = [
            (end_weight, Action::End),
            (30, Action::Arith),
            (8, Action::Cmp),
            (6, Action::Select),
            (10, Action::Cvt),
            (4, Action::Bitcast),
            (3, Action::Const),
            (2, Action::Special),
            (9, Action::Load),
            (3, Action::LoadOwn),
            (7, Action::Store),
            (4, Action::Vector),
            (if nest { 5 } else { 0 }, Action::If),
            (if nest && self.dyn_budget >= 60 * self.weight { 4 } else { 0 }, Action::For),
            (if self.cf == Level::Block && !self.shared.is_empty() { 3 } else { 0 }, Action::Exchange),
            (if self.cfg.warp && self.cf <= Level::Warp { 4 } else { 0 }, Action::Warp),
            (if self.acc.is_some() { 2 } else { 0 }, Action::Atomic),
            (if self.cfg.atomics { 2 } else { 0 }, Action::OwnAtomic),
            (if self.cfg.tensor_core && self.cf <= Level::Warp { 2 } else { 0 }, Action::Mma),
        ];
        let total: u64 = table.iter().map(|(w, _)| w).sum();
        let mut x = self.e.below(total);
        for (w, a) in table {
            if x < w {
                return a;
            }
            x -= w;
        }
        Action::End
    }

    fn arith(&mut self, b: &mut KernelBuilder) -> u32 {
        let t = if self.e.chance(8) { Pred } else { self.e.pick(&ARITH) };
        let ty = Type::Scalar(t);
        let approx = self.cfg.approx;
        let unary: Vec<UnaryOp> =
            UnaryOp::ALL.iter().copied().filter(|op| unary_ok(*op, t) && (approx || !op.is_approx())).collect();
        let binary: Vec<BinaryOp> = BinaryOp::ALL.iter().copied().filter(|op| binary_ok(*op, t)).collect();
        let kind = self.e.below(8);
        let (v, ops) = if kind < 2 && !unary.is_empty() {
            let op = self.e.pick(&unary);
            self.uses_approx |= op.is_approx();
            let a = self.operand(b, ty);
            (b.unary(op, a), vec![a])
        } else if kind == 2 && t != Pred {
            let (x, y, z) = (self.operand(b, ty), self.operand(b, ty), self.operand(b, ty));
            (b.fma(x, y, z), vec![x, y, z])
        } else {
            let op = self.e.pick(&binary);
            let x = self.operand(b, ty);
            let y = match op {
                BinaryOp::Shl | BinaryOp::Shr => self.operand(b, Type::U32),
                BinaryOp::Div | BinaryOp::Rem if t.is_int() => {
                    // An odd divisor is never zero.
                    let d = self.operand(b, ty);
                    let one = b.constant(Constant::new(t, 1));
                    let odd = b.or(d, one);
                    self.define(odd, self.level(d));
                    odd
                }
                _ => self.operand(b, ty),
            };
            (b.binary(op, x, y), vec![x, y])
        };
        self.define(v, self.levels_of(&ops));
        1
    }

    fn compare(&mut self, b: &mut KernelBuilder) -> u32 {
        let t = if self.e.chance(8) { Pred } else { self.e.pick(&ARITH) };
        let ops: Vec<CmpOp> = CmpOp::ALL.iter().copied().filter(|op| cmp_ok(*op, t)).collect();
        let op = self.e.pick(&ops);
        let x = self.operand(b, Type::Scalar(t));
        let y = self.operand(b, Type::Scalar(t));
        let v = b.cmp(op, x, y);
        self.define(v, self.levels_of(&[x, y]));
        1
    }

    fn select(&mut self, b: &mut KernelBuilder) -> u32 {
        let ty = match self.random_type() {
            Type::Vector(e, _) => Type::Scalar(e),
            t => t,
        };
        let c = self.operand(b, Type::PRED);
        let x = self.operand(b, ty);
        let y = self.operand(b, ty);
        let v = b.select(c, x, y);
        self.define(v, self.levels_of(&[c, x, y]));
        1
    }

    fn scalars(&self, b: &KernelBuilder) -> Vec<Value> {
        self.scopes.iter().flatten().copied().filter(|v| matches!(b.ty(*v), Type::Scalar(s) if s != Pred)).collect()
    }

    fn convert(&mut self, b: &mut KernelBuilder) -> u32 {
        // Mostly a source of a uniformly chosen type, so that rare types get converted.
        let sources = self.scalars(b);
        let src = if sources.is_empty() || self.e.chance(75) {
            let t = self.e.pick(&DATA);
            self.operand(b, Type::Scalar(t))
        } else {
            self.e.pick(&sources)
        };
        let from = b.ty(src).elem();
        let mut cvt = self.random_cvt(from, None);
        if !self.cvt_allowed(from, cvt.to) {
            cvt = self.random_cvt(from, Some(F32));
        }
        let v = b.cvt_with(src, cvt);
        self.define(v, self.level(src));
        1
    }

    fn bitcast(&mut self, b: &mut KernelBuilder) -> u32 {
        let from = self.e.pick(&DATA);
        let src = self.operand(b, Type::Scalar(from));
        let bits = from.bits();
        let targets: Vec<ScalarType> = DATA.iter().copied().filter(|t| t.bits() == bits).collect();
        let to = self.e.pick(&targets);
        let v = b.bitcast(src, to);
        self.define(v, self.level(src));
        1
    }

    fn vector(&mut self, b: &mut KernelBuilder) -> u32 {
        let vectors: Vec<Value> =
            self.scopes.iter().flatten().copied().filter(|v| matches!(b.ty(*v), Type::Vector(..))).collect();
        if !vectors.is_empty() && self.e.chance(60) {
            let v = self.e.pick(&vectors);
            let lane = self.e.below(b.ty(v).lanes() as u64) as u8;
            let x = b.extract(v, lane);
            self.define(x, self.level(v));
        } else {
            let t = self.e.pick(&DATA);
            let n = self.e.pick(&[2u8, 4]);
            self.fresh(b, Type::Vector(t, n), Level::Thread);
        }
        1
    }

    /// An index in `0..len` aligned to `lanes` (both powers of two), of a 32- or 64-bit type:
    /// a constant, or a value masked.
    fn masked_index(&mut self, b: &mut KernelBuilder, len: u32, lanes: u32) -> Value {
        let mask = (len - 1) & !(lanes - 1);
        let t = self.e.pick(&INT32_64);
        if self.e.chance(20) {
            let c = self.e.below(len as u64) as u32 & mask;
            let v = b.constant(Constant::new(t, c as u64));
            self.define(v, Level::Block);
            return v;
        }
        let src_t = self.e.pick(&[I16, U16, I32, U32, I64, U64]);
        let mut x = self.operand(b, Type::Scalar(src_t));
        let level = self.level(x);
        if src_t != t {
            x = b.cvt_with(x, Cvt { to: t, rounding: None, sat: false });
        }
        let m = b.constant(Constant::new(t, mask as u64));
        let v = b.and(x, m);
        self.define(v, level);
        v
    }

    /// A pointer into the input buffers, the number of elements readable through it (a power
    /// of two) and its level: one buffer, maybe viewed as another element type, sometimes a
    /// `select` between two buffers (then the smaller count).
    fn input_view(&mut self, b: &mut KernelBuilder) -> (Value, u32, Level) {
        let i = self.e.below(self.buffers.len() as u64) as usize;
        let (ptr, elem, len) = (self.buffers[i].ptr, self.buffers[i].elem, self.buffers[i].len);
        let bytes = len * elem.bytes();
        let view = if self.e.chance(30) { self.e.pick(&DATA) } else { elem };
        let count = bytes / view.bytes();
        if count == 0 {
            return (ptr, len, Level::Block);
        }
        let p = if view == elem { ptr } else { b.ptr_cast(ptr, view) };
        if self.buffers.len() > 1 && self.e.chance(15) {
            let j = self.e.below(self.buffers.len() as u64) as usize;
            let other_bytes = self.buffers[j].len * self.buffers[j].elem.bytes();
            let other_count = other_bytes / view.bytes();
            if other_count > 0 {
                let q = b.ptr_cast(self.buffers[j].ptr, view);
                let c = self.operand(b, Type::PRED);
                let s = b.select(c, p, q);
                return (s, count.min(other_count), self.level(c));
            }
        }
        (p, count, Level::Block)
    }

    fn load_input(&mut self, b: &mut KernelBuilder) -> u32 {
        let (base, count, base_level) = self.input_view(b);
        let lanes = self.e.pick(&[1u32, 1, 1, 2, 4]).min(count);
        let (ptr, level) = match self.e.below(4) {
            // Two steps: a masked half, then another masked half.
            1 if count >= 2 * lanes => {
                let half = count / 2;
                let i = self.masked_index(b, half, lanes);
                let j = self.masked_index(b, half, lanes);
                let p = b.ptr_add(base, i);
                (b.ptr_add(p, j), self.levels_of(&[i, j]))
            }
            // A constant offset minus a masked value: a negative signed index.
            2 if count >= 2 * lanes => {
                let half = count / 2;
                let t = self.e.pick(&[I32, I64]);
                let k = b.constant(Constant::new(t, half as u64));
                let p = b.ptr_add(base, k);
                let i = self.masked_index(b, half, lanes);
                let level = self.level(i);
                let i = if b.ty(i) == Type::Scalar(t) {
                    i
                } else {
                    b.cvt_with(i, Cvt { to: t, rounding: None, sat: false })
                };
                let neg = b.neg(i);
                (b.ptr_add(p, neg), level)
            }
            _ => {
                let i = self.masked_index(b, count, lanes);
                (b.ptr_add(base, i), self.level(i))
            }
        };
        let v = if lanes == 1 { b.load(ptr) } else { b.load_vec(ptr, lanes as u8) };
        self.define(v, level.max(base_level));
        4
    }

    /// A pointer into the thread's slot `slot`, viewed as `elem`, for an access of `size`
    /// bytes at a random aligned offset within the slot.
    fn own_slot(&mut self, b: &mut KernelBuilder, slot: u32, elem: ScalarType, size: u32) -> Value {
        let within = self.e.below((SLOT_BYTES / size) as u64) as u32 * size;
        let p = b.ptr_cast(self.out, elem);
        let i = b.const_u32((slot * SLOT_BYTES + within) / elem.bytes());
        b.ptr_add(p, i)
    }

    fn load_own(&mut self, b: &mut KernelBuilder) -> u32 {
        let elem = self.e.pick(&DATA);
        let lanes = self.e.pick(&[1u32, 1, 2, 4]);
        let slot = self.e.below(SLOTS as u64) as u32;
        let p = self.own_slot(b, slot, elem, elem.bytes() * lanes);
        let v = if lanes == 1 { b.load(p) } else { b.load_vec(p, lanes as u8) };
        self.define(v, Level::Thread);
        4
    }

    /// Store `v` (a predicate as an integer) into the thread's slot `slot`.
    fn store_to_slot(&mut self, b: &mut KernelBuilder, v: Value, slot: u32) {
        let v = if b.ty(v) == Type::PRED {
            let t = self.e.pick(&[U8, U32, I16]);
            let one = b.constant(Constant::new(t, 1));
            let zero = b.constant(Constant::new(t, 0));
            b.select(v, one, zero)
        } else {
            v
        };
        let ty = b.ty(v);
        let p = self.own_slot(b, slot, ty.elem(), ty.bytes());
        b.store(p, v);
    }

    fn gen_if(&mut self, b: &mut KernelBuilder) -> u32 {
        let cond = self.operand(b, Type::PRED);
        let n = self.e.below(4);
        let tys: Vec<Type> = (0..n).map(|_| self.random_type()).collect();
        let cf = self.cf.max(self.level(cond));
        let level = Cell::new(self.level(cond));
        let this = RefCell::new(&mut *self);
        let branch = |b: &mut KernelBuilder| {
            let mut g = this.borrow_mut();
            let (ys, l) = g.branch(b, cf, &tys);
            level.set(level.get().max(l));
            ys
        };
        let results = b.if_else(cond, branch, branch);
        for r in results {
            self.define(r, level.get());
        }
        1
    }

    /// One region of an `if`: its code under `cf`, then values of `tys` to yield and the
    /// highest level among them.
    fn branch(&mut self, b: &mut KernelBuilder, cf: Level, tys: &[Type]) -> (Vec<Value>, Level) {
        let saved = self.cf;
        self.cf = cf;
        self.depth += 1;
        self.scopes.push(vec![]);
        self.region(b, 8);
        let ys: Vec<Value> = tys.iter().map(|t| self.operand(b, *t)).collect();
        let level = self.levels_of(&ys);
        self.scopes.pop();
        self.depth -= 1;
        self.cf = saved;
        (ys, level)
    }

    /// A loop of at most `MAX_TRIPS` iterations: start 0..=2; end a constant below
    /// `MAX_TRIPS`, the trip parameter or a value masked to 0..=3; step 1 or 2, or a value made
    /// 1 or 3. It carries up to three values of random types.
    fn gen_for(&mut self, b: &mut KernelBuilder) -> u32 {
        const MAX_TRIPS: u32 = 6;
        let t = self.e.pick(&INT32_64);
        let ty = Type::Scalar(t);
        let start = b.constant(Constant::new(t, self.e.below(3)));
        self.define(start, Level::Block);
        let end = match self.e.below(3) {
            0 => {
                let c = b.constant(Constant::new(t, self.e.below(MAX_TRIPS as u64)));
                self.define(c, Level::Block);
                c
            }
            // `trip` is at most 5.
            1 if t == U32 => self.trip,
            1 => {
                let v = b.cvt_with(self.trip, Cvt { to: t, rounding: None, sat: false });
                self.define(v, Level::Block);
                v
            }
            _ => {
                let x = self.operand(b, ty);
                let m = b.constant(Constant::new(t, 3));
                let v = b.and(x, m);
                self.define(v, self.level(x));
                v
            }
        };
        let step = if self.e.chance(25) {
            let x = self.operand(b, ty);
            let two = b.constant(Constant::new(t, 2));
            let one = b.constant(Constant::new(t, 1));
            let m = b.and(x, two);
            let v = b.or(m, one);
            self.define(v, self.level(x));
            v
        } else {
            let c = b.constant(Constant::new(t, self.e.range(1, 2)));
            self.define(c, Level::Block);
            c
        };
        let bounds = self.levels_of(&[start, end, step]);
        let n = self.e.below(4);
        let mut init = vec![];
        let mut caps = vec![];
        for _ in 0..n {
            let cty = self.random_type();
            let v = self.operand(b, cty);
            let cap = if self.e.chance(30) { Level::Thread } else { self.level(v).max(bounds) };
            init.push(v);
            caps.push(cap);
        }
        let iv_level = self.levels_of(&[start, step]);
        let cf = self.cf.max(bounds);
        let saved = (self.cf, self.weight);
        self.cf = cf;
        self.weight = self.weight.saturating_mul(MAX_TRIPS);
        self.depth += 1;
        let results = b.for_range(start, end, step, &init, |b, iv, carried| {
            self.scopes.push(vec![]);
            self.define(iv, iv_level);
            for (p, cap) in carried.iter().zip(&caps) {
                self.define(*p, *cap);
            }
            self.region(b, 8);
            let mut ys = vec![];
            for (p, cap) in carried.iter().zip(&caps) {
                let ty = b.ty(*p);
                ys.push(self.operand_at_most(b, ty, *cap));
            }
            self.scopes.pop();
            ys
        });
        self.depth -= 1;
        (self.cf, self.weight) = saved;
        // The verifier's analysis gives all results of a loop one uniformity.
        let level = caps.into_iter().fold(bounds, Level::max);
        for r in results {
            self.define(r, level);
        }
        4
    }

    /// A pointer to a static shared array, or (`None`) to the dynamic window as `elem`.
    fn shared_base(b: &mut KernelBuilder, array: Option<SharedId>, elem: ScalarType) -> Value {
        match array {
            Some(id) => b.shared_ptr(id),
            None => b.dyn_shared_ptr(elem),
        }
    }

    /// Stores into the thread's own shared slot (and counter atomics), a barrier, loads from
    /// anywhere in shared memory, a barrier.
    fn exchange(&mut self, b: &mut KernelBuilder) -> u32 {
        let i = self.e.below(self.shared.len() as u64) as usize;
        let (array, elem) = (self.shared[i].array, self.shared[i].elem);
        let base = Self::shared_base(b, array, elem);
        let four = b.const_u32(4);
        let own = b.mul(self.ltid, four);
        if !(self.cfg.tensor_core && self.e.chance(35) && self.cp_async(b, base, elem, own)) {
            for _ in 0..self.e.range(1, 2) {
                let lanes = self.e.pick(&[1u32, 2, 4]);
                let offset = self.e.below((4 / lanes) as u64) as u32 * lanes;
                let off = b.const_u32(offset);
                let idx = b.add(own, off);
                let p = b.ptr_add(base, idx);
                let ty = if lanes == 1 { Type::Scalar(elem) } else { Type::Vector(elem, lanes as u8) };
                let v = self.operand(b, ty);
                b.store(p, v);
            }
        }
        if let Some(c) = &self.counters {
            if self.e.chance(50) {
                let base = Self::shared_base(b, c.array, c.elem);
                self.counter_atomic(b, base);
            }
        }
        b.barrier();
        for _ in 0..self.e.range(1, 3) {
            let (array, elem, len) = match &self.counters {
                Some(c) if self.e.chance(20) => (c.array, c.elem, c.len),
                _ => {
                    let j = self.e.below(self.shared.len() as u64) as usize;
                    (self.shared[j].array, self.shared[j].elem, self.shared[j].len)
                }
            };
            let base = Self::shared_base(b, array, elem);
            let view = if self.e.chance(25) { self.e.pick(&DATA) } else { elem };
            let count = len * elem.bytes() / view.bytes();
            if self.cfg.tensor_core && self.e.chance(20) {
                // Each lane gives the address of a 16-byte aligned row of 8 elements.
                let view = self.e.pick(&[U16, F16, BF16, I16]);
                let count = len * elem.bytes() / 2;
                let base = b.ptr_cast(base, view);
                let i = self.masked_index(b, count, 8);
                let p = b.ptr_add(base, i);
                let v = b.ldmatrix(p, self.e.pick(&[1, 2, 4]), self.e.chance(50));
                self.define(v, Level::Thread);
                continue;
            }
            let base = if view == elem { base } else { b.ptr_cast(base, view) };
            let lanes = self.e.pick(&[1u32, 1, 2, 4]);
            if self.e.chance(30) {
                // A run of scalar loads of consecutive elements from one aligned pointer (what
                // `vectorize` merges).
                let run = lanes.max(2);
                let i = self.masked_index(b, count, run);
                let p = b.ptr_add(base, i);
                for c in 0..run {
                    let at = if c == 0 {
                        p
                    } else {
                        let c = b.constant(Constant::new(self.e.pick(&INT32_64), c as u64));
                        b.ptr_add(p, c)
                    };
                    let v = b.load(at);
                    self.define(v, self.level(i));
                }
            } else {
                let i = self.masked_index(b, count, lanes);
                let p = b.ptr_add(base, i);
                let v = if lanes == 1 { b.load(p) } else { b.load_vec(p, lanes as u8) };
                self.define(v, self.level(i));
            }
        }
        b.barrier();
        16
    }

    /// An integer `add`, `min` or `max` into `base` (`u64` elements, at least
    /// `2 * ATOMIC_KINDS.len()`), its old value unused (it depends on the order of threads).
    /// Each kind of atomic has its own 16 bytes: different kinds on one word, or 32- and 64-bit
    /// views of it, would not commute, and the result would depend on the order of threads.
    fn counter_atomic(&mut self, b: &mut KernelBuilder, base: Value) {
        let k = self.e.below(ATOMIC_KINDS.len() as u64) as u32;
        let (t, op) = ATOMIC_KINDS[k as usize];
        let per_kind = 16 / t.bytes();
        let p = b.ptr_cast(base, t);
        let first = b.const_u32(k * per_kind);
        let p = b.ptr_add(p, first);
        let i = self.masked_index(b, per_kind, 1);
        let p = b.ptr_add(p, i);
        let v = self.operand(b, Type::Scalar(t));
        b.atomic(op, p, v);
    }

    fn atomic(&mut self, b: &mut KernelBuilder) -> u32 {
        if let Some(acc) = self.acc {
            self.counter_atomic(b, acc);
        }
        4
    }

    /// `cp.async` from an input buffer into the thread's own shared slot (`own`, in elements
    /// of `elem`, four of them) instead of the storing phase's stores: one or two copies into
    /// disjoint parts of the slot, in one or two commit groups, all waited for before the
    /// exchange's barrier; with two groups, `wait_group 1` first and a read of the first
    /// copy's bytes between the waits. False (nothing emitted) where no copy size fits.
    fn cp_async(&mut self, b: &mut KernelBuilder, base: Value, elem: ScalarType, own: Value) -> bool {
        let i = self.e.below(self.buffers.len() as u64) as usize;
        let (src, src_bytes) = (self.buffers[i].ptr, self.buffers[i].len * self.buffers[i].elem.bytes());
        let slot_bytes = 4 * elem.bytes();
        let sizes: Vec<u32> = [4u32, 8, 16].into_iter().filter(|&s| s <= slot_bytes && s <= src_bytes).collect();
        if sizes.is_empty() {
            return false;
        }
        // Half the time a size that leaves room for a second copy (and a second group).
        let halves: Vec<u32> = sizes.iter().copied().filter(|&s| 2 * s <= slot_bytes).collect();
        let size = if !halves.is_empty() && self.e.chance(50) { self.e.pick(&halves) } else { self.e.pick(&sizes) };
        let copies = if 2 * size <= slot_bytes && self.e.chance(70) { 2 } else { 1 };
        let dst_bytes = b.ptr_cast(base, U8);
        let src_bytes_ptr = b.ptr_cast(src, U8);
        let elem_bytes = b.const_u32(elem.bytes());
        let own_byte = b.mul(own, elem_bytes);
        let groups = copies == 2 && self.e.chance(80);
        let mut first_dst = None;
        for c in 0..copies {
            let off = b.const_u32(c * size);
            let at = b.add(own_byte, off);
            let dst = b.ptr_add(dst_bytes, at);
            let j = self.masked_index(b, src_bytes, size);
            let from = b.ptr_add(src_bytes_ptr, j);
            if self.e.chance(25) {
                // Zero-fill: read only the first `n` bytes (a GEMM's predicated tile loads).
                let n = if self.e.chance(50) {
                    let c = b.const_u32(self.e.below(size as u64 + 1) as u32);
                    self.define(c, Level::Block);
                    c
                } else {
                    let x = self.operand(b, Type::U32);
                    let mask = b.const_u32(size - 1);
                    let n = b.and(x, mask);
                    self.define(n, self.level(x));
                    n
                };
                b.cp_async_zfill(dst, from, size as u8, n);
            } else {
                b.cp_async(dst, from, size as u8);
            }
            if c == 0 && groups {
                b.cp_async_commit();
                first_dst = Some(dst);
            }
        }
        b.cp_async_commit();
        if let Some(dst) = first_dst.filter(|_| self.e.chance(70)) {
            // The first group has landed; the second may still be in flight.
            b.cp_async_wait(1);
            let t = self.e.pick(&[U32, I32, F32]);
            let p = b.ptr_cast(dst, t);
            let v = b.load(p);
            self.define(v, Level::Thread);
        }
        b.cp_async_wait(0);
        true
    }

    /// An atomic on the thread's own output slot: no other thread touches it, so the old
    /// value it returns is deterministic, and it is used.
    fn own_atomic(&mut self, b: &mut KernelBuilder) -> u32 {
        let t = self.e.pick(&[U32, I32, U64, I64, F32, F64]);
        let mut ops = vec![AtomicOp::Exch, AtomicOp::Cas];
        if t.is_int() {
            ops.push(AtomicOp::Min);
            ops.push(AtomicOp::Max);
            if t != I64 {
                ops.push(AtomicOp::Add);
            }
        }
        let op = self.e.pick(&ops);
        let slot = self.e.below(SLOTS as u64) as u32;
        let p = self.own_slot(b, slot, t, t.bytes());
        let v = self.operand(b, Type::Scalar(t));
        // Half the time read the word before (a `cas` then compares with it, so that the swap
        // happens) and half the time after: a pass that moves a load across the atomic shows.
        let before = self.e.chance(50).then(|| b.load(p));
        if let Some(cur) = before {
            self.define(cur, Level::Thread);
        }
        let old = if op == AtomicOp::Cas {
            let compare = match before {
                Some(cur) if self.e.chance(70) => cur,
                _ => self.operand(b, Type::Scalar(t)),
            };
            b.atomic_cas(p, compare, v)
        } else {
            b.atomic(op, p, v)
        };
        self.define(old, Level::Thread);
        if self.e.chance(50) {
            let now = b.load(p);
            self.define(now, Level::Thread);
        }
        6
    }

    /// `mma.m16n8k16` on fragments from the pool (`ldmatrix` results among them).
    fn mma(&mut self, b: &mut KernelBuilder) -> u32 {
        let ty = self.e.pick(&[MmaType::F16, MmaType::BF16]);
        let a = self.operand(b, Type::Vector(U32, 4));
        let bf = self.operand(b, Type::Vector(U32, 2));
        let c = self.operand(b, Type::Vector(F32, 4));
        let d = b.mma_m16n8k16(ty, a, bf, c);
        self.define(d, Level::Thread);
        1
    }

    fn warp(&mut self, b: &mut KernelBuilder) -> u32 {
        if self.e.chance(30) {
            let mode = self.e.pick(VoteMode::ALL);
            let p = self.operand(b, Type::PRED);
            let v = b.vote(mode, p);
            self.define(v, Level::Warp);
        } else {
            let t = self.e.pick(&[U32, I32, F32]);
            let mode = self.e.pick(ShflMode::ALL);
            let x = self.operand(b, Type::Scalar(t));
            // Lane operands count modulo 32: constants up to 39 test that too.
            let lane = if self.e.chance(50) {
                let c = b.const_u32(self.e.below(40) as u32);
                self.define(c, Level::Block);
                c
            } else {
                self.operand(b, Type::U32)
            };
            let broadcast = mode == ShflMode::Idx && self.level(lane) <= Level::Warp;
            let level = if broadcast || self.level(x) <= Level::Warp { Level::Warp } else { Level::Thread };
            let v = b.shfl(mode, x, lane);
            self.define(v, level);
        }
        1
    }
}

/// The launch: 32 to `max_block_threads` threads (a multiple of 32) shaped in up to three
/// dimensions, 1 to `max_blocks` blocks in one or two.
fn launch_shape(e: &mut Entropy<'_>, cfg: &GenConfig) -> LaunchConfig {
    let warps = e.range(1, (cfg.max_block_threads.min(1024) / 32).max(1) as u64) as u32;
    let threads = warps * 32;
    let (by, bz) = e.pick(&[(1, 1), (1, 1), (2, 1), (4, 1), (2, 2)]);
    let block = [threads / (by * bz), by, bz];
    let blocks = e.range(1, cfg.max_blocks.max(1) as u64) as u32;
    let grid = if blocks.is_multiple_of(2) && e.chance(30) { [blocks / 2, 2, 1] } else { [blocks, 1, 1] };
    LaunchConfig { grid, block, dynamic_shared_bytes: 0 }
}

/// `len` elements of `elem`, each an interesting value or random bits.
fn random_bytes(seed: u64, elem: ScalarType, len: u32) -> Vec<u8> {
    let mut e = Entropy::from_seed(seed);
    let size = elem.bytes() as usize;
    let mut out = Vec::with_capacity(len as usize * size);
    for _ in 0..len {
        out.extend_from_slice(&const_bits(&mut e, elem).to_le_bytes()[..size]);
    }
    out
}

/// The bits of a constant of type `t`: zero first, then edge cases, then random bits.
fn const_bits(e: &mut Entropy<'_>, t: ScalarType) -> u64 {
    let mask = if t.bits() >= 64 { u64::MAX } else { (1u64 << t.bits()) - 1 };
    let random = e.next_u64();
    let bits = match t {
        Pred => random & 1,
        _ if t.is_int() => {
            let sign = 1u64 << (t.bits() - 1);
            e.pick(&[
                0,
                1,
                2,
                3,
                7,
                8,
                16,
                31,
                32,
                33,
                63,
                64,
                255,
                0x7fff,
                sign,
                sign - 1,
                mask,
                mask - 1,
                random,
                random & 0xff,
            ])
        }
        F32 => e.pick(&[
            0f32.to_bits() as u64,
            (-0f32).to_bits() as u64,
            1f32.to_bits() as u64,
            (-1f32).to_bits() as u64,
            0.5f32.to_bits() as u64,
            3f32.to_bits() as u64,
            (-2.5f32).to_bits() as u64,
            1e30f32.to_bits() as u64,
            f32::INFINITY.to_bits() as u64,
            f32::NEG_INFINITY.to_bits() as u64,
            0x7fc0_0000,
            0x7f80_0001,
            0xffc0_0001,
            1,
            0x007f_ffff,
            f32::MAX.to_bits() as u64,
            f32::MIN_POSITIVE.to_bits() as u64,
            2147483648f32.to_bits() as u64,
            ((random & 0xffff) as f32 - 32768.0).to_bits() as u64,
            random,
            random,
        ]),
        F64 => e.pick(&[
            0f64.to_bits(),
            (-0f64).to_bits(),
            1f64.to_bits(),
            (-1f64).to_bits(),
            0.5f64.to_bits(),
            3f64.to_bits(),
            (-2.5f64).to_bits(),
            1e300f64.to_bits(),
            f64::INFINITY.to_bits(),
            f64::NEG_INFINITY.to_bits(),
            0x7ff8_0000_0000_0000,
            0x7ff0_0000_0000_0001,
            1,
            f64::MAX.to_bits(),
            f64::MIN_POSITIVE.to_bits(),
            2f64.powi(63).to_bits(),
            65504.0f64.to_bits(),
            ((random & 0xffff) as f64 - 32768.0).to_bits(),
            random,
            random,
        ]),
        F16 => {
            e.pick(&[0, 0x8000, 0x3c00, 0xbc00, 0x3800, 0x7c00, 0xfc00, 0x7e00, 0x7c01, 0x0001, 0x03ff, 0x7bff, random])
        }
        BF16 => e.pick(&[0, 0x8000, 0x3f80, 0xbf80, 0x3f00, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0x0001, 0x7f7f, random]),
        _ => random,
    };
    bits & mask
}

// The operations the verifier accepts per type (see `verify.rs`); the generator's tests check
// that every accepted combination is generated.

fn arith_int(t: ScalarType) -> bool {
    t.is_int() && t.bits() >= 16
}

fn unary_ok(op: UnaryOp, t: ScalarType) -> bool {
    match op {
        UnaryOp::Neg | UnaryOp::Abs => t.is_signed_int() && arith_int(t) || t.is_arith_float(),
        UnaryOp::Not => arith_int(t) || t == Pred,
        UnaryOp::Popc | UnaryOp::Clz => t.is_int() && t.bits() >= 32,
        UnaryOp::Sqrt | UnaryOp::Rcp => t.is_arith_float(),
        _ => t == F32,
    }
}

fn binary_ok(op: BinaryOp, t: ScalarType) -> bool {
    let arith = arith_int(t) || t.is_arith_float();
    match op {
        BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Min | BinaryOp::Max => arith,
        BinaryOp::MulHi | BinaryOp::Rem | BinaryOp::Shl | BinaryOp::Shr => arith_int(t),
        BinaryOp::And | BinaryOp::Or | BinaryOp::Xor => arith_int(t) || t == Pred,
    }
}

fn cmp_ok(op: CmpOp, t: ScalarType) -> bool {
    let arith = arith_int(t) || t.is_arith_float();
    match op {
        CmpOp::Eq | CmpOp::Ne => arith || t == Pred,
        CmpOp::Lt | CmpOp::Le | CmpOp::Gt | CmpOp::Ge => arith,
        CmpOp::Neu | CmpOp::Nan => t.is_arith_float(),
    }
}

//! The interpreter: the semantic reference every backend must agree with, bit for bit.
//!
//! # Execution
//!
//! Each block runs all its threads in lockstep: every value is an array with one lane per
//! thread (lane = `x + y * bx + z * bx * by`), and each instruction runs over the lanes an
//! active mask selects. Both branches of an `if` run under their masks (a branch no lane takes
//! is skipped); a `for` loop iterates while any lane is active, each lane leaving once its own
//! `iv < end` fails (signed or unsigned by the induction type; `iv += step` wraps). Warps are
//! 32 consecutive lanes (`laneid = lane % 32`).
//!
//! Blocks run in parallel on CPU threads ([`run_with_threads`]; [`run`] takes the count from
//! `RUDA_INTERP_THREADS`, else the machine's parallelism). A kernel free of races gives the
//! same result for any thread count. When blocks fail, the error reported is that of the
//! lowest linear block id (`x + y * gx + z * gx * gy`); the buffers' contents are then
//! unspecified.
//!
//! # Memory
//!
//! - Global: buffer `i` (the `i`-th [`KernelArg::Buffer`]) lives at address
//!   [`global_buffer_address`]`(i)` = `(i + 1) << 40`, so a pointer tells its buffer, and address
//!   0 is in no buffer. Every access is checked to lie inside one buffer and to be aligned to
//!   its size (a vector access to the whole vector's size). Global memory is little-endian;
//!   blocks access it through relaxed atomics of the access's element size, and atomic
//!   operations are real atomic read-modify-writes. Races on global memory are *not*
//!   detected.
//! - Shared: per block, zero-filled at block start: the static arrays in declaration order,
//!   each at its alignment, then the dynamic window at the next multiple of
//!   [`DYNAMIC_SHARED_ALIGN`](crate::kernel::DYNAMIC_SHARED_ALIGN). Shared pointers are 32-bit
//!   offsets. Accesses are checked for bounds and alignment, and plain loads and stores are
//!   checked for races: two different threads touching a byte between two barriers, at least
//!   one writing, is an error naming both (stores of one instruction by different threads to
//!   the same byte included). Atomics are exempt; shared atomics apply lane by lane in thread
//!   order, so float atomic sums depend on that order (as on hardware they depend on timing).
//! - Asynchronous copies (`cp.async`, see [`crate::Op::CpAsync`]): a copy reads its global
//!   source at issue and is pending, per issuing thread, until that thread's
//!   `cp.async.wait_group` completes its group; its destination bytes are reserved meanwhile,
//!   so any shared access to them by any thread is an error naming the copy, and its data lands
//!   only at the wait (a missing wait is caught, never silently works). Barriers do not complete
//!   copies.
//!
//! # Semantics
//!
//! Each op means the PTX instruction it lowers to (see [`crate::kernel`]): wrapping integer
//! arithmetic, shifts clamped to the width, division truncating toward zero with `MIN / -1 =
//! MIN` and division by zero an error, IEEE round-to-nearest-even float arithmetic with fused
//! `fma` and no flushing of subnormals, every arithmetic NaN the canonical NaN
//! (`0x7fffffff`, `0x7fffffffffffffff`; `0x7fff` for f16/bf16 conversions), PTX's `min`/`max`
//! NaN and signed-zero rules, `cvt` rounding in every mode without double rounding and
//! saturating float-to-integer conversions (NaN to 0). `shfl` takes its lane operand modulo
//! 32, as PTX does, and needs every lane of the warp active.
//!
//! The approximate functions (`rsqrt`, `ex2`, `lg2`, `tanh`, `sin`, `cos`) are computed as the
//! correctly rounded `f64` result rounded to `f32`. Hardware differs within the error bounds
//! the PTX ISA states, so engines compare these ops within those bounds, not bit for bit.
//!
//! # Errors
//!
//! Launches are validated before anything runs (grid and block shape, launch bounds, the
//! arguments against the parameters, shared-memory size). At run time, out-of-bounds and
//! misaligned accesses, shared-memory races, accesses to the destination of a pending
//! `cp.async`, barriers not reached by every thread of the block, warp operations with
//! inactive lanes, integer division by zero and a `for` loop that a thread enters with a step
//! of 0 (it would never end; the verifier rejects a constant 0) are errors naming the kernel,
//! the op, its Rust location, the block and the thread. The kernel is not verified
//! here (run [`crate::verify()`] for that), but a malformed kernel is an error, not a panic.
//!
//! # Counters
//!
//! [`run_profiled`] runs a launch as [`run_with_threads`] does and also counts, for the launch
//! ([`Profile::totals`]) and per instruction ([`Profile::sites`]: its
//! [`InstId`](crate::kernel::InstId), mnemonic and IR location), what Nsight Compute counts on
//! a GPU. Counting is off unless asked: a plain run
//! checks once per instruction that it is not profiled, nothing more. Each CPU worker counts
//! on its own and the counts are merged when the blocks are done, so they do not depend on the
//! thread count.
//!
//! Warps are 32 consecutive lanes of the block, as above. Each count is per *warp-level
//! execution*: one execution of an instruction by the active lanes of one warp (a warp with no
//! active lane does not execute it).
//!
//! - **Global memory.** A load, store or atomic adds one request and the number of distinct
//!   32-byte-aligned 32-byte sectors the lanes' bytes touch (`global_{load,store,atomic}_*`;
//!   atomics apart). Buffer `i` starts at `(i + 1) << 40`, 256-byte aligned as the CUDA
//!   allocator aligns buffers, so sectors depend on offsets only: a coalesced f32 warp touches
//!   4 sectors, a stride of 8 f32 32, a shift of 4 bytes 5. A `cp.async` is a global load of the
//!   bytes it reads (`src_size`; one request per warp even when that is 0) and a shared store
//!   of its `size` bytes, as Nsight Compute counts `LDGSTS`.
//! - **Local memory.** The IR has none (values live in registers), so `local_*` stay 0; they
//!   exist so reports from other sources have the same shape.
//! - **Shared memory.** A load or store (vector accesses, `ldmatrix` and the `cp.async`
//!   destination included) adds one request and its *wavefronts*: the lanes form groups, and
//!   each group with an active lane needs as many passes as the largest number of *distinct*
//!   4-byte words one of the 32 banks (bank = offset / 4 mod 32) holds among the group's
//!   accesses (lanes on one word are served together). Accesses of at most 4 bytes form one
//!   group of the whole warp, 8-byte accesses half-warp groups (lanes 0-15, 16-31), 16-byte
//!   accesses quarter-warp groups; an `ldmatrix` forms one group per 8x8 matrix, its eight
//!   16-byte rows addressed by lanes `8m..8m+8`. `bank_conflicts` adds wavefronts minus the
//!   ideal, the number of groups with an active lane (1 for at most 4 bytes; up to 2 and 4 for
//!   8 and 16 bytes; 1, 2 or 4 for `ldmatrix .x1/.x2/.x4`). Shared atomics only add to
//!   `shared_atomic_requests`: lanes on one address serialise, which is not modelled.
//! - **Instruction mix** ([`InstructionMix`]), once per warp-level execution: `fp32`,
//!   `fp16_bf16`, `fp64` for float arithmetic, comparisons and unary ops by operand type (the IR
//!   computes in f32 and f64 only, so `fp16_bf16` counts the conversions to or from f16 and
//!   bf16); `integer` for integer and predicate arithmetic and comparisons, and `ptradd`;
//!   `mma`; `ldmatrix`; `cp_async` (copy, commit, wait); `shuffles` (`shfl` and `vote`);
//!   `barriers`; `branches` (an `if` once, a `for` once per evaluation of its test, the last,
//!   failing one included); `memory` (loads, stores, atomics); `other` (special registers,
//!   `select`, other conversions, bitcasts, vector element moves). Constants and shared-array
//!   bases are folded by the interpreter and never execute.
//! - **Divergent branches**: an `if` whose condition the active lanes of a warp disagree on, or
//!   a loop test that some live lanes of a warp pass and others fail; once per warp per
//!   evaluation.
//! - **Flops**: f32 and f64 `add`, `sub`, `mul` count 1 per active lane, `fma` 2, an
//!   `mma.m16n8k16` 2 x 16 x 8 x 16 = 4096 per warp; other float ops (`div`, `min`, `max`,
//!   `sqrt`, `rcp`, the approximate functions, `neg`, `abs`, comparisons) count as
//!   instructions only.
//! - **Bytes**: `bytes_requested` is what the active lanes ask for (access size x lanes; 128
//!   per `ldmatrix` matrix; for `cp.async` the bytes read plus the bytes written), global,
//!   local and shared; `bytes_moved` is global and local sectors x 32 (the L1 traffic);
//!   [`Profile::dram_bytes_min`] is the number of distinct global sectors the whole launch
//!   touches (every block, loads, stores, atomics and `cp.async` sources) x 32: the traffic no
//!   cache avoids, since tiles re-read through L2 would otherwise count many times.
//!
//! Not modelled: merges the hardware makes beyond these groups (for instance a warp whose
//! lanes all give one 16-byte address is served in fewer passes than its four quarter-warp
//! groups, and some 8-byte patterns pair half-warps); caches (real DRAM traffic lies between
//! `dram_bytes_min` and `bytes_moved`, by L2 reuse); timing of any kind (latency, issue
//! order, occupancy, atomic serialisation, the replay cost of conflicts beyond their count);
//! and the SASS a backend emits, where one IR instruction may be several machine
//! instructions or none.

mod compile;
mod counters;
mod exec;
mod memory;
pub mod num;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::kernel::{Constant, Kernel, Loc};
use crate::types::{AddrSpace, Type};

use compile::{compile, shared_layout};
pub use counters::{Counters, InstructionMix, Profile, SiteCounters};
use exec::{thread_of, Fault, Launch, Worker};
use memory::{Global, BUFFER_SHIFT};

/// Grid and block shape of a launch, and the dynamic shared memory it gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared_bytes: u32,
}

impl LaunchConfig {
    /// A 1-D launch.
    pub fn linear(blocks: u32, threads: u32) -> LaunchConfig {
        LaunchConfig { grid: [blocks, 1, 1], block: [threads, 1, 1], dynamic_shared_bytes: 0 }
    }
}

/// One kernel argument: a global buffer (the kernel sees its address) or a scalar.
pub enum KernelArg<'a> {
    Buffer(&'a mut [u8]),
    Scalar(Constant),
}

/// A runtime error of the interpreted kernel, naming where it happened.
///
/// Errors found before any block runs (op `launch`: the launch does not fit the kernel; or a
/// malformed kernel) have `block` and `thread` zero, and do not print them.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("kernel `{kernel}`: `{op}`{}: {message}", place(.loc, .block, .thread, .op, .message))]
pub struct InterpError {
    pub kernel: String,
    pub op: String,
    pub loc: Option<Loc>,
    pub block: [u32; 3],
    pub thread: [u32; 3],
    pub message: String,
}

fn place(loc: &Option<Loc>, block: &[u32; 3], thread: &[u32; 3], op: &str, message: &str) -> String {
    let mut s = loc.as_ref().map_or_else(String::new, |l| format!(" at {l}"));
    if op != "launch" && !message.starts_with(compile::MALFORMED) {
        s.push_str(&format!(" in block {block:?} thread {thread:?}"));
    }
    s
}

/// The environment variable that sets the number of CPU threads [`run`] uses.
pub const THREADS_ENV: &str = "RUDA_INTERP_THREADS";

/// The most shared memory (static and dynamic) a block may use, in bytes (227 KiB, the
/// sm_90 limit).
pub const MAX_SHARED_BYTES: u64 = 227 * 1024;

/// The global address at which the `index`-th buffer argument starts.
pub fn global_buffer_address(index: usize) -> u64 {
    (index as u64 + 1) << BUFFER_SHIFT
}

/// Run a launch of `kernel` on host buffers, on as many CPU threads as `RUDA_INTERP_THREADS`
/// says (default: the machine's available parallelism).
pub fn run(kernel: &Kernel, launch: &LaunchConfig, args: &mut [KernelArg<'_>]) -> Result<(), InterpError> {
    let threads = threads_from_env().map_err(|m| launch_error(kernel, m))?;
    run_with_threads(kernel, launch, args, threads)
}

/// [`run`] with an explicit number of CPU threads (0 counts as 1).
pub fn run_with_threads(
    kernel: &Kernel,
    launch: &LaunchConfig,
    args: &mut [KernelArg<'_>],
    threads: usize,
) -> Result<(), InterpError> {
    execute(kernel, launch, args, threads, None)
}

/// [`run_with_threads`], counting what the launch does (see "Counters" in the module docs).
/// The counts do not depend on `threads`.
pub fn run_profiled(
    kernel: &Kernel,
    launch: &LaunchConfig,
    args: &mut [KernelArg<'_>],
    threads: usize,
) -> Result<Profile, InterpError> {
    let buffer_lens: Vec<usize> = args
        .iter()
        .filter_map(|a| match a {
            KernelArg::Buffer(b) => Some(b.len()),
            KernelArg::Scalar(_) => None,
        })
        .collect();
    let profiling = counters::Profiling::new(kernel, &buffer_lens);
    execute(kernel, launch, args, threads, Some(&profiling))?;
    Ok(profiling.finish(kernel))
}

/// Run a launch, counting into `profiling` when given.
fn execute(
    kernel: &Kernel,
    launch: &LaunchConfig,
    args: &mut [KernelArg<'_>],
    threads: usize,
    profiling: Option<&counters::Profiling>,
) -> Result<(), InterpError> {
    validate_shape(kernel, launch).map_err(|m| launch_error(kernel, m))?;
    let param_bits = bind_args(kernel, args).map_err(|m| launch_error(kernel, m))?;
    let layout = shared_layout(kernel, launch.dynamic_shared_bytes).map_err(|m| launch_error(kernel, m))?;
    if layout.total > MAX_SHARED_BYTES {
        return Err(launch_error(
            kernel,
            format!(
                "the block needs {} bytes of shared memory ({} static, {} dynamic), more than the {MAX_SHARED_BYTES} allowed",
                layout.total, layout.dyn_offset, launch.dynamic_shared_bytes
            ),
        ));
    }
    let program = compile(kernel, &param_bits, &layout)?;

    // Buffers not 8-byte aligned on the host run on an aligned copy, so that every access of
    // up to 8 bytes the alignment check admits is aligned on the host as well.
    let mut staged: Vec<(usize, Vec<u64>)> = vec![];
    let mut regions = vec![];
    for (i, arg) in args.iter_mut().enumerate() {
        if let KernelArg::Buffer(buf) = arg {
            let ptr = if buf.as_ptr().align_offset(8) == 0 {
                buf.as_mut_ptr()
            } else {
                let mut copy = vec![0u64; buf.len().div_ceil(8)];
                copy_bytes_into(&mut copy, buf);
                // Moving the vector below keeps its heap storage where it is.
                let ptr = copy.as_mut_ptr().cast();
                staged.push((i, copy));
                ptr
            };
            regions.push((ptr, buf.len()));
        }
    }
    // SAFETY: each region is a distinct `&mut [u8]` argument (or our own aligned copy of
    // one), 8-byte aligned, untouched by anything else until the blocks have finished.
    let global = unsafe { Global::new(regions) };
    let result = run_blocks(kernel, launch, &program, &global, layout.total as usize, threads, profiling);
    drop(global);
    for (i, copy) in &staged {
        if let KernelArg::Buffer(buf) = &mut args[*i] {
            copy_bytes_from(buf, copy);
        }
    }
    result
}

fn copy_bytes_into(dst: &mut [u64], src: &[u8]) {
    for (d, chunk) in dst.iter_mut().zip(src.chunks(8)) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        *d = u64::from_ne_bytes(word);
    }
}

fn copy_bytes_from(dst: &mut [u8], src: &[u64]) {
    for (chunk, s) in dst.chunks_mut(8).zip(src) {
        let len = chunk.len();
        chunk.copy_from_slice(&s.to_ne_bytes()[..len]);
    }
}

fn run_blocks(
    kernel: &Kernel,
    cfg: &LaunchConfig,
    program: &compile::Program,
    global: &Global,
    shared_bytes: usize,
    threads: usize,
    profiling: Option<&counters::Profiling>,
) -> Result<(), InterpError> {
    let mut launch = Launch::new(program, global, cfg.block, cfg.grid, shared_bytes);
    launch.profiling = profiling;
    // Workers hand their counts to `profiling` when they are dropped, inside `run_grid`.
    run_grid(cfg.grid, threads, || Worker::new(&launch), |w, block| w.run_block(block))
        .map_err(|(block, f)| fault_error(kernel, cfg, block, f))
}

/// Run every block of `grid` on up to `threads` CPU threads, each with a worker made by
/// `new_worker`; on failure return the coordinates and fault of the lowest block (by linear id)
/// that failed, so the error reported does not depend on scheduling. Blocks at or past a failed
/// one need not run; those below it must. Shared by the interpreter and the PTX emulator.
pub fn run_grid<W, F: Send>(
    grid: [u32; 3],
    threads: usize,
    new_worker: impl Fn() -> W + Sync,
    run_block: impl Fn(&mut W, [u32; 3]) -> Result<(), F> + Sync,
) -> Result<(), ([u32; 3], F)> {
    let [gx, gy, gz] = grid.map(|d| d as u64);
    let total = gx * gy * gz;
    let ctaid = |b: u64| [(b % gx) as u32, (b / gx % gy) as u32, (b / (gx * gy)) as u32];
    let workers = threads.max(1).min(usize::try_from(total).unwrap_or(usize::MAX));
    if workers == 1 {
        let mut worker = new_worker();
        for b in 0..total {
            run_block(&mut worker, ctaid(b)).map_err(|f| (ctaid(b), f))?;
        }
        return Ok(());
    }
    let next = AtomicU64::new(0);
    let stop = AtomicU64::new(u64::MAX);
    let first: Mutex<Option<(u64, F)>> = Mutex::new(None);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| {
                let mut worker = new_worker();
                loop {
                    let b = next.fetch_add(1, Ordering::Relaxed);
                    if b >= total || b >= stop.load(Ordering::Relaxed) {
                        break;
                    }
                    if let Err(f) = run_block(&mut worker, ctaid(b)) {
                        let mut first = first.lock().unwrap_or_else(|e| e.into_inner());
                        if !matches!(*first, Some((fb, _)) if fb < b) {
                            *first = Some((b, f));
                            stop.fetch_min(b, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    match first.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some((b, f)) => Err((ctaid(b), f)),
        None => Ok(()),
    }
}

fn fault_error(kernel: &Kernel, cfg: &LaunchConfig, block: [u32; 3], f: Fault) -> InterpError {
    let inst = &kernel.insts[f.inst.index()];
    InterpError {
        kernel: kernel.name.clone(),
        op: inst.op.mnemonic(),
        loc: inst.loc.clone(),
        block,
        thread: thread_of(cfg.block, f.lane),
        message: f.message,
    }
}

fn launch_error(kernel: &Kernel, message: String) -> InterpError {
    InterpError { kernel: kernel.name.clone(), op: "launch".into(), loc: None, block: [0; 3], thread: [0; 3], message }
}

/// The number of CPU threads [`run`] uses: `RUDA_INTERP_THREADS`, else the machine's
/// parallelism; an error message for a value that is not a positive integer.
pub fn threads_from_env() -> Result<usize, String> {
    match std::env::var(THREADS_ENV) {
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("{THREADS_ENV} must be a positive integer, got {s:?}")),
        Err(std::env::VarError::NotPresent) => Ok(std::thread::available_parallelism().map_or(1, |n| n.get())),
        Err(std::env::VarError::NotUnicode(s)) => Err(format!("{THREADS_ENV} must be a positive integer, got {s:?}")),
    }
}

/// Grid and block shape, against CUDA's limits and the kernel's launch bounds.
fn validate_shape(kernel: &Kernel, cfg: &LaunchConfig) -> Result<(), String> {
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
    if let Some(lb) = kernel.launch_bounds {
        if threads > lb.max_threads as u64 {
            return Err(format!(
                "block {:?} has {threads} threads, more than the kernel's launch bound of {}",
                cfg.block, lb.max_threads
            ));
        }
    }
    Ok(())
}

/// Match the arguments against the parameters; the bits each parameter holds.
fn bind_args(kernel: &Kernel, args: &[KernelArg<'_>]) -> Result<Vec<u64>, String> {
    if args.len() != kernel.params.len() {
        return Err(format!("{} arguments given, the kernel has {} parameters", args.len(), kernel.params.len()));
    }
    let mut bits = Vec::with_capacity(args.len());
    let mut buffers = 0usize;
    for (param, arg) in kernel.params.iter().zip(args) {
        let ty = kernel.values.get(param.value.index()).map(|v| v.ty);
        let name = &param.name;
        match (ty, arg) {
            (Some(Type::Ptr(AddrSpace::Global, _)), KernelArg::Buffer(buf)) => {
                if buf.len() as u64 >= 1 << BUFFER_SHIFT {
                    return Err(format!(
                        "buffer for `{name}` has {} bytes; at most 2^{BUFFER_SHIFT} are supported",
                        buf.len()
                    ));
                }
                bits.push(global_buffer_address(buffers));
                buffers += 1;
            }
            (Some(Type::Ptr(AddrSpace::Global, _)), KernelArg::Scalar(c)) => {
                return Err(format!(
                    "parameter `{name}` is a global pointer; pass a buffer, not the scalar {} {c}",
                    c.ty
                ));
            }
            (Some(Type::Scalar(t)), KernelArg::Scalar(c)) if t != crate::types::ScalarType::Pred => {
                if c.ty != t {
                    return Err(format!("parameter `{name}` is {t}, the argument is {} {c}", c.ty));
                }
                bits.push(Constant::new(c.ty, c.bits).bits);
            }
            (Some(Type::Scalar(t)), KernelArg::Buffer(_)) => {
                return Err(format!("parameter `{name}` is the scalar type {t}; pass a scalar, not a buffer"));
            }
            (Some(other), _) => return Err(format!("parameter `{name}` has type {other}, which a launch cannot pass")),
            (None, _) => return Err(format!("parameter `{name}` refers to an undefined value {}", param.value)),
        }
    }
    Ok(bits)
}

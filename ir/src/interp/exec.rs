//! Running one block: all its threads in lockstep, one lane per thread, over
//! structure-of-arrays registers under an active mask.
//!
//! Pure operations run over every lane when at least half of them are active (a tight loop the
//! compiler vectorises; inactive lanes compute values nobody reads, as their slots belong to
//! values of the current region), otherwise over the active lanes only. Operations that touch
//! memory, can fail, or talk across lanes always visit exactly the active lanes, in thread
//! order.

use super::compile::*;
use super::counters::{Dir, Profiling, Recorder};
use super::memory::{self, Conflict, Global, SharedMem};
use super::num::{self, FloatLane, Fmt, IntLane};
use crate::kernel::{CmpOp, InstId, MmaType, Rounding, ShflMode, SpecialReg, VoteMode};
use crate::types::ScalarType;

/// A runtime error inside a block: the instruction, the thread (its index in the block) and
/// what went wrong.
pub(crate) struct Fault {
    pub inst: InstId,
    pub lane: u32,
    pub message: String,
}

/// What every block of a launch shares.
pub(crate) struct Launch<'a> {
    pub prog: &'a Program,
    pub global: &'a Global,
    pub block: [u32; 3],
    pub grid: [u32; 3],
    shared_bytes: usize,
    n: usize,
    all: Vec<u32>,
    tid: [Vec<u64>; 3],
    laneid: Vec<u64>,
    /// Set when the launch is profiled: each worker then counts into a recorder of its own.
    pub profiling: Option<&'a Profiling>,
}

impl<'a> Launch<'a> {
    pub(crate) fn new(
        prog: &'a Program,
        global: &'a Global,
        block: [u32; 3],
        grid: [u32; 3],
        shared_bytes: usize,
    ) -> Self {
        let n = block.iter().map(|&d| d as usize).product::<usize>();
        let tid = [0, 1, 2].map(|axis| (0..n).map(|t| thread_of(block, t as u32)[axis] as u64).collect());
        Launch {
            prog,
            global,
            block,
            grid,
            shared_bytes,
            n,
            all: (0..n as u32).collect(),
            tid,
            laneid: (0..n as u64).map(|t| t % 32).collect(),
            profiling: None,
        }
    }
}

/// The 3-D thread index of lane `lane` (`lane = x + y * bx + z * bx * by`).
pub(crate) fn thread_of(block: [u32; 3], lane: u32) -> [u32; 3] {
    let (bx, by) = (block[0], block[1]);
    [lane % bx, lane / bx % by, lane / (bx * by)]
}

/// The active lanes (sorted thread indices).
#[derive(Clone, Copy)]
struct Mask<'m> {
    idx: &'m [u32],
    full: bool,
    /// Pure operations may run over all lanes.
    dense: bool,
}

impl<'m> Mask<'m> {
    fn new(idx: &'m [u32], n: usize) -> Mask<'m> {
        Mask { idx, full: idx.len() == n, dense: idx.len() * 2 >= n }
    }
}

/// The register file: slot `s` holds lanes `s * n .. (s + 1) * n`.
struct Regs {
    data: Vec<u64>,
    n: usize,
}

impl Regs {
    #[inline(always)]
    fn get(&self, s: Slot) -> &[u64] {
        &self.data[s as usize * self.n..][..self.n]
    }

    #[inline(always)]
    fn get_mut(&mut self, s: Slot) -> &mut [u64] {
        let n = self.n;
        &mut self.data[s as usize * n..][..n]
    }

    #[inline(always)]
    fn at(&self, s: Slot, lane: usize) -> u64 {
        self.data[s as usize * self.n + lane]
    }

    #[inline(always)]
    fn set(&mut self, s: Slot, lane: usize, v: u64) {
        self.data[s as usize * self.n + lane] = v;
    }

    /// A destination slot mutably and source slots shared.
    #[inline(always)]
    fn dst<const K: usize>(&mut self, d: Slot, srcs: [Slot; K]) -> (&mut [u64], [&[u64]; K]) {
        let n = self.n;
        let slots = self.data.len() / n.max(1);
        // The compiler never gives a destination the slot of an operand of the same
        // instruction; checked here because the slices below rely on it.
        assert!(
            (d as usize) < slots && srcs.iter().all(|&s| s != d && (s as usize) < slots),
            "interpreter bug: destination slot {d} aliases or exceeds its sources {srcs:?}"
        );
        let base = self.data.as_mut_ptr();
        // SAFETY: all slots are in bounds, and the mutable one is disjoint from the shared ones
        // (shared ones may overlap each other).
        unsafe {
            (
                std::slice::from_raw_parts_mut(base.add(d as usize * n), n),
                srcs.map(|s| std::slice::from_raw_parts(base.add(s as usize * n).cast_const(), n)),
            )
        }
    }
}

#[inline(always)]
fn map1(m: Mask<'_>, d: &mut [u64], a: &[u64], f: impl Fn(u64) -> u64) {
    if m.dense {
        for (d, &a) in d.iter_mut().zip(a) {
            *d = f(a);
        }
    } else {
        for &t in m.idx {
            let t = t as usize;
            d[t] = f(a[t]);
        }
    }
}

#[inline(always)]
fn map2(m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64], f: impl Fn(u64, u64) -> u64) {
    if m.dense {
        for ((d, &a), &b) in d.iter_mut().zip(a).zip(b) {
            *d = f(a, b);
        }
    } else {
        for &t in m.idx {
            let t = t as usize;
            d[t] = f(a[t], b[t]);
        }
    }
}

#[inline(always)]
fn map3(m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64], c: &[u64], f: impl Fn(u64, u64, u64) -> u64) {
    if m.dense {
        for (((d, &a), &b), &c) in d.iter_mut().zip(a).zip(b).zip(c) {
            *d = f(a, b, c);
        }
    } else {
        for &t in m.idx {
            let t = t as usize;
            d[t] = f(a[t], b[t], c[t]);
        }
    }
}

/// Copy exactly the active lanes (region results and loop-carried values).
#[inline(always)]
fn copy_masked(m: Mask<'_>, d: &mut [u64], s: &[u64]) {
    if m.full {
        d.copy_from_slice(s);
    } else {
        for &t in m.idx {
            d[t as usize] = s[t as usize];
        }
    }
}

macro_rules! with_int {
    ($ty:expr, $T:ident => $e:expr) => {
        match $ty {
            IntTy::I16 => {
                type $T = i16;
                $e
            }
            IntTy::I32 => {
                type $T = i32;
                $e
            }
            IntTy::I64 => {
                type $T = i64;
                $e
            }
            IntTy::U16 => {
                type $T = u16;
                $e
            }
            IntTy::U32 => {
                type $T = u32;
                $e
            }
            IntTy::U64 => {
                type $T = u64;
                $e
            }
        }
    };
}

macro_rules! with_float {
    ($ty:expr, $F:ident => $e:expr) => {
        match $ty {
            FTy::F32 => {
                type $F = f32;
                $e
            }
            FTy::F64 => {
                type $F = f64;
                $e
            }
        }
    };
}

#[inline(always)]
fn iun<T: IntLane>(m: Mask<'_>, d: &mut [u64], a: &[u64], f: impl Fn(T) -> T) {
    map1(m, d, a, |x| f(T::from_lane(x)).to_lane());
}

#[inline(always)]
fn ibin<T: IntLane>(m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64], f: impl Fn(T, T) -> T) {
    map2(m, d, a, b, |x, y| f(T::from_lane(x), T::from_lane(y)).to_lane());
}

#[inline(always)]
fn icmp<T: IntLane>(m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64], f: impl Fn(T, T) -> bool) {
    map2(m, d, a, b, |x, y| f(T::from_lane(x), T::from_lane(y)) as u64);
}

#[inline(always)]
fn fbin<F: FloatLane>(m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64], f: impl Fn(F, F) -> u64) {
    map2(m, d, a, b, |x, y| f(F::from_lane(x), F::from_lane(y)));
}

#[inline(always)]
fn fcmp<F: FloatLane>(m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64], f: impl Fn(F, F) -> bool) {
    map2(m, d, a, b, |x, y| f(F::from_lane(x), F::from_lane(y)) as u64);
}

fn int_un<T: IntLane>(op: IntUn, m: Mask<'_>, d: &mut [u64], a: &[u64]) {
    match op {
        IntUn::Neg => iun(m, d, a, T::neg),
        IntUn::Not => iun(m, d, a, T::not),
        IntUn::Abs => iun(m, d, a, T::abs),
        IntUn::Popc => iun(m, d, a, T::popc),
        IntUn::Clz => iun(m, d, a, T::clz),
    }
}

fn int_bin<T: IntLane>(op: IntBin, m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64]) {
    match op {
        IntBin::Add => ibin(m, d, a, b, T::add),
        IntBin::Sub => ibin(m, d, a, b, T::sub),
        IntBin::Mul => ibin(m, d, a, b, T::mul),
        IntBin::MulHi => ibin(m, d, a, b, T::mulhi),
        IntBin::Min => ibin(m, d, a, b, T::min),
        IntBin::Max => ibin(m, d, a, b, T::max),
        IntBin::And => ibin(m, d, a, b, T::and),
        IntBin::Or => ibin(m, d, a, b, T::or),
        IntBin::Xor => ibin(m, d, a, b, T::xor),
        IntBin::Shl => map2(m, d, a, b, |x, s| T::from_lane(x).shl(s as u32).to_lane()),
        IntBin::Shr => map2(m, d, a, b, |x, s| T::from_lane(x).shr(s as u32).to_lane()),
    }
}

/// Division or remainder over exactly the active lanes; `Err(lane)` at a zero divisor.
fn int_div<T: IntLane>(rem: bool, m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64]) -> Result<(), u32> {
    for &t in m.idx {
        let i = t as usize;
        let (x, y) = (T::from_lane(a[i]), T::from_lane(b[i]));
        if y.is_zero() {
            return Err(t);
        }
        d[i] = if rem { x.rem(y) } else { x.div(y) }.to_lane();
    }
    Ok(())
}

fn int_cmp<T: IntLane>(op: IntCmp, m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64]) {
    match op {
        IntCmp::Eq => icmp(m, d, a, b, |x: T, y: T| x == y),
        IntCmp::Ne => icmp(m, d, a, b, |x: T, y: T| x != y),
        IntCmp::Lt => icmp(m, d, a, b, |x: T, y: T| x < y),
        IntCmp::Le => icmp(m, d, a, b, |x: T, y: T| x <= y),
        IntCmp::Gt => icmp(m, d, a, b, |x: T, y: T| x > y),
        IntCmp::Ge => icmp(m, d, a, b, |x: T, y: T| x >= y),
    }
}

fn float_un<F: FloatLane>(op: FloatUn, m: Mask<'_>, d: &mut [u64], a: &[u64]) {
    match op {
        // Sign-bit operations, as PTX's neg/abs (NaNs keep their payload).
        FloatUn::Neg => map1(m, d, a, |x| x ^ F::SIGN_BIT),
        FloatUn::Abs => map1(m, d, a, |x| x & !F::SIGN_BIT),
        FloatUn::Sqrt => map1(m, d, a, |x| F::from_lane(x).sqrt().canon()),
        FloatUn::Rcp => map1(m, d, a, |x| (F::ONE / F::from_lane(x)).canon()),
    }
}

fn float_bin<F: FloatLane>(op: FloatBin, m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64]) {
    match op {
        FloatBin::Add => fbin(m, d, a, b, |x: F, y: F| (x + y).canon()),
        FloatBin::Sub => fbin(m, d, a, b, |x: F, y: F| (x - y).canon()),
        FloatBin::Mul => fbin(m, d, a, b, |x: F, y: F| (x * y).canon()),
        FloatBin::Div => fbin(m, d, a, b, |x: F, y: F| (x / y).canon()),
        FloatBin::Min => fbin(m, d, a, b, num::fmin::<F>),
        FloatBin::Max => fbin(m, d, a, b, num::fmax::<F>),
    }
}

fn float_cmp<F: FloatLane>(op: CmpOp, m: Mask<'_>, d: &mut [u64], a: &[u64], b: &[u64]) {
    match op {
        CmpOp::Eq => fcmp(m, d, a, b, |x: F, y: F| x == y),
        CmpOp::Ne => fcmp(m, d, a, b, |x: F, y: F| x.partial_cmp(&y).is_some_and(|o| o.is_ne())),
        CmpOp::Lt => fcmp(m, d, a, b, |x: F, y: F| x < y),
        CmpOp::Le => fcmp(m, d, a, b, |x: F, y: F| x <= y),
        CmpOp::Gt => fcmp(m, d, a, b, |x: F, y: F| x > y),
        CmpOp::Ge => fcmp(m, d, a, b, |x: F, y: F| x >= y),
        CmpOp::Neu => fcmp(m, d, a, b, |x: F, y: F| x != y),
        CmpOp::Nan => fcmp(m, d, a, b, |x: F, y: F| x.is_nan() || y.is_nan()),
    }
}

fn cvt(conv: Conv, m: Mask<'_>, d: &mut [u64], a: &[u64]) {
    use Rounding::{Rn, Rz};
    // Hot conversions of LLM kernels get native code; the generic paths define the rest (the
    // tests check that both agree).
    match conv {
        Conv::IntInt { from, to, sat } => map1(m, d, a, |x| num::int_to_int(x, from, to, sat)),
        Conv::FloatInt { from: Fmt::F32, to: ScalarType::I32, mode: Rz } => {
            map1(m, d, a, |x| f32::from_lane(x) as i32 as u32 as u64)
        }
        Conv::FloatInt { from: Fmt::F32, to: ScalarType::U32, mode: Rz } => {
            map1(m, d, a, |x| f32::from_lane(x) as u32 as u64)
        }
        Conv::FloatInt { from, to, mode } => map1(m, d, a, |x| num::float_to_int(x, from, to, mode)),
        Conv::IntFloat { from: ScalarType::I32, to: Fmt::F32, mode: Rn } => map1(m, d, a, |x| (x as i32 as f32).bits()),
        Conv::IntFloat { from: ScalarType::U32, to: Fmt::F32, mode: Rn } => map1(m, d, a, |x| (x as u32 as f32).bits()),
        Conv::IntFloat { from, to, mode } => map1(m, d, a, |x| num::int_to_float(x, from, to, mode)),
        Conv::FloatFloat { from: Fmt::F16, to: Fmt::F32, .. } => {
            map1(m, d, a, |x| half::f16::from_bits(x as u16).to_f32().canon())
        }
        // Exact, and a NaN keeps its payload: the backends widen bf16 with a shift (the passes
        // learn it from `Cvt::keeps_nan_payload`).
        Conv::FloatFloat { from: Fmt::BF16, to: Fmt::F32, .. } => map1(m, d, a, |x| (x & 0xffff) << 16),
        Conv::FloatFloat { from: Fmt::F32, to: Fmt::F16, mode: Some(Rn) } => map1(m, d, a, |x| {
            let v = f32::from_lane(x);
            if v.is_nan() {
                Fmt::F16.nan()
            } else {
                half::f16::from_f32(v).to_bits() as u64
            }
        }),
        Conv::FloatFloat { from: Fmt::F32, to: Fmt::BF16, mode: Some(Rn) } => map1(m, d, a, |x| {
            let v = f32::from_lane(x);
            if v.is_nan() {
                Fmt::BF16.nan()
            } else {
                half::bf16::from_f32(v).to_bits() as u64
            }
        }),
        Conv::FloatFloat { from: Fmt::F64, to: Fmt::F32, mode: Some(Rn) } => {
            map1(m, d, a, |x| (f64::from_lane(x) as f32).canon())
        }
        Conv::FloatFloat { from: Fmt::F32, to: Fmt::F64, .. } => map1(m, d, a, |x| (f32::from_lane(x) as f64).canon()),
        Conv::FloatFloat { from, to, mode } => map1(m, d, a, |x| num::float_to_float(x, from, to, mode)),
    }
}

fn ptr_add(ext: IndexExt, scale: u64, wrap32: bool, m: Mask<'_>, d: &mut [u64], p: &[u64], i: &[u64]) {
    let mask = if wrap32 { u32::MAX as u64 } else { u64::MAX };
    let add = move |p: u64, i: u64| p.wrapping_add(i.wrapping_mul(scale)) & mask;
    match ext {
        IndexExt::Signed32 => map2(m, d, p, i, |p, i| add(p, i as i32 as i64 as u64)),
        IndexExt::Unsigned32 => map2(m, d, p, i, |p, i| add(p, i as u32 as u64)),
        IndexExt::Full64 => map2(m, d, p, i, add),
    }
}

fn atomic_apply(f: AtomFn, old: u64, v: u64, expected: u64) -> u64 {
    match f {
        AtomFn::Add32 => (old as u32).wrapping_add(v as u32) as u64,
        AtomFn::Add64 => old.wrapping_add(v),
        AtomFn::AddF32 => (f32::from_lane(old) + f32::from_lane(v)).canon(),
        AtomFn::AddF64 => (f64::from_lane(old) + f64::from_lane(v)).canon(),
        AtomFn::MinI32 => (old as i32).min(v as i32) as u32 as u64,
        AtomFn::MinU32 => (old as u32).min(v as u32) as u64,
        AtomFn::MinI64 => (old as i64).min(v as i64) as u64,
        AtomFn::MinU64 => old.min(v),
        AtomFn::MaxI32 => (old as i32).max(v as i32) as u32 as u64,
        AtomFn::MaxU32 => (old as u32).max(v as u32) as u64,
        AtomFn::MaxI64 => (old as i64).max(v as i64) as u64,
        AtomFn::MaxU64 => old.max(v),
        AtomFn::Exch => v,
        AtomFn::Cas => {
            if old == expected {
                v
            } else {
                old
            }
        }
    }
}

type LaneResult = Result<(), (u32, String)>;

/// Count one execution of `node` by the lanes `idx` (a `for` loop counts each evaluation of
/// its test instead, in [`Worker::exec_for`]). Out of line, so that plain runs keep a small
/// instruction loop.
#[cold]
#[inline(never)]
fn count(rec: &mut Recorder, p: &Profiling, regs: &Regs, node: &Node, idx: &[u32]) {
    let site = node.inst.index();
    if matches!(node.kind, Kind::For(_)) {
        return;
    }
    rec.executed(p, site, idx);
    let at = |s: Slot| move |t: usize| regs.at(s, t);
    let access = |rec: &mut Recorder, space: Space, dir: Dir, bytes: u32, p: Slot| match space {
        Space::Global => rec.global(site, dir, idx, at(p), |_| bytes),
        Space::Shared => rec.shared(site, dir, bytes, idx, at(p)),
    };
    match node.kind {
        Kind::Load { space, elem_bytes, lanes, p, .. } => access(rec, space, Dir::Load, elem_bytes * lanes, p),
        Kind::Store { space, elem_bytes, lanes, p, .. } => access(rec, space, Dir::Store, elem_bytes * lanes, p),
        Kind::Atomic { space, bytes, p, .. } => access(rec, space, Dir::Atomic, bytes, p),
        Kind::LdMatrix { count, p, .. } => rec.ldmatrix(site, count, idx, at(p)),
        Kind::CpAsync { size, dst, src, src_size } => {
            // A global load of the bytes read (a `src_size` of 0 reads none) and a shared store.
            let read = |t: usize| src_size.map_or(size, |s| (regs.at(s, t) as u32).min(size));
            rec.global(site, Dir::Load, idx, at(src), read);
            rec.shared(site, Dir::Store, size, idx, at(dst));
        }
        Kind::If(ref f) => rec.branch(site, idx, |t| regs.at(f.cond, t) != 0),
        _ => {}
    }
}

/// A `cp.async` issued and not yet completed: where it lands and the bytes it carries.
struct AsyncCopy {
    inst: InstId,
    offset: usize,
    size: u32,
    data: [u8; 16],
}

/// One thread's `cp.async` groups: the open one, then the committed ones, oldest first.
#[derive(Default)]
struct AsyncGroups {
    open: Vec<AsyncCopy>,
    committed: std::collections::VecDeque<Vec<AsyncCopy>>,
}

/// Runs blocks one after another; one per CPU thread.
pub(crate) struct Worker<'a> {
    launch: &'a Launch<'a>,
    regs: Regs,
    shared: SharedMem,
    ctaid: [u32; 3],
    /// Reusable lane lists for masks.
    pool: Vec<Vec<u32>>,
    /// Scratch for parallel copies of loop-carried values.
    temp: Vec<u64>,
    /// Per thread, its pending `cp.async` copies (empty until a block issues one).
    copies: Vec<AsyncGroups>,
    /// This worker's counts when the launch is profiled (checked once per instruction).
    prof: Option<Box<Recorder>>,
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        if let (Some(p), Some(r)) = (self.launch.profiling, self.prof.take()) {
            p.merge(*r);
        }
    }
}

impl<'a> Worker<'a> {
    pub(crate) fn new(launch: &'a Launch<'a>) -> Worker<'a> {
        let n = launch.n;
        let mut regs = Regs { data: vec![0; launch.prog.nslots * n], n };
        for &(s, bits) in &launch.prog.perm {
            regs.get_mut(s).fill(bits);
        }
        Worker {
            launch,
            regs,
            shared: SharedMem::new(launch.shared_bytes),
            ctaid: [0; 3],
            pool: vec![],
            temp: vec![],
            copies: vec![],
            prof: launch.profiling.as_ref().map(|p| Box::new(p.recorder())),
        }
    }

    pub(crate) fn run_block(&mut self, ctaid: [u32; 3]) -> Result<(), Fault> {
        self.ctaid = ctaid;
        self.shared.start_block();
        // Copies still pending when the previous block's threads exited are dropped.
        for g in &mut self.copies {
            g.open.clear();
            g.committed.clear();
        }
        let launch = self.launch;
        self.exec(&launch.prog.body, Mask::new(&launch.all, launch.n))
    }

    fn take(&mut self) -> Vec<u32> {
        let mut v = self.pool.pop().unwrap_or_default();
        v.clear();
        v
    }

    fn give(&mut self, v: Vec<u32>) {
        self.pool.push(v);
    }

    fn exec(&mut self, block: &'a Block, m: Mask<'_>) -> Result<(), Fault> {
        for node in &block.nodes {
            self.node(node, m)?;
        }
        Ok(())
    }

    fn node(&mut self, node: &'a Node, m: Mask<'_>) -> Result<(), Fault> {
        if let Some(rec) = self.prof.as_deref_mut() {
            // The counts read the instruction's operands, so they come before it runs.
            if let Some(p) = self.launch.profiling {
                count(rec, p, &self.regs, node, m.idx);
            }
        }
        let fault = |(lane, message): (u32, String)| Fault { inst: node.inst, lane, message };
        let regs = &mut self.regs;
        match node.kind {
            Kind::Special { d, reg } => self.special(d, reg),
            Kind::IntUn { op, ty, d, a } => {
                let (d, [a]) = regs.dst(d, [a]);
                with_int!(ty, T => int_un::<T>(op, m, d, a))
            }
            Kind::FloatUn { op, ty, d, a } => {
                let (d, [a]) = regs.dst(d, [a]);
                with_float!(ty, F => float_un::<F>(op, m, d, a))
            }
            Kind::Approx { op, d, a } => {
                let (d, [a]) = regs.dst(d, [a]);
                map1(m, d, a, |x| num::approx(op, x))
            }
            Kind::PredNot { d, a } => {
                let (d, [a]) = regs.dst(d, [a]);
                map1(m, d, a, |x| x ^ 1)
            }
            Kind::IntBin { op, ty, d, a, b } => {
                let (d, [a, b]) = regs.dst(d, [a, b]);
                with_int!(ty, T => int_bin::<T>(op, m, d, a, b))
            }
            Kind::IntDiv { rem, ty, d, a, b } => {
                let (d, [a, b]) = regs.dst(d, [a, b]);
                with_int!(ty, T => int_div::<T>(rem, m, d, a, b)).map_err(|lane| {
                    fault((lane, format!("integer {} by zero", if rem { "remainder" } else { "division" })))
                })?
            }
            Kind::FloatBin { op, ty, d, a, b } => {
                let (d, [a, b]) = regs.dst(d, [a, b]);
                with_float!(ty, F => float_bin::<F>(op, m, d, a, b))
            }
            Kind::PredBin { op, d, a, b } => {
                let (d, [a, b]) = regs.dst(d, [a, b]);
                match op {
                    PredBin::And => map2(m, d, a, b, |x, y| x & y),
                    PredBin::Or => map2(m, d, a, b, |x, y| x | y),
                    PredBin::Xor => map2(m, d, a, b, |x, y| x ^ y),
                }
            }
            Kind::IntFma { ty, d, a, b, c } => {
                let (d, [a, b, c]) = regs.dst(d, [a, b, c]);
                with_int!(ty, T => map3(m, d, a, b, c, |x, y, z| {
                    T::from_lane(x).mul(T::from_lane(y)).add(T::from_lane(z)).to_lane()
                }))
            }
            Kind::FloatFma { ty, d, a, b, c } => {
                let (d, [a, b, c]) = regs.dst(d, [a, b, c]);
                with_float!(ty, F => map3(m, d, a, b, c, |x, y, z| {
                    F::from_lane(x).fma(F::from_lane(y), F::from_lane(z)).canon()
                }))
            }
            Kind::IntCmp { op, ty, d, a, b } => {
                let (d, [a, b]) = regs.dst(d, [a, b]);
                with_int!(ty, T => int_cmp::<T>(op, m, d, a, b))
            }
            Kind::FloatCmp { op, ty, d, a, b } => {
                let (d, [a, b]) = regs.dst(d, [a, b]);
                with_float!(ty, F => float_cmp::<F>(op, m, d, a, b))
            }
            Kind::PredCmp { eq, d, a, b } => {
                let (d, [a, b]) = regs.dst(d, [a, b]);
                map2(m, d, a, b, |x, y| ((x == y) == eq) as u64)
            }
            Kind::Select { d, c, a, b } => {
                let (d, [c, a, b]) = regs.dst(d, [c, a, b]);
                map3(m, d, c, a, b, |c, a, b| if c != 0 { a } else { b })
            }
            Kind::Cvt { conv, d, a } => {
                let (d, [a]) = regs.dst(d, [a]);
                cvt(conv, m, d, a)
            }
            Kind::Copy { d, a } => {
                let (d, [a]) = regs.dst(d, [a]);
                if m.dense {
                    d.copy_from_slice(a)
                } else {
                    copy_masked(m, d, a)
                }
            }
            Kind::PtrAdd { ext, scale, wrap32, d, p, i } => {
                let (d, [p, i]) = regs.dst(d, [p, i]);
                ptr_add(ext, scale, wrap32, m, d, p, i)
            }
            Kind::Load { space, elem_bytes, lanes, d, p } => {
                self.load(space, elem_bytes, lanes, d, p, m).map_err(fault)?
            }
            Kind::Store { space, elem_bytes, lanes, p, v } => {
                self.store(space, elem_bytes, lanes, p, v, m).map_err(fault)?
            }
            Kind::Atomic { space, f, bytes, d, p, v, cmp } => {
                self.atomic(space, f, bytes, d, p, v, cmp, m).map_err(fault)?
            }
            Kind::Barrier => self.barrier(m).map_err(fault)?,
            Kind::Shfl { mode, d, v, lane } => self.shfl(mode, d, v, lane, m).map_err(fault)?,
            Kind::Vote { mode, d, p } => self.vote(mode, d, p, m).map_err(fault)?,
            Kind::Mma { ty, d, a, b, c } => self.mma(ty, d, a, b, c, m).map_err(fault)?,
            Kind::LdMatrix { count, trans, d, p } => self.ldmatrix(count, trans, d, p, m).map_err(fault)?,
            Kind::CpAsync { size, dst, src, src_size } => {
                self.cp_async(node.inst, size, dst, src, src_size, m).map_err(fault)?
            }
            Kind::CpAsyncCommit => self.cp_async_commit(m),
            Kind::CpAsyncWait { n } => self.cp_async_wait(n, m).map_err(fault)?,
            Kind::If(ref f) => self.exec_if(f, m)?,
            Kind::For(ref f) => self.exec_for(node.inst, f, m)?,
        }
        Ok(())
    }

    fn special(&mut self, d: Slot, reg: SpecialReg) {
        let (launch, ctaid) = (self.launch, self.ctaid);
        let d = self.regs.get_mut(d);
        let mut fill = |v: u32| d.fill(v as u64);
        match reg {
            SpecialReg::TidX => d.copy_from_slice(&launch.tid[0]),
            SpecialReg::TidY => d.copy_from_slice(&launch.tid[1]),
            SpecialReg::TidZ => d.copy_from_slice(&launch.tid[2]),
            SpecialReg::LaneId => d.copy_from_slice(&launch.laneid),
            SpecialReg::NtidX => fill(launch.block[0]),
            SpecialReg::NtidY => fill(launch.block[1]),
            SpecialReg::NtidZ => fill(launch.block[2]),
            SpecialReg::CtaidX => fill(ctaid[0]),
            SpecialReg::CtaidY => fill(ctaid[1]),
            SpecialReg::CtaidZ => fill(ctaid[2]),
            SpecialReg::NctaidX => fill(launch.grid[0]),
            SpecialReg::NctaidY => fill(launch.grid[1]),
            SpecialReg::NctaidZ => fill(launch.grid[2]),
        }
    }

    fn race(&self, lane: u32, write: bool, c: Conflict) -> (u32, String) {
        let block = self.launch.block;
        let message = format!(
            "shared-memory race on byte {} of shared memory: thread {:?} {} it and thread {:?} {} it with no barrier in between",
            c.offset,
            thread_of(block, lane),
            if write { "writes" } else { "reads" },
            thread_of(block, c.other as u32),
            if c.other_wrote { "wrote" } else { "read" },
        );
        (lane, message)
    }

    /// The offset of thread `t`'s shared access of `size` bytes at `addr`: in bounds, aligned,
    /// and touching no byte a pending `cp.async` will write.
    fn shared_at(&self, t: u32, addr: u64, size: u32, access: &str) -> Result<usize, (u32, String)> {
        let off = self.shared.locate(addr, size, access).map_err(|e| (t, e))?;
        match self.shared.pending_at(off, size) {
            None => Ok(off),
            Some((byte, owner)) => {
                let site = self.copies[owner as usize]
                    .committed
                    .iter()
                    .flatten()
                    .chain(&self.copies[owner as usize].open)
                    .find(|c| (c.offset..c.offset + c.size as usize).contains(&byte))
                    .and_then(|c| self.launch.prog.cp_async_sites.get(&c.inst))
                    .map_or("`cp.async`", String::as_str);
                Err((
                    t,
                    format!(
                        "shared {access} touches byte {byte} of shared memory, the destination of a {site} by thread {:?} \
                         that is still pending: it lands only when that thread's `cp.async.wait_group` waits for its group",
                        thread_of(self.launch.block, owner as u32)
                    ),
                ))
            }
        }
    }

    fn load(&mut self, space: Space, eb: u32, lanes: u32, d: Slot, p: Slot, m: Mask<'_>) -> LaneResult {
        let size = eb * lanes;
        for &t in m.idx {
            let i = t as usize;
            let addr = self.regs.at(p, i);
            match space {
                Space::Global => {
                    let ptr = self.launch.global.locate(addr, size, "load").map_err(|e| (t, e))?;
                    for j in 0..lanes {
                        // SAFETY: `locate` checked the whole access.
                        let v = unsafe { memory::read(ptr.add((j * eb) as usize), eb) };
                        self.regs.set(d + j, i, v);
                    }
                }
                Space::Shared => {
                    let off = self.shared_at(t, addr, size, "load")?;
                    self.shared.track(off, size, t as u16, false).map_err(|c| self.race(t, false, c))?;
                    for j in 0..lanes {
                        let v = self.shared.read(off + (j * eb) as usize, eb);
                        self.regs.set(d + j, i, v);
                    }
                }
            }
        }
        Ok(())
    }

    fn store(&mut self, space: Space, eb: u32, lanes: u32, p: Slot, v: Slot, m: Mask<'_>) -> LaneResult {
        let size = eb * lanes;
        for &t in m.idx {
            let i = t as usize;
            let addr = self.regs.at(p, i);
            match space {
                Space::Global => {
                    let ptr = self.launch.global.locate(addr, size, "store").map_err(|e| (t, e))?;
                    for j in 0..lanes {
                        // SAFETY: `locate` checked the whole access.
                        unsafe { memory::write(ptr.add((j * eb) as usize), eb, self.regs.at(v + j, i)) };
                    }
                }
                Space::Shared => {
                    let off = self.shared_at(t, addr, size, "store")?;
                    self.shared.track(off, size, t as u16, true).map_err(|c| self.race(t, true, c))?;
                    for j in 0..lanes {
                        self.shared.write(off + (j * eb) as usize, eb, self.regs.at(v + j, i));
                    }
                }
            }
        }
        Ok(())
    }

    /// Atomics apply lane by lane in thread order: global ones as real atomic read-modify-writes
    /// (blocks run in parallel), shared ones directly (one block runs on one CPU thread).
    /// Atomics are exempt from race detection.
    #[allow(clippy::too_many_arguments)]
    fn atomic(
        &mut self,
        space: Space,
        f: AtomFn,
        bytes: u32,
        d: Slot,
        p: Slot,
        v: Slot,
        cmp: Option<Slot>,
        m: Mask<'_>,
    ) -> LaneResult {
        for &t in m.idx {
            let i = t as usize;
            let (addr, value) = (self.regs.at(p, i), self.regs.at(v, i));
            let expected = cmp.map_or(0, |c| self.regs.at(c, i));
            let apply = |old| atomic_apply(f, old, value, expected);
            let old = match space {
                Space::Global => {
                    let ptr = self.launch.global.locate(addr, bytes, "atomic").map_err(|e| (t, e))?;
                    // SAFETY: `locate` checked the access.
                    unsafe { memory::rmw(ptr, bytes, apply) }
                }
                Space::Shared => {
                    let off = self.shared_at(t, addr, bytes, "atomic")?;
                    let old = self.shared.read(off, bytes);
                    self.shared.write(off, bytes, apply(old));
                    old
                }
            };
            self.regs.set(d, i, old);
        }
        Ok(())
    }

    fn barrier(&mut self, m: Mask<'_>) -> LaneResult {
        if !m.full {
            // Lanes are sorted, so the first index that differs from its position is missing.
            let missing = m.idx.iter().enumerate().position(|(i, &t)| i as u32 != t).unwrap_or(m.idx.len());
            return Err((
                m.idx[0],
                format!(
                    "divergent barrier: {} of the block's {} threads reach it; thread {:?} does not",
                    m.idx.len(),
                    self.launch.n,
                    thread_of(self.launch.block, missing as u32)
                ),
            ));
        }
        self.shared.barrier();
        Ok(())
    }

    /// Warp operations use the full member mask: every warp with an active lane must have all
    /// 32 lanes active (and so exist in full).
    fn check_warps(&self, m: Mask<'_>) -> LaneResult {
        let n = self.launch.n;
        let mut i = 0;
        while i < m.idx.len() {
            let t = m.idx[i] as usize;
            let w0 = t - t % 32;
            if t != w0 || m.idx.get(i + 31) != Some(&(w0 as u32 + 31)) {
                let active = m.idx[i..].iter().take_while(|&&u| (u as usize) < w0 + 32).count();
                let hint =
                    if n & 31 != 0 { "; warp operations need a block size that is a multiple of 32" } else { "" };
                return Err((
                    t as u32,
                    format!(
                        "warp operation with inactive lanes: warp {} has {active} of its 32 lanes active (block of {n} threads){hint}",
                        w0 / 32
                    ),
                ));
            }
            i += 32;
        }
        Ok(())
    }

    /// `shfl.sync` with c = 0x1f (bfly, down, idx) or c = 0 (up): the lane operand counts
    /// modulo 32 (PTX uses its bits 4:0), and a source outside the warp leaves the own value.
    fn shfl(&mut self, mode: ShflMode, d: Slot, v: Slot, lane: Slot, m: Mask<'_>) -> LaneResult {
        self.check_warps(m)?;
        let (d, [v, lane]) = self.regs.dst(d, [v, lane]);
        for warp in m.idx.chunks_exact(32) {
            let w0 = warp[0] as usize;
            for l in 0..32 {
                let b = (lane[w0 + l] & 31) as usize;
                let src = match mode {
                    ShflMode::Idx => b,
                    ShflMode::Bfly => l ^ b,
                    ShflMode::Down if l + b < 32 => l + b,
                    ShflMode::Up if l >= b => l - b,
                    ShflMode::Down | ShflMode::Up => l,
                };
                d[w0 + l] = v[w0 + src];
            }
        }
        Ok(())
    }

    fn vote(&mut self, mode: VoteMode, d: Slot, p: Slot, m: Mask<'_>) -> LaneResult {
        self.check_warps(m)?;
        let (d, [p]) = self.regs.dst(d, [p]);
        for warp in m.idx.chunks_exact(32) {
            let w0 = warp[0] as usize;
            let ballot = (0..32).fold(0u32, |acc, l| acc | (((p[w0 + l] != 0) as u32) << l));
            let r = match mode {
                VoteMode::All => (ballot == u32::MAX) as u64,
                VoteMode::Any => (ballot != 0) as u64,
                VoteMode::Ballot => ballot as u64,
            };
            d[w0..w0 + 32].fill(r);
        }
        Ok(())
    }

    /// `mma.m16n8k16` per warp ([`num::mma_m16n8k16`]).
    fn mma(&mut self, ty: MmaType, d: Slot, a: Slot, b: Slot, c: Slot, m: Mask<'_>) -> LaneResult {
        self.check_warps(m)?;
        for w in 0..m.idx.len() / 32 {
            let w0 = m.idx[w * 32] as usize;
            let (mut fa, mut fb, mut fc) = ([[0u32; 4]; 32], [[0u32; 2]; 32], [[0u32; 4]; 32]);
            for l in 0..32 {
                let reg = |s: Slot| self.regs.at(s, w0 + l) as u32;
                fa[l] = [0, 1, 2, 3].map(|i| reg(a + i));
                fb[l] = [0, 1].map(|i| reg(b + i));
                fc[l] = [0, 1, 2, 3].map(|i| reg(c + i));
            }
            let fd = num::mma_m16n8k16(ty, &fa, &fb, &fc);
            for (l, regs) in fd.iter().enumerate() {
                for (i, &r) in regs.iter().enumerate() {
                    self.regs.set(d + i as u32, w0 + l, r as u64);
                }
            }
        }
        Ok(())
    }

    /// `ldmatrix.m8n8.b16` per warp: lane `8 * m + r` addresses row `r` of matrix `m` (each
    /// row read counts as that lane's shared access); [`num::ldmatrix_fragments`] distributes.
    fn ldmatrix(&mut self, count: u32, trans: bool, d: Slot, p: Slot, m: Mask<'_>) -> LaneResult {
        self.check_warps(m)?;
        for w in 0..m.idx.len() / 32 {
            let w0 = m.idx[w * 32];
            let mut rows = [[[0u16; 8]; 8]; 4];
            for (mi, mat) in rows.iter_mut().enumerate().take(count as usize) {
                for (r, row) in mat.iter_mut().enumerate() {
                    let t = w0 + (8 * mi + r) as u32;
                    let addr = self.regs.at(p, t as usize);
                    let off = self.shared_at(t, addr, 16, "ldmatrix row")?;
                    self.shared.track(off, 16, t as u16, false).map_err(|c| self.race(t, false, c))?;
                    for (c, v) in row.iter_mut().enumerate() {
                        *v = self.shared.read(off + 2 * c, 2) as u16;
                    }
                }
            }
            let regs = num::ldmatrix_fragments(&rows, count as usize, trans);
            for (l, lane_regs) in regs.iter().enumerate() {
                for (mi, &r) in lane_regs.iter().enumerate().take(count as usize) {
                    self.regs.set(d + mi as u32, w0 as usize + l, r as u64);
                }
            }
        }
        Ok(())
    }

    /// Issue each active thread's `cp.async` (see [`crate::Op::CpAsync`]): check and read the
    /// source now, check and reserve the destination, and add the copy to the open group.
    fn cp_async(
        &mut self,
        inst: InstId,
        size: u32,
        dst: Slot,
        src: Slot,
        src_size: Option<Slot>,
        m: Mask<'_>,
    ) -> LaneResult {
        if self.copies.is_empty() {
            self.copies.resize_with(self.launch.n, AsyncGroups::default);
        }
        for &t in m.idx {
            let i = t as usize;
            let n = src_size.map_or(size as u64, |s| self.regs.at(s, i) as u32 as u64);
            if n > size as u64 {
                return Err((t, format!("`cp.async` source size {n} exceeds the copy size {size}")));
            }
            let off = self.shared_at(t, self.regs.at(dst, i), size, "cp.async destination")?;
            let from = self.regs.at(src, i);
            let mut data = [0u8; 16];
            if n == 0 {
                // Nothing is read, so only the alignment the instruction demands is checked.
                if !from.is_multiple_of(size as u64) {
                    return Err((
                        t,
                        format!("misaligned: `cp.async` source address {from:#x} must be {size}-byte aligned"),
                    ));
                }
            } else {
                let ptr =
                    self.launch.global.locate_span(from, n as u32, size, "cp.async source").map_err(|e| (t, e))?;
                for (j, b) in data.iter_mut().enumerate().take(n as usize) {
                    // SAFETY: `locate_span` checked all `n` bytes.
                    *b = unsafe { memory::read(ptr.add(j), 1) } as u8;
                }
            }
            self.shared.track(off, size, t as u16, true).map_err(|c| self.race(t, true, c))?;
            self.shared.reserve(off, size, t as u16);
            self.copies[i].open.push(AsyncCopy { inst, offset: off, size, data });
        }
        Ok(())
    }

    fn cp_async_commit(&mut self, m: Mask<'_>) {
        if self.copies.is_empty() {
            self.copies.resize_with(self.launch.n, AsyncGroups::default);
        }
        for &t in m.idx {
            let g = &mut self.copies[t as usize];
            let open = std::mem::take(&mut g.open);
            g.committed.push_back(open);
        }
    }

    /// Complete each active thread's committed groups but its `n` most recent: their data
    /// lands, as writes of that thread.
    fn cp_async_wait(&mut self, n: u32, m: Mask<'_>) -> LaneResult {
        if self.copies.is_empty() {
            return Ok(());
        }
        for &t in m.idx {
            while self.copies[t as usize].committed.len() > n as usize {
                let Some(group) = self.copies[t as usize].committed.pop_front() else { break };
                for c in group {
                    self.shared.land(c.offset, &c.data[..c.size as usize]);
                    self.shared.track(c.offset, c.size, t as u16, true).map_err(|e| self.race(t, true, e))?;
                }
            }
        }
        Ok(())
    }

    fn copy_value(&mut self, dst: VSlot, src: VSlot, m: Mask<'_>) {
        for j in 0..dst.width {
            let (d, [s]) = self.regs.dst(dst.base + j, [src.base + j]);
            copy_masked(m, d, s);
        }
    }

    /// Both branches run under their masks (a branch with no lanes is skipped); each writes
    /// its yields into the results for its own lanes.
    fn exec_if(&mut self, f: &'a IfElse, m: Mask<'_>) -> Result<(), Fault> {
        let taken = {
            let c = self.regs.get(f.cond);
            m.idx.iter().filter(|&&t| c[t as usize] != 0).count()
        };
        if taken == m.idx.len() {
            return self.branch(&f.then_block, &f.results, m);
        }
        if taken == 0 {
            return self.branch(&f.else_block, &f.results, m);
        }
        let (mut then_lanes, mut else_lanes) = (self.take(), self.take());
        let c = self.regs.get(f.cond);
        for &t in m.idx {
            if c[t as usize] != 0 {
                then_lanes.push(t);
            } else {
                else_lanes.push(t);
            }
        }
        let n = self.launch.n;
        self.branch(&f.then_block, &f.results, Mask::new(&then_lanes, n))?;
        self.branch(&f.else_block, &f.results, Mask::new(&else_lanes, n))?;
        self.give(then_lanes);
        self.give(else_lanes);
        Ok(())
    }

    fn branch(&mut self, b: &'a Block, results: &[VSlot], m: Mask<'_>) -> Result<(), Fault> {
        self.exec(b, m)?;
        for (&y, &r) in b.yields.iter().zip(results) {
            self.copy_value(r, y, m);
        }
        Ok(())
    }

    /// Iterate while any lane is active; a lane leaves for good once its own `iv < end` fails.
    /// A `for` loop. A lane that enters it with a step of 0 would never leave (the step and
    /// the end are loop-invariant), so that is an error naming the loop instead of a hang.
    fn exec_for(&mut self, inst: InstId, f: &'a ForLoop, m: Mask<'_>) -> Result<(), Fault> {
        let n = self.launch.n;
        self.copy_value(VSlot { base: f.iv, width: 1 }, VSlot { base: f.start, width: 1 }, m);
        for &(init, param) in &f.init {
            self.copy_value(param, init, m);
        }
        let mut live = self.take();
        live.extend_from_slice(m.idx);
        let mut first = true;
        loop {
            let (iv, end) = (self.regs.get(f.iv), self.regs.get(f.end));
            if let (Some(rec), Some(p)) = (self.prof.as_deref_mut(), self.launch.profiling) {
                let site = inst.index();
                rec.executed(p, site, &live);
                with_int!(f.ty, T => rec.branch(site, &live, |t| T::from_lane(iv[t]) < T::from_lane(end[t])));
            }
            with_int!(f.ty, T => live.retain(|&t| T::from_lane(iv[t as usize]) < T::from_lane(end[t as usize])));
            if live.is_empty() {
                break;
            }
            if first {
                first = false;
                let step = self.regs.get(f.step);
                let stuck =
                    with_int!(f.ty, T => live.iter().copied().find(|&t| T::from_lane(step[t as usize]).is_zero()));
                if let Some(lane) = stuck {
                    let message = "the loop's step is 0 where its induction variable is below the end: it never ends";
                    return Err(Fault { inst, lane, message: message.into() });
                }
            }
            let lm = Mask::new(&live, n);
            self.exec(&f.body, lm)?;
            if f.parallel_copy {
                self.parallel_copy(&f.next, lm);
            } else {
                for &(y, p) in &f.next {
                    self.copy_value(p, y, lm);
                }
            }
            let (iv, [step]) = self.regs.dst(f.iv, [f.step]);
            with_int!(f.ty, T => for &t in lm.idx {
                let t = t as usize;
                iv[t] = T::from_lane(iv[t]).add(T::from_lane(step[t])).to_lane();
            });
        }
        self.give(live);
        for &(param, result) in &f.results {
            self.copy_value(result, param, m);
        }
        Ok(())
    }

    /// Copy yields to carried parameters when some yield is itself a carried parameter.
    fn parallel_copy(&mut self, pairs: &[(VSlot, VSlot)], m: Mask<'_>) {
        let n = self.launch.n;
        let mut temp = std::mem::take(&mut self.temp);
        temp.clear();
        for &(y, _) in pairs {
            for j in 0..y.width {
                temp.extend_from_slice(self.regs.get(y.base + j));
            }
        }
        let mut k = 0;
        for &(_, p) in pairs {
            for j in 0..p.width {
                copy_masked(m, self.regs.get_mut(p.base + j), &temp[k * n..(k + 1) * n]);
                k += 1;
            }
        }
        self.temp = temp;
    }
}

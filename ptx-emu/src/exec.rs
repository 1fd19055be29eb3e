//! Execution of a block: each thread runs on its own until it reaches a synchronising
//! instruction (a barrier or a warp-wide operation) or exits; a warp operation completes when
//! every lane of its member mask has reached one, a barrier when the threads it counts have
//! arrived. Threads run in order (warp by warp, lane by lane), so results are deterministic.

use crate::decode::{LOCAL_WINDOW, SHARED_WINDOW};
use crate::memory::{in_space, AsyncCopies, Global, Mem};
use crate::num::*;
use crate::program::*;
use ruda_ir::interp::num::{ldmatrix_fragments, mma_m16n8k16};
use ruda_ir::MmaType;

/// How a thread stopped the launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FaultKind {
    Memory,
    Arithmetic,
    Trap,
    Deadlock,
    StepLimit,
}

/// A runtime error: the thread (linear index in the block), the PTX line and a message.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub(crate) thread: u32,
    pub(crate) line: u32,
    pub(crate) kind: FaultKind,
    pub(crate) message: String,
}

/// Everything blocks of one launch share.
pub(crate) struct Launch<'a> {
    pub(crate) prog: &'a Program,
    pub(crate) global: &'a Global,
    pub(crate) params: &'a [u8],
    pub(crate) block: [u32; 3],
    pub(crate) grid: [u32; 3],
    pub(crate) dyn_bytes: u32,
    pub(crate) shared_bytes: u32,
    /// Backward branches a thread may take before it is reported as not terminating.
    pub(crate) max_loops: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Run,
    Bar { id: u32, count: u32, line: u32 },
    Warp,
    Exit { line: u32 },
}

/// The state of one block; reused for the blocks a CPU thread runs.
pub(crate) struct Worker<'a> {
    l: &'a Launch<'a>,
    n: usize,
    stride: usize,
    regs: Vec<u64>,
    pc: Vec<u32>,
    state: Vec<State>,
    loops: Vec<u64>,
    shared: Vec<u8>,
    local: Vec<u8>,
    copies: AsyncCopies,
    arrivals: [u32; 16],
}

/// `(x, y, z)` of a linear thread index.
pub(crate) fn thread_of(block: [u32; 3], t: u32) -> [u32; 3] {
    [t % block[0], t / block[0] % block[1], t / (block[0] * block[1])]
}

#[inline(always)]
fn canon(t: IntFmt, v: u64) -> u64 {
    if t.signed {
        let s = 64 - t.bits;
        (((v << s) as i64) >> s) as u64
    } else {
        v & t.mask()
    }
}

const U32T: IntFmt = IntFmt { bits: 32, signed: false };

impl<'a> Worker<'a> {
    pub(crate) fn new(l: &'a Launch<'a>) -> Worker<'a> {
        let n = l.block.iter().map(|&d| d as usize).product();
        let stride = l.prog.template.len();
        Worker {
            l,
            n,
            stride,
            regs: vec![0; n * stride],
            pc: vec![0; n],
            state: vec![State::Run; n],
            loops: vec![0; n],
            shared: vec![0; l.shared_bytes as usize],
            local: vec![0; n * l.prog.local_bytes as usize],
            copies: AsyncCopies::new(l.shared_bytes as usize, n),
            arrivals: [0; 16],
        }
    }

    fn reset(&mut self, ctaid: [u32; 3]) {
        let l = self.l;
        let n = self.n;
        for t in 0..n {
            let r = &mut self.regs[t * self.stride..(t + 1) * self.stride];
            r.copy_from_slice(&l.prog.template);
            let tid = thread_of(l.block, t as u32);
            let lane = (t % 32) as u32;
            for &(slot, sp) in &l.prog.specials {
                r[slot as usize] = match sp {
                    Special::Tid(d) => tid[d as usize] as u64,
                    Special::Ntid(d) => l.block[d as usize] as u64,
                    Special::Ctaid(d) => ctaid[d as usize] as u64,
                    Special::Nctaid(d) => l.grid[d as usize] as u64,
                    Special::LaneId => lane as u64,
                    Special::WarpId => (t / 32) as u64,
                    Special::NWarpId => n.div_ceil(32) as u64,
                    Special::LaneMaskEq => 1u64 << lane,
                    Special::LaneMaskLe => ((2u64 << lane) - 1) & 0xffff_ffff,
                    Special::LaneMaskLt => (1u64 << lane) - 1,
                    Special::LaneMaskGe => !((1u64 << lane) - 1) & 0xffff_ffff,
                    Special::LaneMaskGt => !((2u64 << lane) - 1) & 0xffff_ffff,
                    Special::DynamicSmemSize => l.dyn_bytes as u64,
                    Special::TotalSmemSize => l.shared_bytes as u64,
                };
            }
        }
        self.pc.fill(0);
        self.state.fill(State::Run);
        self.loops.fill(0);
        self.shared.fill(0);
        self.local.fill(0);
        self.copies.reset();
        self.arrivals = [0; 16];
    }

    /// Run one block to completion.
    pub(crate) fn run_block(&mut self, ctaid: [u32; 3]) -> Result<(), Fault> {
        self.reset(ctaid);
        let warps = self.n.div_ceil(32);
        loop {
            for w in 0..warps {
                loop {
                    for t in w * 32..((w + 1) * 32).min(self.n) {
                        if self.state[t] == State::Run {
                            self.run_thread(t)?;
                        }
                    }
                    if !self.resolve_warp(w)? {
                        break;
                    }
                }
            }
            if self.state.iter().all(|s| matches!(s, State::Exit { .. })) {
                return Ok(());
            }
            if !self.release_barriers()? {
                return Err(self.deadlock());
            }
        }
    }

    fn fault(&self, t: usize, kind: FaultKind, message: String) -> Fault {
        let line = self.l.prog.code.get(self.pc[t] as usize).map_or(0, |i| i.line);
        Fault { thread: t as u32, line, kind, message }
    }

    // ---- barriers ---------------------------------------------------------------------------

    fn release_barriers(&mut self) -> Result<bool, Fault> {
        let mut released = false;
        for id in 0..16u32 {
            let mut waiting = 0u32;
            let mut expected = None;
            for t in 0..self.n {
                if let State::Bar { id: i, count, .. } = self.state[t] {
                    if i != id {
                        continue;
                    }
                    waiting += 1;
                    match expected {
                        None => expected = Some(count),
                        Some(c) if c != count => {
                            return Err(self.fault(
                                t,
                                FaultKind::Deadlock,
                                format!("threads wait at barrier {id} with different thread counts ({c} and {count})"),
                            ))
                        }
                        Some(_) => {}
                    }
                }
            }
            let Some(expected) = expected else { continue };
            if waiting + self.arrivals[id as usize] >= expected {
                for s in self.state.iter_mut() {
                    if matches!(s, State::Bar { id: i, .. } if *i == id) {
                        *s = State::Run;
                    }
                }
                self.arrivals[id as usize] = 0;
                released = true;
            }
        }
        Ok(released)
    }

    /// Why nothing can proceed: a barrier or warp operation and a thread that never comes.
    fn deadlock(&self) -> Fault {
        let describe = |t: usize| -> String {
            let who = format!("thread {:?}", thread_of(self.l.block, t as u32));
            let line = self.l.prog.code.get(self.pc[t] as usize).map_or(0, |i| i.line);
            match self.state[t] {
                State::Exit { line } => format!("{who} has exited (line {line})"),
                State::Bar { id, line, .. } => format!("{who} waits at barrier {id} (line {line})"),
                State::Warp => format!("{who} waits at a warp operation (line {line})"),
                State::Run => format!("{who} is running"),
            }
        };
        if let Some((t, id, count, line)) = (0..self.n).find_map(|t| match self.state[t] {
            State::Bar { id, count, line } => Some((t, id, count, line)),
            _ => None,
        }) {
            let arrived = self.state.iter().filter(|s| matches!(s, State::Bar { id: i, .. } if *i == id)).count();
            let expected = if count == u32::MAX { self.n as u32 } else { count };
            let missing = (0..self.n).find(|&u| !matches!(self.state[u], State::Bar { id: i, .. } if i == id));
            let why = missing.map_or_else(String::new, |u| format!("; {}", describe(u)));
            return Fault {
                thread: t as u32,
                line,
                kind: FaultKind::Deadlock,
                message: format!(
                    "deadlock: barrier {id} waits for {expected} threads, {arrived} of the block's {} arrived{why}",
                    self.n
                ),
            };
        }
        let t = (0..self.n).find(|&t| self.state[t] == State::Warp).unwrap_or(0);
        let lo = t - t % 32;
        let why = self.warp_inst(t).and_then(|(op, m)| {
            let mask = self.reg(t, m) as u32;
            (0..32).filter(|k| mask & (1 << k) != 0).map(|k| lo + k).find_map(|u| match self.state[u] {
                State::Warp if self.compatible(u, &op, mask) => None,
                State::Warp => {
                    let line = self.l.prog.code.get(self.pc[u] as usize).map_or(0, |i| i.line);
                    Some(format!(
                        "; lane {} of its member mask {mask:#010x} waits at another warp operation (line {line})",
                        u - lo
                    ))
                }
                _ => Some(format!("; {}", describe(u))),
            })
        });
        let why = why.unwrap_or_default();
        self.fault(t, FaultKind::Deadlock, format!("deadlock: a warp operation cannot complete{why}"))
    }

    // ---- warp operations --------------------------------------------------------------------

    fn warp_inst(&self, t: usize) -> Option<(WarpOp, R)> {
        match self.l.prog.code.get(self.pc[t] as usize).map(|i| &i.op) {
            Some(Op::Warp { op, mask }) => Some((*op, *mask)),
            _ => None,
        }
    }

    #[inline(always)]
    fn reg(&self, t: usize, r: R) -> u64 {
        self.regs[t * self.stride + r as usize]
    }

    #[inline(always)]
    fn set(&mut self, t: usize, r: R, v: u64) {
        self.regs[t * self.stride + r as usize] = v;
    }

    /// Complete one group of lanes of warp `w` that all wait at warp operations; false when
    /// no group can complete.
    fn resolve_warp(&mut self, w: usize) -> Result<bool, Fault> {
        let lo = w * 32;
        let hi = (lo + 32).min(self.n);
        let mut considered = 0u32;
        for t in lo..hi {
            let bit = 1u32 << (t - lo);
            if self.state[t] != State::Warp || considered & bit != 0 {
                continue;
            }
            let Some((op, mask_reg)) = self.warp_inst(t) else {
                return Err(self.fault(
                    t,
                    FaultKind::Trap,
                    "internal: a waiting thread is not at a warp operation".into(),
                ));
            };
            let mask = self.reg(t, mask_reg) as u32;
            if mask & bit == 0 {
                return Err(self.fault(
                    t,
                    FaultKind::Deadlock,
                    format!("lane {} executes a warp operation whose member mask {mask:#010x} excludes it", t - lo),
                ));
            }
            let mut ready = true;
            let mut group = bit;
            for k in 0..32 {
                if mask & (1 << k) == 0 {
                    continue;
                }
                let u = lo + k;
                if u >= hi {
                    return Err(self.fault(
                        t,
                        FaultKind::Deadlock,
                        format!(
                            "deadlock: member mask {mask:#010x} names lane {k}, which does not exist (block of {} threads)",
                            self.n
                        ),
                    ));
                }
                match self.state[u] {
                    // A lane at another warp operation may still complete it with its own
                    // group first; if nothing can, the block reports a deadlock.
                    State::Warp if self.compatible(u, &op, mask) => group |= 1 << k,
                    State::Warp => ready = false,
                    State::Exit { line } => {
                        return Err(self.fault(
                            t,
                            FaultKind::Deadlock,
                            format!("deadlock: lane {k} of member mask {mask:#010x} has exited (line {line})"),
                        ))
                    }
                    State::Bar { .. } | State::Run => ready = false,
                }
            }
            // Lanes of this group need not be looked at again; the others lead their own.
            considered |= group;
            if ready {
                self.complete(lo, mask)?;
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Whether lane `u` waits at a warp operation that can complete together with `op`.
    fn compatible(&self, u: usize, op: &WarpOp, mask: u32) -> bool {
        self.warp_inst(u).is_some_and(|(other, m)| other.same_kind(op) && self.reg(u, m) as u32 == mask)
    }

    fn complete(&mut self, lo: usize, mask: u32) -> Result<(), Fault> {
        let members: Vec<usize> = (0..32).filter(|k| mask & (1 << k) != 0).collect();
        let ops: Vec<WarpOp> =
            members.iter().map(|&k| self.warp_inst(lo + k).map_or(WarpOp::Sync, |(op, _)| op)).collect();
        match ops[0] {
            WarpOp::Shfl { .. } => {
                let mut vals = [0u64; 32];
                for (&k, op) in members.iter().zip(&ops) {
                    if let WarpOp::Shfl { a, .. } = op {
                        vals[k] = self.reg(lo + k, *a) & 0xffff_ffff;
                    }
                }
                for (&k, op) in members.iter().zip(&ops) {
                    let WarpOp::Shfl { mode, d, p, b, c, .. } = *op else { continue };
                    let t = lo + k;
                    let (bv, cv) = (self.reg(t, b) as u32, self.reg(t, c) as u32);
                    let lane = k as i32;
                    let bval = (bv & 0x1f) as i32;
                    let cval = (cv & 0x1f) as i32;
                    let seg = ((cv >> 8) & 0x1f) as i32;
                    let max_lane = (lane & seg) | (cval & !seg);
                    let min_lane = lane & seg;
                    let (j, ok) = match mode {
                        ShflMode::Up => (lane - bval, lane - bval >= max_lane),
                        ShflMode::Down => (lane + bval, lane + bval <= max_lane),
                        ShflMode::Bfly => (lane ^ bval, (lane ^ bval) <= max_lane),
                        ShflMode::Idx => {
                            let j = min_lane | (bval & !seg);
                            (j, j <= max_lane)
                        }
                    };
                    let src = if ok { j as usize } else { k };
                    if mask & (1 << src) == 0 {
                        return Err(self.fault(
                            t,
                            FaultKind::Deadlock,
                            format!("shfl.sync reads lane {src}, which is not in member mask {mask:#010x}"),
                        ));
                    }
                    self.set(t, d, vals[src]);
                    self.set(t, p, ok as u64);
                }
            }
            WarpOp::Vote { .. } => {
                let mut ballot = 0u32;
                for (&k, op) in members.iter().zip(&ops) {
                    if let WarpOp::Vote { a, neg, .. } = *op {
                        if (self.reg(lo + k, a) != 0) != neg {
                            ballot |= 1 << k;
                        }
                    }
                }
                for (&k, op) in members.iter().zip(&ops) {
                    let WarpOp::Vote { mode, d, .. } = *op else { continue };
                    let r = match mode {
                        VoteMode::All => (ballot == mask) as u64,
                        VoteMode::Any => (ballot != 0) as u64,
                        VoteMode::Uni => (ballot == 0 || ballot == mask) as u64,
                        VoteMode::Ballot => ballot as u64,
                    };
                    self.set(lo + k, d, r);
                }
            }
            WarpOp::Redux { op, signed, .. } => {
                let mut acc: Option<u32> = None;
                for (&k, wop) in members.iter().zip(&ops) {
                    if let WarpOp::Redux { a, .. } = *wop {
                        let x = self.reg(lo + k, a) as u32;
                        acc = Some(match acc {
                            None => x,
                            Some(y) => match op {
                                ReduxOp::Add => y.wrapping_add(x),
                                ReduxOp::Min if signed => (y as i32).min(x as i32) as u32,
                                ReduxOp::Max if signed => (y as i32).max(x as i32) as u32,
                                ReduxOp::Min => y.min(x),
                                ReduxOp::Max => y.max(x),
                                ReduxOp::And => y & x,
                                ReduxOp::Or => y | x,
                                ReduxOp::Xor => y ^ x,
                            },
                        });
                    }
                }
                let t = if signed { IntFmt { bits: 32, signed: true } } else { U32T };
                for (&k, wop) in members.iter().zip(&ops) {
                    if let WarpOp::Redux { d, .. } = *wop {
                        self.set(lo + k, d, canon(t, acc.unwrap_or(0) as u64));
                    }
                }
            }
            WarpOp::Mma { bf16, .. } => {
                if members.len() != 32 {
                    return Err(self.fault(
                        lo,
                        FaultKind::Trap,
                        "mma.sync.aligned needs all 32 lanes of the warp".into(),
                    ));
                }
                let (mut fa, mut fb, mut fc) = ([[0u32; 4]; 32], [[0u32; 2]; 32], [[0u32; 4]; 32]);
                for (&k, op) in members.iter().zip(&ops) {
                    if let WarpOp::Mma { a, b, c, .. } = *op {
                        fa[k] = a.map(|r| self.reg(lo + k, r) as u32);
                        fb[k] = b.map(|r| self.reg(lo + k, r) as u32);
                        fc[k] = c.map(|r| self.reg(lo + k, r) as u32);
                    }
                }
                let ty = if bf16 { MmaType::BF16 } else { MmaType::F16 };
                let fd = mma_m16n8k16(ty, &fa, &fb, &fc);
                for (&k, op) in members.iter().zip(&ops) {
                    if let WarpOp::Mma { d, .. } = *op {
                        for (r, v) in d.iter().zip(fd[k]) {
                            self.set(lo + k, *r, v as u64);
                        }
                    }
                }
            }
            WarpOp::LdMatrix { count, trans, .. } => {
                if members.len() != 32 {
                    return Err(self.fault(
                        lo,
                        FaultKind::Trap,
                        "ldmatrix.sync.aligned needs all 32 lanes of the warp".into(),
                    ));
                }
                let mut rows = [[[0u16; 8]; 8]; 4];
                for (mi, mat) in rows.iter_mut().enumerate().take(count as usize) {
                    for (r, row) in mat.iter_mut().enumerate() {
                        let t = lo + 8 * mi + r;
                        let WarpOp::LdMatrix { addr, off, .. } = ops[8 * mi + r] else { continue };
                        let a = self.reg(t, addr).wrapping_add(off as u64);
                        if !a.is_multiple_of(16) || a.checked_add(16).is_none_or(|e| e > self.shared.len() as u64) {
                            return Err(self.fault(
                                t,
                                FaultKind::Memory,
                                format!(
                                    "ldmatrix row address {a:#x} must be 16-byte aligned and within the {} bytes of shared memory",
                                    self.shared.len()
                                ),
                            ));
                        }
                        if let Err(m) = self.copies.check(a, 16) {
                            return Err(self.fault(t, FaultKind::Memory, m));
                        }
                        for (c, v) in row.iter_mut().enumerate() {
                            let at = a as usize + 2 * c;
                            *v = u16::from_le_bytes([self.shared[at], self.shared[at + 1]]);
                        }
                    }
                }
                let regs = ldmatrix_fragments(&rows, count as usize, trans);
                for (&k, op) in members.iter().zip(&ops) {
                    if let WarpOp::LdMatrix { d, .. } = *op {
                        for (r, v) in d.iter().zip(regs[k]).take(count as usize) {
                            self.set(lo + k, *r, v as u64);
                        }
                    }
                }
            }
            WarpOp::Sync => {}
        }
        for &k in &members {
            self.pc[lo + k] += 1;
            self.state[lo + k] = State::Run;
        }
        Ok(())
    }

    // ---- one thread -------------------------------------------------------------------------

    /// Run thread `t` until it exits or reaches a synchronising instruction.
    fn run_thread(&mut self, t: usize) -> Result<(), Fault> {
        let l = self.l;
        let code = &l.prog.code;
        let lb = l.prog.local_bytes as usize;
        let Worker { regs, pc, state, loops, shared, local, copies, arrivals, stride, .. } = self;
        let r = &mut regs[t * *stride..(t + 1) * *stride];
        let mut mem =
            Mem { global: l.global, shared, local: &mut local[t * lb..(t + 1) * lb], params: l.params, copies };
        let mut p = pc[t] as usize;
        macro_rules! fault {
            ($kind:expr, $msg:expr) => {{
                pc[t] = p as u32;
                return Err(Fault { thread: t as u32, line: code[p].line, kind: $kind, message: $msg });
            }};
        }
        macro_rules! g {
            ($x:expr) => {
                r[$x as usize]
            };
        }
        loop {
            let inst = &code[p];
            if (r[inst.guard as usize] != 0) == inst.neg {
                p += 1;
                continue;
            }
            match inst.op {
                Op::Mov { d, a, t: ty } => g!(d) = canon(ty, g!(a)),
                Op::Pack { d, parts, n, bits } => {
                    let m = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                    let mut v = 0u64;
                    for k in 0..n as usize {
                        v |= (g!(parts[k]) & m) << (k as u32 * bits as u32);
                    }
                    g!(d) = v;
                }
                Op::Unpack { ds, n, bits, a } => {
                    let m = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                    let v = g!(a);
                    for k in 0..n as usize {
                        g!(ds[k]) = (v >> (k as u32 * bits as u32)) & m;
                    }
                }
                Op::IBin { op, t: ty, d, a, b } => match ibin(op, ty, g!(a), g!(b)) {
                    Some(v) => g!(d) = v,
                    None => fault!(FaultKind::Arithmetic, "integer division by zero".into()),
                },
                Op::MulWide { t: ty, d, a, b } => {
                    let v = ty.value(g!(a)) * ty.value(g!(b));
                    g!(d) = canon(IntFmt { bits: ty.bits * 2, signed: ty.signed }, v as u64);
                }
                Op::IMad { op, t: ty, d, a, b, c } => {
                    g!(d) = match op {
                        Mad::Lo => canon(ty, g!(a).wrapping_mul(g!(b)).wrapping_add(g!(c))),
                        Mad::Hi => {
                            let hi = ibin(IBin::MulHi, ty, g!(a), g!(b)).unwrap_or(0);
                            canon(ty, hi.wrapping_add(g!(c)))
                        }
                        Mad::Wide => {
                            let wide = IntFmt { bits: ty.bits * 2, signed: ty.signed };
                            let v = ty.value(g!(a)) * ty.value(g!(b)) + wide.value(g!(c));
                            canon(wide, v as u64)
                        }
                    }
                }
                Op::IUn { op, t: ty, d, a } => g!(d) = iun(op, ty, g!(a)),
                Op::AddC { sub, cin, cout, t: ty, d, a, b, cc } => {
                    let (x, y) = (g!(a) & ty.mask(), g!(b) & ty.mask());
                    let carry = if cin { g!(cc) & 1 } else { 0 };
                    let (v, out) = if sub {
                        let v = (x as i128) - (y as i128) - carry as i128;
                        (v as u64, (v < 0) as u64)
                    } else {
                        let v = x as u128 + y as u128 + carry as u128;
                        (v as u64, (v >> ty.bits) as u64 & 1)
                    };
                    g!(d) = canon(ty, v);
                    if cout {
                        g!(cc) = out;
                    }
                }
                Op::Bfe { t: ty, d, a, b, c } => g!(d) = canon(ty, bfe(ty, g!(a), g!(b), g!(c))),
                Op::Bfi { bits, d, a, b, c, e } => {
                    let (pos, len) = ((g!(c) & 0xff) as u32, (g!(e) & 0xff) as u32);
                    let mut f = g!(b);
                    for i in 0..len {
                        if pos + i >= bits {
                            break;
                        }
                        let bit = (g!(a) >> i) & 1;
                        f = (f & !(1u64 << (pos + i))) | (bit << (pos + i));
                    }
                    g!(d) = f & if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                }
                Op::Prmt { mode, d, a, b, c } => g!(d) = prmt(mode, g!(a) as u32, g!(b) as u32, g!(c) as u32) as u64,
                Op::Lop3 { d, a, b, c, lut } => {
                    let (x, y, z) = (g!(a) as u32, g!(b) as u32, g!(c) as u32);
                    let mut v = 0u32;
                    for k in 0..8u32 {
                        if lut & (1 << k) != 0 {
                            let xa = if k & 4 != 0 { x } else { !x };
                            let yb = if k & 2 != 0 { y } else { !y };
                            let zc = if k & 1 != 0 { z } else { !z };
                            v |= xa & yb & zc;
                        }
                    }
                    g!(d) = v as u64;
                }
                Op::Shf { left, wrap, d, a, b, c } => {
                    let n = if wrap { (g!(c) & 31) as u32 } else { (g!(c) as u32).min(32) };
                    let v = ((g!(b) & 0xffff_ffff) << 32) | (g!(a) & 0xffff_ffff);
                    g!(d) = if left { ((v << n) >> 32) & 0xffff_ffff } else { (v >> n) & 0xffff_ffff };
                }
                Op::Setp { cmp, t: ty, d, q, a, b, bop, c, cneg } => {
                    let res = compare(cmp, ty, g!(a), g!(b));
                    let other = (g!(c) != 0) != cneg;
                    g!(d) = combine(bop, res, other) as u64;
                    g!(q) = combine(bop, !res, other) as u64;
                }
                Op::Set { cmp, t: ty, float_dst, d, a, b, bop, c, cneg } => {
                    let res = combine(bop, compare(cmp, ty, g!(a), g!(b)), (g!(c) != 0) != cneg);
                    g!(d) = match (res, float_dst) {
                        (false, _) => 0,
                        (true, true) => 0x3f80_0000,
                        (true, false) => 0xffff_ffff,
                    };
                }
                Op::Selp { t: ty, d, a, b, c } => g!(d) = canon(ty, if g!(c) != 0 { g!(a) } else { g!(b) }),
                Op::Slct { t: ty, float_sel, d, a, b, c } => {
                    let take_a = if float_sel { f32::from_lane(g!(c)) >= 0.0 } else { g!(c) as u32 as i32 >= 0 };
                    g!(d) = canon(ty, if take_a { g!(a) } else { g!(b) });
                }
                Op::FBin { op, f, ftz, sat, d, a, b } => g!(d) = fbin(op, f, ftz, sat, g!(a), g!(b)),
                Op::Fma { f, ftz, sat, d, a, b, c } => {
                    g!(d) = match f {
                        FTy::F32 => {
                            let fl = |x: u64| if ftz { flush(x, Fmt::F32) } else { x };
                            let v = f32::from_lane(fl(g!(a)))
                                .mul_add(f32::from_lane(fl(g!(b))), f32::from_lane(fl(g!(c))))
                                .canon();
                            finish32(v, ftz, sat)
                        }
                        FTy::F64 => {
                            let v = f64::from_lane(g!(a)).mul_add(f64::from_lane(g!(b)), f64::from_lane(g!(c))).canon();
                            if sat {
                                clamp01(v, Fmt::F64)
                            } else {
                                v
                            }
                        }
                    }
                }
                Op::FUn { op, f, ftz, d, a } => g!(d) = fun(op, f, ftz, g!(a)),
                Op::Testp { op, f, d, a } => {
                    let (fmt, x) = match f {
                        FTy::F32 => (Fmt::F32, f32::from_lane(g!(a)) as f64),
                        FTy::F64 => (Fmt::F64, f64::from_lane(g!(a))),
                    };
                    g!(d) = match op {
                        0 => x.is_finite(),
                        1 => x.is_infinite(),
                        2 => !x.is_nan(),
                        3 => x.is_nan(),
                        4 => x.is_finite() && x != 0.0 && !is_subnormal(g!(a), fmt),
                        _ => is_subnormal(g!(a), fmt),
                    } as u64;
                }
                Op::Cvt { conv, d, a } => g!(d) = cvt(conv, g!(a)),
                Op::CvtPack { to, relu, d, a, b } => {
                    let one = |x: u64| {
                        let v = float_to_float(x, Fmt::F32, to, Some(Rounding::Rn));
                        if relu {
                            relu_of(v, to)
                        } else {
                            v
                        }
                    };
                    g!(d) = (one(g!(a)) << 16) | one(g!(b));
                }
                Op::Cvta { to, space, d, a } => {
                    let x = g!(a);
                    g!(d) = match (to, space) {
                        (_, Space::Global) => x,
                        (false, Space::Shared) => SHARED_WINDOW.wrapping_add(x),
                        (false, Space::Local) => LOCAL_WINDOW.wrapping_add(x),
                        (true, Space::Shared) => x.wrapping_sub(SHARED_WINDOW),
                        (true, Space::Local) => x.wrapping_sub(LOCAL_WINDOW),
                        _ => x,
                    };
                }
                Op::Isspacep { space, d, a } => g!(d) = in_space(space, g!(a)) as u64,
                Op::Ld { space, signed, size, n, ds, addr, off } => {
                    let base = g!(addr).wrapping_add(off as u64);
                    let total = size as u64 * n as u64;
                    if base % total != 0 {
                        fault!(
                            FaultKind::Memory,
                            format!("misaligned {} load of {total} bytes at {base:#x}", space.name())
                        );
                    }
                    let mut vals = [0u64; 4];
                    for (k, v) in vals.iter_mut().enumerate().take(n as usize) {
                        match mem.load(space, base + k as u64 * size as u64, size as u32) {
                            Ok(x) => *v = x,
                            Err(m) => fault!(FaultKind::Memory, m),
                        }
                    }
                    let ty = IntFmt { bits: size as u32 * 8, signed };
                    for k in 0..n as usize {
                        g!(ds[k]) = canon(ty, vals[k]);
                    }
                }
                Op::St { space, size, n, ss, addr, off } => {
                    let base = g!(addr).wrapping_add(off as u64);
                    let total = size as u64 * n as u64;
                    if base % total != 0 {
                        fault!(
                            FaultKind::Memory,
                            format!("misaligned {} store of {total} bytes at {base:#x}", space.name())
                        );
                    }
                    for k in 0..n as usize {
                        if let Err(m) = mem.store(space, base + k as u64 * size as u64, size as u32, g!(ss[k])) {
                            fault!(FaultKind::Memory, m);
                        }
                    }
                }
                Op::Atom { space, op, t: ty, d, addr, off, b, c } => {
                    let base = g!(addr).wrapping_add(off as u64);
                    let size = match ty {
                        AtomTy::Int(i) => i.bits / 8,
                        AtomTy::Float(f) => f.bits() / 8,
                    };
                    if base % size as u64 != 0 {
                        fault!(
                            FaultKind::Memory,
                            format!("misaligned {} atomic of {size} bytes at {base:#x}", space.name())
                        );
                    }
                    let (bv, cv) = (g!(b), g!(c));
                    let res = mem.rmw(space, base, size, &mut |old| atom_apply(op, ty, old, bv, cv));
                    match res {
                        Ok(old) => {
                            let wt = match ty {
                                AtomTy::Int(i) => i,
                                AtomTy::Float(f) => IntFmt { bits: f.bits(), signed: false },
                            };
                            g!(d) = canon(wt, old);
                        }
                        Err(m) => fault!(FaultKind::Memory, m),
                    }
                }
                Op::CpAsync { dst, doff, src, soff, size, src_size } => {
                    let (to, from) = (g!(dst).wrapping_add(doff as u64), g!(src).wrapping_add(soff as u64));
                    if to % size as u64 != 0 || from % size as u64 != 0 {
                        fault!(FaultKind::Memory, format!("misaligned cp.async of {size} bytes"));
                    }
                    let valid = g!(src_size) as u32 as u64;
                    if valid > size as u64 {
                        fault!(FaultKind::Memory, format!("cp.async source size {valid} exceeds the copy size {size}"));
                    }
                    if to.checked_add(size as u64).is_none_or(|e| e > mem.shared.len() as u64) {
                        let len = mem.shared.len();
                        fault!(FaultKind::Memory, format!("cp.async destination {to:#x} of {size} bytes is outside the {len} bytes of shared memory"));
                    }
                    if let Err(m) = mem.copies.check(to, size as u32) {
                        fault!(FaultKind::Memory, m);
                    }
                    let mut data = [0u8; 16];
                    for (k, b) in data.iter_mut().enumerate().take(valid as usize) {
                        match mem.load(Space::Global, from + k as u64, 1) {
                            Ok(v) => *b = v as u8,
                            Err(m) => fault!(FaultKind::Memory, m),
                        }
                    }
                    mem.copies.issue(t, inst.line, to, &data[..size as usize]);
                }
                Op::CpAsyncCommit => mem.copies.commit(t),
                Op::CpAsyncWait { n } => mem.copies.wait(t, n, mem.shared),
                Op::Bra { target } => {
                    if target as usize <= p {
                        loops[t] += 1;
                        if loops[t] > l.max_loops {
                            fault!(
                                FaultKind::StepLimit,
                                format!("more than {} backward branches: the thread does not terminate", l.max_loops)
                            );
                        }
                    }
                    p = target as usize;
                    continue;
                }
                Op::Exit => {
                    pc[t] = p as u32;
                    state[t] = State::Exit { line: inst.line };
                    return Ok(());
                }
                Op::Bar { id, count, wait } => {
                    let id = g!(id) as u32;
                    let count = if count == R::MAX { u32::MAX } else { g!(count) as u32 };
                    if id >= 16 {
                        fault!(FaultKind::Trap, format!("barrier id {id} (16 exist)"));
                    }
                    if count != u32::MAX && (count == 0 || count % 32 != 0) {
                        fault!(
                            FaultKind::Trap,
                            format!("barrier thread count {count} is not a positive multiple of 32")
                        );
                    }
                    let count = if count == u32::MAX { block_threads(l) as u32 } else { count };
                    if wait {
                        pc[t] = p as u32 + 1;
                        state[t] = State::Bar { id, count, line: inst.line };
                        return Ok(());
                    }
                    arrivals[id as usize] += 1;
                }
                Op::Warp { .. } => {
                    pc[t] = p as u32;
                    state[t] = State::Warp;
                    return Ok(());
                }
                Op::Trap => fault!(FaultKind::Trap, "trap".into()),
                Op::Nop => {}
            }
            p += 1;
        }
    }
}

/// Threads in a block of the launch.
fn block_threads(l: &Launch<'_>) -> u64 {
    l.block.iter().map(|&d| d as u64).product()
}

fn combine(bop: BoolOp, x: bool, y: bool) -> bool {
    match bop {
        BoolOp::None => x,
        BoolOp::And => x && y,
        BoolOp::Or => x || y,
        BoolOp::Xor => x != y,
    }
}

fn ibin(op: IBin, t: IntFmt, a: u64, b: u64) -> Option<u64> {
    let w = t.bits;
    let (x, y) = (t.value(a), t.value(b));
    let v = match op {
        IBin::Add => a.wrapping_add(b),
        IBin::Sub => a.wrapping_sub(b),
        IBin::MulLo => a.wrapping_mul(b),
        IBin::MulHi => {
            if w < 64 {
                ((x * y) >> w) as u64
            } else if t.signed {
                (((a as i64 as i128) * (b as i64 as i128)) >> 64) as u64
            } else {
                (((a as u128) * (b as u128)) >> 64) as u64
            }
        }
        IBin::Div => {
            if y == 0 {
                return None;
            }
            (x / y) as u64
        }
        IBin::Rem => {
            if y == 0 {
                return None;
            }
            (x % y) as u64
        }
        IBin::Min => x.min(y) as u64,
        IBin::Max => x.max(y) as u64,
        IBin::And => a & b,
        IBin::Or => a | b,
        IBin::Xor => a ^ b,
        IBin::Shl => {
            let n = b as u32;
            if n >= w {
                0
            } else {
                a << n
            }
        }
        IBin::Shr => {
            let n = b as u32;
            if t.signed {
                (x >> n.min(w - 1)) as u64
            } else if n >= w {
                0
            } else {
                (x >> n) as u64
            }
        }
        IBin::AddSat => (x + y).clamp(i32::MIN as i128, i32::MAX as i128) as u64,
        IBin::SubSat => (x - y).clamp(i32::MIN as i128, i32::MAX as i128) as u64,
        IBin::Mul24Lo | IBin::Mul24Hi => {
            let ext = |v: u64| if t.signed { ((v << 40) as i64 >> 40) as i128 } else { (v & 0xff_ffff) as i128 };
            let prod = ext(a) * ext(b);
            if op == IBin::Mul24Lo {
                prod as u64
            } else {
                (prod >> 16) as u64
            }
        }
    };
    Some(canon(t, v))
}

fn iun(op: IUn, t: IntFmt, a: u64) -> u64 {
    let w = t.bits;
    let m = t.mask();
    match op {
        IUn::Neg => canon(t, a.wrapping_neg()),
        IUn::Not => canon(t, !a),
        IUn::Abs => canon(t, t.value(a).unsigned_abs() as u64),
        IUn::Cnot => ((a & m) == 0) as u64,
        IUn::Popc => (a & m).count_ones() as u64,
        IUn::Clz => ((a & m).leading_zeros() - (64 - w)) as u64,
        IUn::Brev => (a & m).reverse_bits() >> (64 - w),
        IUn::Bfind | IUn::BfindShift => {
            // The most significant bit that differs from the sign (signed) or is set.
            let v = if t.signed && (t.value(a) < 0) { !a & m } else { a & m };
            if v == 0 {
                0xffff_ffff
            } else {
                let pos = 63 - v.leading_zeros();
                if op == IUn::BfindShift {
                    (w - 1 - pos) as u64
                } else {
                    pos as u64
                }
            }
        }
    }
}

fn bfe(t: IntFmt, a: u64, b: u64, c: u64) -> u64 {
    let w = t.bits as u64;
    let (pos, len) = (b & 0xff, c & 0xff);
    let sbit = if !t.signed || len == 0 { 0 } else { (a >> (pos + len - 1).min(w - 1)) & 1 };
    let mut d = 0u64;
    for i in 0..w {
        let bit = if i < len && pos + i < w { (a >> (pos + i)) & 1 } else { sbit };
        d |= bit << i;
    }
    d
}

fn prmt(mode: PrmtMode, a: u32, b: u32, c: u32) -> u32 {
    let bytes = ((b as u64) << 32) | a as u64;
    let byte = |i: u32| ((bytes >> (i * 8)) & 0xff) as u32;
    let sel = (c & 3) as usize;
    let pick: [u32; 4] = match mode {
        PrmtMode::Default => {
            let mut out = 0u32;
            for i in 0..4 {
                let s = (c >> (4 * i)) & 0xf;
                let mut v = byte(s & 7);
                if s & 8 != 0 {
                    v = if v & 0x80 != 0 { 0xff } else { 0 };
                }
                out |= v << (8 * i);
            }
            return out;
        }
        // Result bytes 0..3 (low first) for each selector value.
        PrmtMode::F4e => [[0, 1, 2, 3], [1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 6]][sel],
        PrmtMode::B4e => [[0, 7, 6, 5], [1, 0, 7, 6], [2, 1, 0, 7], [3, 2, 1, 0]][sel],
        PrmtMode::Rc8 => [[0; 4], [1; 4], [2; 4], [3; 4]][sel],
        PrmtMode::Ecl => [[0, 1, 2, 3], [1, 1, 2, 3], [2, 2, 2, 3], [3, 3, 3, 3]][sel],
        PrmtMode::Ecr => [[0, 0, 0, 0], [0, 1, 1, 1], [0, 1, 2, 2], [0, 1, 2, 3]][sel],
        PrmtMode::Rc16 => [[0, 1, 0, 1], [2, 3, 2, 3], [0, 1, 0, 1], [2, 3, 2, 3]][sel],
    };
    pick.iter().enumerate().fold(0u32, |acc, (i, &s)| acc | (byte(s) << (8 * i)))
}

fn fcmp(cmp: Cmp, x: f64, y: f64) -> bool {
    let nan = x.is_nan() || y.is_nan();
    match cmp {
        Cmp::Eq => x == y,
        Cmp::Ne => !nan && x != y,
        Cmp::Lt => x < y,
        Cmp::Le => x <= y,
        Cmp::Gt => x > y,
        Cmp::Ge => x >= y,
        Cmp::Equ => nan || x == y,
        Cmp::Neu => x != y,
        Cmp::Ltu => nan || x < y,
        Cmp::Leu => nan || x <= y,
        Cmp::Gtu => nan || x > y,
        Cmp::Geu => nan || x >= y,
        Cmp::Num => !nan,
        Cmp::Nan => nan,
        Cmp::Lo | Cmp::Ls | Cmp::Hi | Cmp::Hs => false,
    }
}

fn compare(cmp: Cmp, t: CmpTy, a: u64, b: u64) -> bool {
    match t {
        CmpTy::Int(ti) => {
            let (x, y) = (ti.value(a), ti.value(b));
            let (ux, uy) = (a & ti.mask(), b & ti.mask());
            match cmp {
                Cmp::Eq => x == y,
                Cmp::Ne => x != y,
                Cmp::Lt => x < y,
                Cmp::Le => x <= y,
                Cmp::Gt => x > y,
                Cmp::Ge => x >= y,
                Cmp::Lo => ux < uy,
                Cmp::Ls => ux <= uy,
                Cmp::Hi => ux > uy,
                Cmp::Hs => ux >= uy,
                _ => false,
            }
        }
        CmpTy::F32 { ftz } => {
            let fl = |x: u64| if ftz { flush(x, Fmt::F32) } else { x };
            fcmp(cmp, f32::from_lane(fl(a)) as f64, f32::from_lane(fl(b)) as f64)
        }
        CmpTy::F64 => fcmp(cmp, f64::from_lane(a), f64::from_lane(b)),
    }
}

/// `.sat`: clamp to [0, 1], NaN to +0.
fn clamp01(bits: u64, fmt: Fmt) -> u64 {
    let one = match fmt {
        Fmt::F16 => 0x3c00,
        Fmt::BF16 => 0x3f80,
        Fmt::F32 => 0x3f80_0000,
        Fmt::F64 => 0x3ff0_0000_0000_0000,
    };
    match decode(bits, fmt) {
        Decoded::Nan | Decoded::Zero(_) | Decoded::Inf(true) | Decoded::Finite { neg: true, .. } => 0,
        Decoded::Inf(false) => one,
        Decoded::Finite { .. } => {
            if float_to_f64(bits, fmt) >= 1.0 {
                one
            } else {
                bits
            }
        }
    }
}

fn finish32(v: u64, ftz: bool, sat: bool) -> u64 {
    let v = if ftz { flush(v, Fmt::F32) } else { v };
    if sat {
        clamp01(v, Fmt::F32)
    } else {
        v
    }
}

fn fbin(op: FBin, f: FTy, ftz: bool, sat: bool, a: u64, b: u64) -> u64 {
    match f {
        FTy::F32 => {
            let fl = |x: u64| if ftz { flush(x, Fmt::F32) } else { x };
            let (xa, xb) = (fl(a & 0xffff_ffff), fl(b & 0xffff_ffff));
            let (x, y) = (f32::from_lane(xa), f32::from_lane(xb));
            let v = match op {
                FBin::Add => (x + y).canon(),
                FBin::Sub => (x - y).canon(),
                FBin::Mul => (x * y).canon(),
                FBin::Div | FBin::DivApprox => (x / y).canon(),
                FBin::Min => fmin(x, y),
                FBin::Max => fmax(x, y),
                FBin::MinNan if x.is_nan() || y.is_nan() => Fmt::F32.nan(),
                FBin::MaxNan if x.is_nan() || y.is_nan() => Fmt::F32.nan(),
                FBin::MinNan => fmin(x, y),
                FBin::MaxNan => fmax(x, y),
                FBin::Copysign => (xb & 0x7fff_ffff) | (xa & 0x8000_0000),
            };
            finish32(v, ftz, sat)
        }
        FTy::F64 => {
            let (x, y) = (f64::from_lane(a), f64::from_lane(b));
            let v = match op {
                FBin::Add => (x + y).canon(),
                FBin::Sub => (x - y).canon(),
                FBin::Mul => (x * y).canon(),
                FBin::Div | FBin::DivApprox => (x / y).canon(),
                FBin::Min => fmin(x, y),
                FBin::Max => fmax(x, y),
                FBin::MinNan if x.is_nan() || y.is_nan() => Fmt::F64.nan(),
                FBin::MaxNan if x.is_nan() || y.is_nan() => Fmt::F64.nan(),
                FBin::MinNan => fmin(x, y),
                FBin::MaxNan => fmax(x, y),
                FBin::Copysign => (b & !(1 << 63)) | (a & (1 << 63)),
            };
            if sat {
                clamp01(v, Fmt::F64)
            } else {
                v
            }
        }
    }
}

fn fun(op: FUn, f: FTy, ftz: bool, a: u64) -> u64 {
    match f {
        FTy::F32 => {
            let x = if ftz { flush(a & 0xffff_ffff, Fmt::F32) } else { a & 0xffff_ffff };
            let v = match op {
                FUn::Neg => x ^ 0x8000_0000,
                FUn::Abs => x & 0x7fff_ffff,
                FUn::Sqrt => f32::from_lane(x).sqrt().canon(),
                FUn::Rcp => (1.0 / f32::from_lane(x)).canon(),
                FUn::Approx(ap) => approx32(ap, x),
            };
            if ftz {
                flush(v, Fmt::F32)
            } else {
                v
            }
        }
        FTy::F64 => {
            // `.ftz` on the f64 approximations flushes subnormal inputs and results.
            let x = if ftz { flush(a, Fmt::F64) } else { a };
            let v = match op {
                FUn::Neg => x ^ (1 << 63),
                FUn::Abs => x & !(1 << 63),
                FUn::Sqrt => f64::from_lane(x).sqrt().canon(),
                FUn::Rcp => (1.0 / f64::from_lane(x)).canon(),
                FUn::Approx(ap) => approx64(ap, f64::from_lane(x)).canon(),
            };
            if ftz {
                flush(v, Fmt::F64)
            } else {
                v
            }
        }
    }
}

/// `.relu`: negative results become +0, NaN the canonical NaN.
fn relu_of(v: u64, fmt: Fmt) -> u64 {
    match decode(v, fmt) {
        Decoded::Nan => fmt.nan(),
        Decoded::Zero(true) | Decoded::Inf(true) | Decoded::Finite { neg: true, .. } => 0,
        _ => v,
    }
}

fn cvt(conv: Conv, a: u64) -> u64 {
    match conv {
        Conv::IntInt { from, to, sat } => canon(to, int_to_int(a, from, to, sat)),
        Conv::FloatInt { from, to, rnd, ftz } => {
            let x = if ftz && from == Fmt::F32 { flush(a, Fmt::F32) } else { a };
            canon(to, float_to_int(x, from, to, rnd))
        }
        Conv::IntFloat { from, to, rnd, sat } => {
            let v = int_to_float(a, from, to, rnd);
            if sat {
                clamp01(v, to)
            } else {
                v
            }
        }
        Conv::FloatFloat { from, to, rnd, ftz, sat, relu } => {
            let x = if ftz && from == Fmt::F32 { flush(a, Fmt::F32) } else { a };
            let mut v = float_to_float(x, from, to, rnd);
            if ftz && to == Fmt::F32 {
                v = flush(v, Fmt::F32);
            }
            if sat {
                v = clamp01(v, to);
            }
            if relu {
                v = relu_of(v, to);
            }
            v
        }
    }
}

fn atom_apply(op: AtomOp, t: AtomTy, old: u64, b: u64, c: u64) -> u64 {
    match t {
        AtomTy::Int(ti) => {
            let (x, y) = (ti.value(old), ti.value(b));
            let m = ti.mask();
            match op {
                AtomOp::Add => old.wrapping_add(b) & m,
                AtomOp::Inc => {
                    if (old & m) >= (b & m) {
                        0
                    } else {
                        (old + 1) & m
                    }
                }
                AtomOp::Dec => {
                    if old & m == 0 || (old & m) > (b & m) {
                        b & m
                    } else {
                        (old - 1) & m
                    }
                }
                AtomOp::Min => (x.min(y) as u64) & m,
                AtomOp::Max => (x.max(y) as u64) & m,
                AtomOp::And => old & b & m,
                AtomOp::Or => (old | b) & m,
                AtomOp::Xor => (old ^ b) & m,
                AtomOp::Exch => b & m,
                AtomOp::Cas => {
                    if old & m == b & m {
                        c & m
                    } else {
                        old
                    }
                }
            }
        }
        AtomTy::Float(fmt) => match (op, fmt) {
            (AtomOp::Add, Fmt::F32) => (f32::from_lane(old) + f32::from_lane(b)).canon(),
            (AtomOp::Add, Fmt::F64) => (f64::from_lane(old) + f64::from_lane(b)).canon(),
            // Half sums are exact in f64, so one rounding gives the correctly rounded result.
            (AtomOp::Add, half) => {
                let s = float_to_f64(old, half) + float_to_f64(b, half);
                float_to_float(s.canon(), Fmt::F64, half, Some(Rounding::Rn))
            }
            (AtomOp::Min, Fmt::F32) => fmin(f32::from_lane(old), f32::from_lane(b)),
            (AtomOp::Max, Fmt::F32) => fmax(f32::from_lane(old), f32::from_lane(b)),
            (AtomOp::Min, _) => fmin(f64::from_lane(old), f64::from_lane(b)),
            (AtomOp::Max, _) => fmax(f64::from_lane(old), f64::from_lane(b)),
            _ => b,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prmt_default_and_sign_replication() {
        assert_eq!(prmt(PrmtMode::Default, 0x4433_2211, 0x8877_6655, 0x3210), 0x4433_2211);
        assert_eq!(prmt(PrmtMode::Default, 0x4433_2211, 0x8877_6655, 0x7654), 0x8877_6655);
        assert_eq!(prmt(PrmtMode::Default, 0x4433_2211, 0x8877_6655, 0x000f), 0x1111_11ff);
        assert_eq!(prmt(PrmtMode::Rc8, 0x4433_2211, 0, 2), 0x3333_3333);
    }

    #[test]
    fn bit_fields() {
        let s32 = IntFmt { bits: 32, signed: true };
        let u32t = IntFmt { bits: 32, signed: false };
        assert_eq!(bfe(u32t, 0xf0, 4, 4), 0xf);
        assert_eq!(bfe(s32, 0xf0, 4, 4), 0xffff_ffff);
        assert_eq!(bfe(s32, 0x70, 4, 4), 7);
        assert_eq!(iun(IUn::Bfind, u32t, 0x10), 4);
        assert_eq!(iun(IUn::Bfind, s32, 0xffff_fff0), 3);
        assert_eq!(iun(IUn::Bfind, u32t, 0), 0xffff_ffff);
        assert_eq!(iun(IUn::Brev, u32t, 1), 0x8000_0000);
        assert_eq!(iun(IUn::Clz, IntFmt { bits: 64, signed: false }, 1), 63);
    }

    #[test]
    fn shifts_clamp_and_division_wraps() {
        let s32 = IntFmt { bits: 32, signed: true };
        let u16t = IntFmt { bits: 16, signed: false };
        assert_eq!(ibin(IBin::Shr, s32, 0x8000_0000, 40), Some(u64::MAX));
        assert_eq!(ibin(IBin::Shl, u16t, 1, 16), Some(0));
        assert_eq!(ibin(IBin::Div, s32, i32::MIN as u64, u64::MAX), Some(i32::MIN as u64));
        assert_eq!(ibin(IBin::Rem, s32, 7, 0), None);
        assert_eq!(ibin(IBin::MulHi, IntFmt { bits: 64, signed: false }, u64::MAX, 2), Some(1));
    }
}

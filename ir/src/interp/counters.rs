//! Counters of a profiled launch ([`super::run_profiled`]): what one warp-level execution of
//! each instruction costs, by the definitions of the module docs' "Counters" section. The pure
//! functions here (sectors, bank groups) take one warp's accesses; the executor calls the
//! [`Recorder`] only when a launch is profiled.

use std::sync::Mutex;

use super::memory::BUFFER_SHIFT;
use crate::kernel::{BinaryOp, InstId, Kernel, Loc, Op};
use crate::types::{ScalarType, Type};

/// Counts of a launch or of one instruction site. Each memory count is per warp-level
/// execution by the warp's active lanes (see the module docs' "Counters" section).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub global_load_requests: u64,
    pub global_load_sectors: u64,
    pub global_store_requests: u64,
    pub global_store_sectors: u64,
    pub global_atomic_requests: u64,
    pub global_atomic_sectors: u64,
    /// The IR has no local memory (values live in registers), so the interpreter never counts
    /// local accesses; the fields exist so that reports have one shape for every source.
    pub local_load_requests: u64,
    pub local_load_sectors: u64,
    pub local_store_requests: u64,
    pub local_store_sectors: u64,
    pub shared_load_requests: u64,
    pub shared_load_wavefronts: u64,
    pub shared_load_bank_conflicts: u64,
    pub shared_store_requests: u64,
    pub shared_store_wavefronts: u64,
    pub shared_store_bank_conflicts: u64,
    pub shared_atomic_requests: u64,
    pub divergent_branches: u64,
    /// Bytes the active lanes asked for (global, local and shared, atomics included).
    pub bytes_requested: u64,
    /// The part of `bytes_requested` that global loads (`cp.async`'s source included) and
    /// global stores asked for: over `32 ×` their sectors, their sector efficiency.
    pub global_load_bytes_requested: u64,
    pub global_store_bytes_requested: u64,
    /// Global and local sectors × 32: the bytes that go through L1.
    pub bytes_moved: u64,
    pub flops: u64,
    pub instructions: InstructionMix,
}

impl Counters {
    /// Shared-memory bank conflicts of loads and stores together.
    pub fn shared_bank_conflicts(&self) -> u64 {
        self.shared_load_bank_conflicts + self.shared_store_bank_conflicts
    }

    /// Add `other` into `self`, field by field.
    pub fn add(&mut self, other: &Counters) {
        let Counters {
            global_load_requests,
            global_load_sectors,
            global_store_requests,
            global_store_sectors,
            global_atomic_requests,
            global_atomic_sectors,
            local_load_requests,
            local_load_sectors,
            local_store_requests,
            local_store_sectors,
            shared_load_requests,
            shared_load_wavefronts,
            shared_load_bank_conflicts,
            shared_store_requests,
            shared_store_wavefronts,
            shared_store_bank_conflicts,
            shared_atomic_requests,
            divergent_branches,
            bytes_requested,
            global_load_bytes_requested,
            global_store_bytes_requested,
            bytes_moved,
            flops,
            instructions,
        } = other;
        self.global_load_requests += global_load_requests;
        self.global_load_sectors += global_load_sectors;
        self.global_store_requests += global_store_requests;
        self.global_store_sectors += global_store_sectors;
        self.global_atomic_requests += global_atomic_requests;
        self.global_atomic_sectors += global_atomic_sectors;
        self.local_load_requests += local_load_requests;
        self.local_load_sectors += local_load_sectors;
        self.local_store_requests += local_store_requests;
        self.local_store_sectors += local_store_sectors;
        self.shared_load_requests += shared_load_requests;
        self.shared_load_wavefronts += shared_load_wavefronts;
        self.shared_load_bank_conflicts += shared_load_bank_conflicts;
        self.shared_store_requests += shared_store_requests;
        self.shared_store_wavefronts += shared_store_wavefronts;
        self.shared_store_bank_conflicts += shared_store_bank_conflicts;
        self.shared_atomic_requests += shared_atomic_requests;
        self.divergent_branches += divergent_branches;
        self.bytes_requested += bytes_requested;
        self.global_load_bytes_requested += global_load_bytes_requested;
        self.global_store_bytes_requested += global_store_bytes_requested;
        self.bytes_moved += bytes_moved;
        self.flops += flops;
        self.instructions.add(instructions);
    }

    /// Every scalar counter by its JSON name, in a stable order (the instruction mix is
    /// [`InstructionMix::fields`]); `shared_bank_conflicts` (load + store) is included.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("global_load_requests", self.global_load_requests),
            ("global_load_sectors", self.global_load_sectors),
            ("global_store_requests", self.global_store_requests),
            ("global_store_sectors", self.global_store_sectors),
            ("global_atomic_requests", self.global_atomic_requests),
            ("global_atomic_sectors", self.global_atomic_sectors),
            ("local_load_requests", self.local_load_requests),
            ("local_load_sectors", self.local_load_sectors),
            ("local_store_requests", self.local_store_requests),
            ("local_store_sectors", self.local_store_sectors),
            ("shared_load_requests", self.shared_load_requests),
            ("shared_load_wavefronts", self.shared_load_wavefronts),
            ("shared_load_bank_conflicts", self.shared_load_bank_conflicts),
            ("shared_store_requests", self.shared_store_requests),
            ("shared_store_wavefronts", self.shared_store_wavefronts),
            ("shared_store_bank_conflicts", self.shared_store_bank_conflicts),
            ("shared_bank_conflicts", self.shared_bank_conflicts()),
            ("shared_atomic_requests", self.shared_atomic_requests),
            ("divergent_branches", self.divergent_branches),
            ("bytes_requested", self.bytes_requested),
            ("global_load_bytes_requested", self.global_load_bytes_requested),
            ("global_store_bytes_requested", self.global_store_bytes_requested),
            ("bytes_moved", self.bytes_moved),
            ("flops", self.flops),
        ]
    }
}

/// Warp-level instructions executed, by class: a warp with at least one active lane counts
/// once (the class rules are in the module docs' "Counters" section).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InstructionMix {
    pub fp32: u64,
    pub fp16_bf16: u64,
    pub fp64: u64,
    pub integer: u64,
    pub mma: u64,
    pub ldmatrix: u64,
    pub cp_async: u64,
    pub shuffles: u64,
    pub barriers: u64,
    pub branches: u64,
    pub memory: u64,
    pub other: u64,
}

impl InstructionMix {
    /// All classes together.
    pub fn total(&self) -> u64 {
        self.fields().iter().map(|(_, n)| n).sum()
    }

    /// Every class by its JSON name, in a stable order (without `total`).
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("fp32", self.fp32),
            ("fp16_bf16", self.fp16_bf16),
            ("fp64", self.fp64),
            ("integer", self.integer),
            ("mma", self.mma),
            ("ldmatrix", self.ldmatrix),
            ("cp_async", self.cp_async),
            ("shuffles", self.shuffles),
            ("barriers", self.barriers),
            ("branches", self.branches),
            ("memory", self.memory),
            ("other", self.other),
        ]
    }

    fn add(&mut self, o: &InstructionMix) {
        self.fp32 += o.fp32;
        self.fp16_bf16 += o.fp16_bf16;
        self.fp64 += o.fp64;
        self.integer += o.integer;
        self.mma += o.mma;
        self.ldmatrix += o.ldmatrix;
        self.cp_async += o.cp_async;
        self.shuffles += o.shuffles;
        self.barriers += o.barriers;
        self.branches += o.branches;
        self.memory += o.memory;
        self.other += o.other;
    }

    fn get_mut(&mut self, class: Class) -> &mut u64 {
        match class {
            Class::Fp32 => &mut self.fp32,
            Class::Fp16Bf16 => &mut self.fp16_bf16,
            Class::Fp64 => &mut self.fp64,
            Class::Integer => &mut self.integer,
            Class::Mma => &mut self.mma,
            Class::LdMatrix => &mut self.ldmatrix,
            Class::CpAsync => &mut self.cp_async,
            Class::Shuffle => &mut self.shuffles,
            Class::Barrier => &mut self.barriers,
            Class::Branch => &mut self.branches,
            Class::Memory => &mut self.memory,
            Class::Other => &mut self.other,
        }
    }
}

/// One instruction's counts over the launch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SiteCounters {
    pub inst: InstId,
    /// The instruction's mnemonic, as errors name it (`ld.shared.f32`, `mma.m16n8k16.f16`).
    pub op: String,
    pub loc: Option<Loc>,
    pub counters: Counters,
}

/// What [`super::run_profiled`] measured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub totals: Counters,
    /// The distinct 32-byte global sectors the whole launch touches (all blocks, loads, stores,
    /// atomics and `cp.async` sources), × 32: traffic no cache can avoid.
    pub dram_bytes_min: u64,
    /// Every instruction that executed at least once, in [`InstId`] order.
    pub sites: Vec<SiteCounters>,
}

/// The instruction classes of [`InstructionMix`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Class {
    Fp32,
    Fp16Bf16,
    Fp64,
    Integer,
    Mma,
    LdMatrix,
    CpAsync,
    Shuffle,
    Barrier,
    Branch,
    Memory,
    Other,
}

/// Flops of one `mma.m16n8k16` (per warp): a multiply and an add per product.
pub(crate) const MMA_FLOPS: u64 = 2 * 16 * 8 * 16;

/// How an instruction counts: its class and its flops per active lane (per warp for `mma`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct SiteKind {
    class: Class,
    flops: u64,
}

/// The class of a float type's arithmetic, or `None` for other types.
fn float_class(t: ScalarType) -> Option<Class> {
    match t {
        ScalarType::F32 => Some(Class::Fp32),
        ScalarType::F16 | ScalarType::BF16 => Some(Class::Fp16Bf16),
        ScalarType::F64 => Some(Class::Fp64),
        _ => None,
    }
}

/// Class and flops of every instruction of `kernel`, by [`InstId`] index.
pub(crate) fn site_kinds(kernel: &Kernel) -> Vec<SiteKind> {
    let scalar = |v: crate::kernel::Value| match kernel.values.get(v.index()).map(|v| v.ty) {
        Some(Type::Scalar(t)) => Some(t),
        _ => None,
    };
    kernel
        .insts
        .iter()
        .map(|inst| {
            let arith = |v, flops: u64| match scalar(v) {
                Some(t) => match float_class(t) {
                    Some(class) => SiteKind { class, flops },
                    None => SiteKind { class: Class::Integer, flops: 0 },
                },
                None => SiteKind { class: Class::Other, flops: 0 },
            };
            let plain = |class| SiteKind { class, flops: 0 };
            match &inst.op {
                Op::Binary(op, a, _) => {
                    let counted = matches!(op, BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul);
                    arith(*a, counted as u64)
                }
                Op::Fma(a, ..) => arith(*a, 2),
                Op::Unary(_, a) | Op::Cmp(_, a, _) => arith(*a, 0),
                Op::PtrAdd(..) => plain(Class::Integer),
                Op::Cvt(a, _) => {
                    let to = inst.results.first().and_then(|&r| scalar(r));
                    let half = |t: Option<ScalarType>| matches!(t, Some(ScalarType::F16 | ScalarType::BF16));
                    plain(if half(scalar(*a)) || half(to) { Class::Fp16Bf16 } else { Class::Other })
                }
                Op::Load { .. } | Op::Store { .. } | Op::Atomic { .. } => plain(Class::Memory),
                Op::Barrier => plain(Class::Barrier),
                Op::Shfl { .. } | Op::Vote { .. } => plain(Class::Shuffle),
                Op::Mma { .. } => SiteKind { class: Class::Mma, flops: MMA_FLOPS },
                Op::LdMatrix { .. } => plain(Class::LdMatrix),
                Op::CpAsync { .. } | Op::CpAsyncCommit | Op::CpAsyncWait(_) => plain(Class::CpAsync),
                Op::If { .. } | Op::For { .. } => plain(Class::Branch),
                Op::Const(_)
                | Op::Special(_)
                | Op::Select(..)
                | Op::Bitcast(..)
                | Op::PtrCast(..)
                | Op::SharedBase(_)
                | Op::DynSharedBase(_)
                | Op::Extract(..)
                | Op::MakeVector(_) => plain(Class::Other),
            }
        })
        .collect()
}

/// The number of distinct 32-byte-aligned sectors that accesses of `(address, bytes)` touch.
pub(crate) fn sectors(accesses: impl IntoIterator<Item = (u64, u32)>, scratch: &mut Vec<u64>) -> u64 {
    scratch.clear();
    for (addr, bytes) in accesses {
        if bytes > 0 {
            scratch.extend(addr / 32..=(addr + bytes as u64 - 1) / 32);
        }
    }
    scratch.sort_unstable();
    scratch.dedup();
    scratch.len() as u64
}

/// The lanes of one bank group for shared accesses of `bytes` each: the whole warp for at most
/// 4 bytes, half-warps for 8, quarter-warps for 16 (`ldmatrix` rows are 16-byte accesses, so
/// its groups are its matrices).
pub(crate) fn group_lanes(bytes: u32) -> u32 {
    match bytes {
        0..=4 => 32,
        5..=8 => 16,
        _ => 8,
    }
}

/// Wavefronts of one warp's shared accesses `(laneid, offset)` of `bytes` each, and the ideal
/// (the number of groups with an active lane): per group, the most distinct 4-byte words one
/// of the 32 banks holds, at least one.
pub(crate) fn wavefronts(accesses: &[(u32, u32)], bytes: u32, scratch: &mut Vec<u64>) -> (u64, u64) {
    let per_group = group_lanes(bytes);
    let words = bytes.div_ceil(4).max(1);
    let (mut total, mut ideal) = (0, 0);
    for g in 0..32 / per_group {
        scratch.clear();
        for &(_, off) in accesses.iter().filter(|(l, _)| l / per_group == g) {
            let first = off as u64 / 4;
            // (bank, word) pairs, bank in the high bits so that sorting groups them.
            scratch.extend((first..first + words as u64).map(|w| ((w % 32) << 40) | w));
        }
        if scratch.is_empty() {
            continue;
        }
        ideal += 1;
        scratch.sort_unstable();
        scratch.dedup();
        let mut most = 0;
        let mut run = 0;
        let mut bank = u64::MAX;
        for &bw in scratch.iter() {
            if bw >> 40 == bank {
                run += 1;
            } else {
                bank = bw >> 40;
                run = 1;
            }
            most = most.max(run);
        }
        total += most;
    }
    (total, ideal)
}

/// Which counters a memory access adds to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    Load,
    Store,
    Atomic,
}

/// What every worker's [`Recorder`] shares: the site kinds, the buffer sizes, and the sum of
/// the recorders of workers that finished.
pub(crate) struct Profiling {
    kinds: Vec<SiteKind>,
    buffer_sectors: Vec<u64>,
    total: Mutex<Option<Recorder>>,
}

impl Profiling {
    pub(crate) fn new(kernel: &Kernel, buffer_lens: &[usize]) -> Profiling {
        Profiling {
            kinds: site_kinds(kernel),
            buffer_sectors: buffer_lens.iter().map(|&l| (l as u64).div_ceil(32)).collect(),
            total: Mutex::new(None),
        }
    }

    pub(crate) fn recorder(&self) -> Recorder {
        Recorder {
            sites: vec![Counters::default(); self.kinds.len()],
            touched: self.buffer_sectors.iter().map(|&n| vec![0u64; n.div_ceil(64) as usize]).collect(),
            scratch: vec![],
            pairs: vec![],
        }
    }

    /// Add a worker's counts to the launch's.
    pub(crate) fn merge(&self, r: Recorder) {
        let mut total = self.total.lock().unwrap_or_else(|e| e.into_inner());
        match total.as_mut() {
            None => *total = Some(r),
            Some(t) => {
                for (a, b) in t.sites.iter_mut().zip(&r.sites) {
                    a.add(b);
                }
                for (a, b) in t.touched.iter_mut().zip(&r.touched) {
                    for (x, y) in a.iter_mut().zip(b) {
                        *x |= y;
                    }
                }
            }
        }
    }

    /// The launch's profile from the merged recorders.
    pub(crate) fn finish(self, kernel: &Kernel) -> Profile {
        let Some(total) = self.total.into_inner().unwrap_or_else(|e| e.into_inner()) else {
            // No worker ran, so nothing executed.
            return Profile { totals: Counters::default(), dram_bytes_min: 0, sites: vec![] };
        };
        let mut totals = Counters::default();
        let mut sites = vec![];
        for (i, c) in total.sites.into_iter().enumerate() {
            if c.instructions.total() == 0 {
                continue;
            }
            totals.add(&c);
            let inst = &kernel.insts[i];
            sites.push(SiteCounters {
                inst: InstId(i as u32),
                op: inst.op.mnemonic(),
                loc: inst.loc.clone(),
                counters: c,
            });
        }
        let sectors: u64 = total.touched.iter().flatten().map(|w| w.count_ones() as u64).sum();
        Profile { totals, dram_bytes_min: sectors * 32, sites }
    }
}

/// One worker's counts, by instruction, and the global sectors it touched.
pub(crate) struct Recorder {
    sites: Vec<Counters>,
    /// Per buffer, one bit per 32-byte sector.
    touched: Vec<Vec<u64>>,
    scratch: Vec<u64>,
    pairs: Vec<(u32, u32)>,
}

/// The runs of `idx` (sorted lanes) that fall in one warp each.
pub(crate) fn warps(idx: &[u32]) -> impl Iterator<Item = &[u32]> {
    idx.chunk_by(|a, b| a / 32 == b / 32)
}

impl Recorder {
    /// One execution of instruction `site` by the lanes `idx`: its class once per warp, its
    /// flops per lane (per warp for `mma`).
    pub(crate) fn executed(&mut self, p: &Profiling, site: usize, idx: &[u32]) {
        let k = p.kinds[site];
        let nwarps = warps(idx).count() as u64;
        let c = &mut self.sites[site];
        *c.instructions.get_mut(k.class) += nwarps;
        c.flops += k.flops * if k.class == Class::Mma { nwarps } else { idx.len() as u64 };
    }

    /// A branch evaluated by the lanes `idx`, `taken` per lane: divergent in every warp whose
    /// active lanes disagree.
    pub(crate) fn branch(&mut self, site: usize, idx: &[u32], taken: impl Fn(usize) -> bool) {
        let divergent = warps(idx)
            .filter(|w| {
                let first = taken(w[0] as usize);
                w.iter().any(|&t| taken(t as usize) != first)
            })
            .count() as u64;
        self.sites[site].divergent_branches += divergent;
    }

    fn touch(&mut self, addr: u64, bytes: u32) {
        if bytes == 0 {
            return;
        }
        let Some(bits) =
            usize::try_from((addr >> BUFFER_SHIFT).wrapping_sub(1)).ok().and_then(|b| self.touched.get_mut(b))
        else {
            return;
        };
        let offset = addr & ((1 << BUFFER_SHIFT) - 1);
        for s in offset / 32..=(offset + bytes as u64 - 1) / 32 {
            if let Some(w) = bits.get_mut((s / 64) as usize) {
                *w |= 1 << (s % 64);
            }
        }
    }

    /// Global accesses by the lanes `idx` of `bytes(lane)` bytes at `addr(lane)`.
    pub(crate) fn global(
        &mut self,
        site: usize,
        dir: Dir,
        idx: &[u32],
        addr: impl Fn(usize) -> u64,
        bytes: impl Fn(usize) -> u32,
    ) {
        for w in warps(idx) {
            let n = sectors(w.iter().map(|&t| (addr(t as usize), bytes(t as usize))), &mut self.scratch);
            let mut asked = 0;
            for &t in w {
                let b = bytes(t as usize);
                self.touch(addr(t as usize), b);
                asked += b as u64;
            }
            let c = &mut self.sites[site];
            let (requests, secs) = match dir {
                Dir::Load => {
                    c.global_load_bytes_requested += asked;
                    (&mut c.global_load_requests, &mut c.global_load_sectors)
                }
                Dir::Store => {
                    c.global_store_bytes_requested += asked;
                    (&mut c.global_store_requests, &mut c.global_store_sectors)
                }
                Dir::Atomic => (&mut c.global_atomic_requests, &mut c.global_atomic_sectors),
            };
            *requests += 1;
            *secs += n;
            c.bytes_moved += 32 * n;
            c.bytes_requested += asked;
        }
    }

    /// Shared accesses of `bytes` each by the lanes `idx`, at offset `addr(lane)`.
    pub(crate) fn shared(&mut self, site: usize, dir: Dir, bytes: u32, idx: &[u32], addr: impl Fn(usize) -> u64) {
        for w in warps(idx) {
            let c = &mut self.sites[site];
            c.bytes_requested += bytes as u64 * w.len() as u64;
            if dir == Dir::Atomic {
                c.shared_atomic_requests += 1;
                continue;
            }
            self.pairs.clear();
            self.pairs.extend(w.iter().map(|&t| (t % 32, addr(t as usize) as u32)));
            let (fronts, ideal) = wavefronts(&self.pairs, bytes, &mut self.scratch);
            let c = &mut self.sites[site];
            let (requests, wf, conflicts) = if dir == Dir::Load {
                (&mut c.shared_load_requests, &mut c.shared_load_wavefronts, &mut c.shared_load_bank_conflicts)
            } else {
                (&mut c.shared_store_requests, &mut c.shared_store_wavefronts, &mut c.shared_store_bank_conflicts)
            };
            *requests += 1;
            *wf += fronts;
            *conflicts += fronts.saturating_sub(ideal);
        }
    }

    /// `ldmatrix` of `count` matrices by the whole warps of `idx`: lane `8 * m + r` gives the
    /// offset of row `r` of matrix `m`, a 16-byte shared load; one group per matrix.
    pub(crate) fn ldmatrix(&mut self, site: usize, count: u32, idx: &[u32], addr: impl Fn(usize) -> u64) {
        for w in warps(idx) {
            // The whole warp is active (else the instruction fails after this count).
            self.pairs.clear();
            self.pairs.extend(w.iter().filter(|&&t| t % 32 < 8 * count).map(|&t| (t % 32, addr(t as usize) as u32)));
            let (fronts, ideal) = wavefronts(&self.pairs, 16, &mut self.scratch);
            let c = &mut self.sites[site];
            c.shared_load_requests += 1;
            c.shared_load_wavefronts += fronts;
            c.shared_load_bank_conflicts += fronts.saturating_sub(ideal);
            c.bytes_requested += 16 * 8 * count as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wf(accesses: &[(u32, u32)], bytes: u32) -> (u64, u64) {
        wavefronts(accesses, bytes, &mut vec![])
    }

    fn lanes(f: impl Fn(u32) -> u32) -> Vec<(u32, u32)> {
        (0..32).map(|l| (l, f(l))).collect()
    }

    #[test]
    fn sectors_count_distinct_aligned_segments() {
        let s = |acc: &[(u64, u32)]| sectors(acc.iter().copied(), &mut vec![]);
        let coalesced: Vec<_> = (0..32).map(|l| (256 + 4 * l, 4)).collect();
        assert_eq!(s(&coalesced), 4);
        let misaligned: Vec<_> = (0..32).map(|l| (260 + 4 * l, 4)).collect();
        assert_eq!(s(&misaligned), 5);
        let strided: Vec<_> = (0..32).map(|l| (32 * l, 4)).collect();
        assert_eq!(s(&strided), 32);
        let vec4: Vec<_> = (0..32).map(|l| (16 * l, 16)).collect();
        assert_eq!(s(&vec4), 16);
        // One access crossing a sector boundary touches both; zero bytes touch none.
        assert_eq!(s(&[(28, 8)]), 2);
        assert_eq!(s(&[(0, 0)]), 0);
        assert_eq!(s(&[(5, 1), (6, 1)]), 1);
    }

    #[test]
    fn four_byte_groups_are_the_whole_warp() {
        assert_eq!(wf(&lanes(|l| 4 * l), 4), (1, 1));
        assert_eq!(wf(&lanes(|l| 8 * l), 4), (2, 1));
        assert_eq!(wf(&lanes(|l| 128 * l), 4), (32, 1));
        assert_eq!(wf(&lanes(|_| 64), 4), (1, 1));
        // Pairs of lanes on one word: 16 words in 16 banks.
        assert_eq!(wf(&lanes(|l| 4 * (l / 2)), 4), (1, 1));
        // Two-byte accesses: two lanes share each word.
        assert_eq!(wf(&lanes(|l| 2 * l), 2), (1, 1));
        // Partial warps: only the active lanes count.
        assert_eq!(wf(&[(0, 0), (1, 128)], 4), (2, 1));
        assert_eq!(group_lanes(1), 32);
    }

    #[test]
    fn vector_accesses_form_half_and_quarter_warp_groups() {
        // 8 bytes, consecutive: each half-warp covers 32 distinct banks once.
        assert_eq!(wf(&lanes(|l| 8 * l), 8), (2, 2));
        // 8 bytes at a stride of 16: each half-warp needs two passes.
        assert_eq!(wf(&lanes(|l| 16 * l), 8), (4, 2));
        // 16 bytes, consecutive: 4 quarter-warps, one pass each.
        assert_eq!(wf(&lanes(|l| 16 * l), 16), (4, 4));
        // 16 bytes at a stride of 32: two passes per quarter-warp.
        assert_eq!(wf(&lanes(|l| 32 * l), 16), (8, 4));
        // Only the first half-warp active: one group.
        let half: Vec<_> = (0..16).map(|l| (l, 8 * l)).collect();
        assert_eq!(wf(&half, 8), (1, 1));
        assert_eq!((group_lanes(8), group_lanes(16)), (16, 8));
    }

    #[test]
    fn ldmatrix_rows_group_by_matrix() {
        // Rows 16 bytes apart: each matrix's 8 rows fill the 32 banks once.
        let rows: Vec<_> = (0..32).map(|l| (l, 16 * l)).collect();
        assert_eq!(wf(&rows[..8], 16), (1, 1));
        assert_eq!(wf(&rows[..16], 16), (2, 2));
        assert_eq!(wf(&rows, 16), (4, 4));
        // Rows 128 bytes apart (a 64-element f16 row pitch): all in banks 0-3, 8 passes each.
        let pitched: Vec<_> = (0..32).map(|l| (l, 128 * l)).collect();
        assert_eq!(wf(&pitched, 16), (32, 4));
    }

    #[test]
    fn warps_split_sorted_lanes() {
        let idx = [0, 5, 31, 32, 40, 70];
        let w: Vec<&[u32]> = warps(&idx).collect();
        assert_eq!(w, vec![&[0, 5, 31][..], &[32, 40][..], &[70][..]]);
    }
}

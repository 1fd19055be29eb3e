//! Grouped GEMMs over dispatched rows: `y[r, :] = x[r, :] · w[e]ᵀ` for every row `r` of
//! expert `e` (`offsets[e] <= r < offsets[e + 1]`), `x [N, K]`, `w [E, n, K]` (the layout of
//! `nn.Linear` per expert), `y` rows `ldy` apart. Two kernels: the tiled SIMT GEMM
//! ([`moe_grouped_simt`], every float dtype) and the tensor-core GEMM ([`moe_grouped_tc`],
//! f16/bf16, `mma.m16n8k16`), each the family's block body from `crate::gemm` with a
//! different source of rows.
//!
//! **Schedule.** Block row `y` is the `y`-th row tile of the concatenation of the experts'
//! tiles: expert `e` has `ceil(count_e / BM)` tiles, so tiles never straddle experts and an
//! expert without tokens has none (its weights are never read). Every thread of a block walks
//! `offsets` once (the same address per step: a broadcast, uniform control flow) to find its
//! expert, first row and row end. The grid's `y` extent is the bound
//! `ceil(N / BM) + min(E, N)` (each non-empty expert adds at most one partial tile), known on
//! the host without reading the counts; blocks past the last tile find no expert and run no
//! `k` iterations (their `k` loop ends at 0) and store nothing.

use ruda_ir::{Kernel, KernelBuilder, MmaType, ScalarType, Value, VerifyError};

use crate::gemm::kernels::simt::{simt_block, BLayout, BlockRows, SimtOperands};
use crate::gemm::kernels::tc::{tc_block, tc_shared, GemmTcConfig, TcOperands, TcRows};
use crate::gemm::tile::TcTile;

/// Row tile of the SIMT kernel (the SIMT GEMM's).
pub const SIMT_BM: u32 = 64;
/// Column tile of the SIMT kernel.
pub const SIMT_BN: u32 = 64;
/// Threads of the SIMT kernel.
pub const SIMT_THREADS: u32 = 256;

/// The grouped SIMT GEMM in `dtype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupedSimtConfig {
    pub dtype: ScalarType,
}

impl GroupedSimtConfig {
    /// `moe_grouped_simt.bf16`.
    pub fn id(&self) -> String {
        format!("moe_grouped_simt.{}", self.dtype)
    }

    /// Grid for `rows` dispatched rows of `experts` experts and `n` output columns.
    pub fn grid(rows: u32, experts: u32, n: u32) -> [u32; 3] {
        [n.div_ceil(SIMT_BN), row_tiles_bound(rows, experts, SIMT_BM), 1]
    }
}

/// The grouped tensor-core GEMM: input type, tile and pipeline depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupedTcConfig {
    pub ty: MmaType,
    pub tile: TcTile,
    pub stages: u32,
}

impl GroupedTcConfig {
    /// The tensor-core GEMM configuration whose block body this kernel runs (output in the
    /// input dtype, no epilogue).
    pub fn gemm(&self) -> GemmTcConfig {
        GemmTcConfig::new(self.ty, self.tile, self.stages)
    }

    pub fn dtype(&self) -> ScalarType {
        self.gemm().dtype()
    }

    /// `moe_grouped_tc.bf16.tc64x64.s3`.
    pub fn id(&self) -> String {
        format!("moe_grouped_tc.{}.{}.s{}", self.dtype(), self.tile.name(), self.stages)
    }

    pub fn threads(&self) -> u32 {
        self.tile.threads()
    }

    /// Grid for `rows` dispatched rows of `experts` experts and `n` output columns.
    pub fn grid(&self, rows: u32, experts: u32, n: u32) -> [u32; 3] {
        let (bm, bn) = self.tile.dims();
        [n.div_ceil(bn), row_tiles_bound(rows, experts, bm), 1]
    }
}

/// The registered tensor-core configurations: every tile (the heuristic picks the small one for
/// a few rows per expert, the large one for prefill; the tuner tries them all), at the deepest
/// pipeline, in f16 and bf16.
pub fn registered_tc_configs() -> Vec<GroupedTcConfig> {
    let deep = *crate::gemm::tile::STAGES.last().unwrap_or(&2);
    let mut out = Vec::new();
    for ty in [MmaType::F16, MmaType::BF16] {
        for tile in GROUPED_TC_TILES {
            out.push(GroupedTcConfig { ty, tile, stages: deep });
        }
    }
    out
}

/// The tiles the tuner picks from (the heuristic, [`grouped_tc_tile`], takes two of them).
pub const GROUPED_TC_TILES: [TcTile; 5] = TcTile::ALL;

/// The tile for `rows` dispatched rows over `experts` experts and `n` columns: 128 × 128 when
/// an expert averages a full tile of rows and the output is that wide, else 64 × 64 (decode:
/// a few rows per expert, where a large tile would mostly multiply padding).
pub fn grouped_tc_tile(rows: usize, experts: usize, n: usize) -> TcTile {
    let per_expert = rows / experts.clamp(1, rows.max(1));
    if per_expert >= 128 && n >= 128 {
        TcTile::T128x128W4
    } else {
        TcTile::T64x64
    }
}

/// An upper bound of the experts' row tiles: `Σ ceil(c_e / bm) ≤ ceil(N / bm) + min(E, N)`.
pub fn row_tiles_bound(rows: u32, experts: u32, bm: u32) -> u32 {
    rows.div_ceil(bm).saturating_add(experts.min(rows))
}

crate::kernel_params! {
    /// The parameters of [`moe_grouped_simt`], in order.
    pub struct GroupedSimtParams, GroupedSimtValues for GroupedSimtConfig as cfg {
        x: tensor(cfg.dtype),
        w: tensor(cfg.dtype),
        y: tensor(cfg.dtype),
        offsets: tensor(ScalarType::U32),
        experts: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
        ldy: scalar(u32),
        w_stride: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_grouped_tc`], in order.
    pub struct GroupedTcParams, GroupedTcValues for GroupedTcConfig as cfg {
        x: tensor(cfg.dtype()),
        w: tensor(cfg.dtype()),
        y: tensor(cfg.dtype()),
        offsets: tensor(ScalarType::U32),
        experts: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
        ldy: scalar(u32),
        w_stride: scalar(u32),
    }
}

/// Block row `tile`'s expert: `(row0, row_end, expert, found)` with `found` 0 past the last
/// tile (then `row0 = row_end = 0`). One pass over `offsets[0..=E]`.
#[track_caller]
fn expert_tile(b: &mut KernelBuilder, offsets: Value, experts: Value, tile: Value, bm: u32) -> [Value; 4] {
    let (zero, one) = (b.const_u32(0), b.const_u32(1));
    let first = b.load(offsets);
    let init = [zero, first, zero, zero, zero, zero];
    let out = b.for_range(zero, experts, one, &init, |b, e, c| {
        let (seen, start, row0, end_row, expert, found) = (c[0], c[1], c[2], c[3], c[4], c[5]);
        let one = b.const_u32(1);
        let next = b.add(e, one);
        let p = b.ptr_add(offsets, next);
        let end = b.load(p);
        let count = b.sub(end, start);
        let round = b.const_u32(bm - 1);
        let padded = b.add(count, round);
        let shift = b.const_u32(bm.trailing_zeros());
        let tiles = b.shr(padded, shift);
        let seen_next = b.add(seen, tiles);
        let zero = b.const_u32(0);
        let not_found = b.eq(found, zero);
        let inside = b.lt(tile, seen_next);
        let hit = b.and(not_found, inside);
        let into = b.sub(tile, seen);
        let bm_c = b.const_u32(bm);
        let here = b.fma(into, bm_c, start);
        vec![
            seen_next,
            end,
            b.select(hit, here, row0),
            b.select(hit, end, end_row),
            b.select(hit, e, expert),
            b.select(hit, one, found),
        ]
    });
    [out[2], out[3], out[4], out[5]]
}

/// The rows of block row `tile`, for the GEMM bodies: `(row0, row_end, expert · w_stride (u64),
/// k_end)`, the offset of the expert's weight and a `k` loop of 0 iterations where there is no
/// tile.
#[track_caller]
pub(super) fn grouped_rows(
    b: &mut KernelBuilder,
    offsets: Value,
    experts: Value,
    tile: Value,
    bm: u32,
    w_stride: Value,
    k: Value,
) -> (Value, Value, Value, Value) {
    let [row0, row_end, expert, found] = expert_tile(b, offsets, experts, tile, bm);
    let e64 = b.cvt(expert, ScalarType::U64);
    let s64 = b.cvt(w_stride, ScalarType::U64);
    let off = b.mul(e64, s64);
    let zero = b.const_u32(0);
    let some = b.ne(found, zero);
    let k_end = b.select(some, k, zero);
    (row0, row_end, off, k_end)
}

/// Grouped SIMT GEMM. Parameters: x (`[N, K]`), w (`[E, n, K]`, experts `w_stride` elements
/// apart), y (rows `ldy` apart), offsets (`u32 [E + 1]`), experts, n, k, ldy, w_stride (`u32`).
/// Grid: [`GroupedSimtConfig::grid`], block [`SIMT_THREADS`]. `f32` fused multiply-adds in `k`
/// order (the SIMT GEMM's), rounded once.
pub fn moe_grouped_simt(cfg: &GroupedSimtConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GroupedSimtValues { x, w, y, offsets, experts, n, k, ldy, w_stride } = GroupedSimtParams::declare(&mut b, cfg);
    let io = SimtOperands { a: x, bias: None, c: y, n, k };
    simt_block(&mut b, BLayout::Transposed, io, |b, block_row, _| {
        let (row0, m, w_off, k_end) = grouped_rows(b, offsets, experts, block_row, SIMT_BM, w_stride, k);
        let w_e = b.ptr_add(w, w_off);
        BlockRows { row0, m, b: w_e, k_end, ldc: ldy }
    });
    b.finish()
}

/// Grouped tensor-core GEMM. Parameters as [`moe_grouped_simt`]; the host requires `K % 8 ==
/// 0`, 16-byte aligned `x` and `w`, an even `ldy` and `y` at an even element. Grid:
/// [`GroupedTcConfig::grid`], block [`GroupedTcConfig::threads`].
pub fn moe_grouped_tc(cfg: &GroupedTcConfig) -> Result<Kernel, VerifyError> {
    let gemm = cfg.gemm();
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GroupedTcValues { x, w, y, offsets, experts, n, k, ldy, w_stride } = GroupedTcParams::declare(&mut b, cfg);
    let tiles = tc_shared(&mut b, &gemm);
    let io = TcOperands::k_major(x, y, None, None, n, k);
    let bm = cfg.tile.dims().0;
    tc_block(&mut b, &gemm, io, tiles, |b, block_row, _| {
        let (row0, m, w_off, k_end) = grouped_rows(b, offsets, experts, block_row, bm, w_stride, k);
        let w_e = b.ptr_add(w, w_off);
        TcRows { row0, m, w: w_e, w_split: None, k_end, ldy }
    });
    b.finish()
}

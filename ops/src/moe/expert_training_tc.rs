//! The experts' backward on tensor cores (f16/bf16, `mma.m16n8k16` with `f32` accumulation):
//! the tensor-core GEMM's block body (`crate::gemm::kernels::tc`) with operands whose rows are
//! `k` ([`Major::Mn`], read with `ldmatrix.trans`), so no weight or activation is transposed in
//! memory.
//!
//! - [`moe_grouped_tc_nn`]: `y[r] = x[r] · w[e]` over each expert's dispatched rows, for a weight
//!   `w [E, K, N]` whose rows are `k`: `down [E, H, I]` gives the activation's gradient from the
//!   output's, `gate_up [E, 2I, H]` (or split gate and up: two matrices along `k`) the rows'
//!   gradient from the pre-activations'. Rows are scheduled as in the forward
//!   (`super::grouped`).
//! - [`moe_expert_grad_weight_tc`]: `out[e] = a_eᵀ · b_e` over expert `e`'s rows, both operands
//!   rows of the dispatched order (`k` = the expert's rows, from `offsets[e]`, not a multiple of
//!   anything: the loads are predicated on it), output `f32`; an expert without rows gets zeros.
//!
//! Between the two, `super::expert_training_kernel::moe_expert_grad_swiglu` turns the activation's
//! gradient into the pre-activations', rounded to the dtype (the next GEMMs' operand).

use ruda_ir::{Kernel, KernelBuilder, MmaType, ScalarType, SpecialReg, VerifyError};

use super::grouped::{grouped_rows, row_tiles_bound};
use crate::gemm::kernels::tc::{tc_block, tc_shared, GemmTcConfig, Major, TcOperands, TcRows, WSplit};
use crate::gemm::tile::TcTile;

/// The tiles built for the backward: the ones the forward's heuristic picks (a few rows per
/// expert, and prefill-sized groups).
pub const BACKWARD_TC_TILES: [TcTile; 2] = [TcTile::T64x64, TcTile::T128x128W4];

/// The tile for an `m × n` output: 128 × 128 where both sides fill it, else 64 × 64.
pub fn backward_tile(m: usize, n: usize) -> TcTile {
    if m >= 128 && n >= 128 {
        TcTile::T128x128W4
    } else {
        TcTile::T64x64
    }
}

/// The grouped GEMM `y[r] = x[r] · w[e]` (`w [E, K, N]`): input type, tile, pipeline depth, the
/// output type (the input's or `f32`) and whether `w` is two matrices along `k`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GroupedTcNnConfig {
    pub ty: MmaType,
    pub tile: TcTile,
    pub stages: u32,
    pub out: ScalarType,
    pub split: bool,
}

impl GroupedTcNnConfig {
    /// The tensor-core GEMM configuration whose block body this kernel runs.
    pub fn gemm(&self) -> GemmTcConfig {
        GemmTcConfig { out: self.out, ..GemmTcConfig::new(self.ty, self.tile, self.stages) }
    }

    pub fn dtype(&self) -> ScalarType {
        self.gemm().dtype()
    }

    /// `moe_grouped_tc_nn.bf16.tc64x64.s3`, then `.out_f32` and `.split`.
    pub fn id(&self) -> String {
        let mut id = format!("moe_grouped_tc_nn.{}.{}.s{}", self.dtype(), self.tile.name(), self.stages);
        if self.out != self.dtype() {
            id.push_str(&format!(".out_{}", self.out));
        }
        if self.split {
            id.push_str(".split");
        }
        id
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

/// The per-expert weight gradient `out[e] = a_eᵀ · b_e`: input type, tile, pipeline depth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ExpertWeightGradTcConfig {
    pub ty: MmaType,
    pub tile: TcTile,
    pub stages: u32,
}

impl ExpertWeightGradTcConfig {
    /// The tensor-core GEMM configuration whose block body this kernel runs (`f32` output).
    pub fn gemm(&self) -> GemmTcConfig {
        GemmTcConfig { out: ScalarType::F32, ..GemmTcConfig::new(self.ty, self.tile, self.stages) }
    }

    pub fn dtype(&self) -> ScalarType {
        self.gemm().dtype()
    }

    /// `moe_expert_grad_weight_tc.bf16.tc64x64.s3`.
    pub fn id(&self) -> String {
        format!("moe_expert_grad_weight_tc.{}.{}.s{}", self.dtype(), self.tile.name(), self.stages)
    }

    pub fn threads(&self) -> u32 {
        self.tile.threads()
    }

    /// Grid for `experts` outputs of `m × n`.
    pub fn grid(&self, m: u32, n: u32, experts: u32) -> [u32; 3] {
        self.gemm().grid(m, n, experts)
    }
}

/// The registered configurations: both backward tiles at the deepest pipeline in f16 and bf16;
/// the grouped GEMM with an `f32` output (the activation's gradient) and with the dtype's, `w`
/// one matrix or split.
pub fn registered_backward_configs() -> (Vec<GroupedTcNnConfig>, Vec<ExpertWeightGradTcConfig>) {
    let stages = super::tune::deepest_stages();
    let (mut nn, mut weight) = (Vec::new(), Vec::new());
    for ty in [MmaType::F16, MmaType::BF16] {
        for tile in BACKWARD_TC_TILES {
            let dtype = GemmTcConfig::new(ty, tile, stages).dtype();
            for (out, split) in [(ScalarType::F32, false), (dtype, false), (dtype, true)] {
                nn.push(GroupedTcNnConfig { ty, tile, stages, out, split });
            }
            weight.push(ExpertWeightGradTcConfig { ty, tile, stages });
        }
    }
    (nn, weight)
}

crate::kernel_params! {
    /// The parameters of [`moe_grouped_tc_nn`], in order: `w2` and `split_k` when split.
    pub struct GroupedTcNnParams, GroupedTcNnValues for GroupedTcNnConfig as cfg {
        x: tensor(cfg.dtype()),
        w: tensor(cfg.dtype()),
        w2: opt_tensor(cfg.dtype(), cfg.split),
        y: tensor(cfg.out),
        offsets: tensor(ScalarType::U32),
        experts: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
        ldy: scalar(u32),
        w_stride: scalar(u32),
        split_k: opt_scalar(u32, cfg.split),
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_expert_grad_weight_tc`], in order.
    pub struct ExpertWeightGradTcParams, ExpertWeightGradTcValues for ExpertWeightGradTcConfig as cfg {
        a: tensor(cfg.dtype()),
        b: tensor(cfg.dtype()),
        offsets: tensor(ScalarType::U32),
        out: tensor(ScalarType::F32),
        m: scalar(u32),
        n: scalar(u32),
        lda: scalar(u32),
        ldb: scalar(u32),
        a_offset: scalar(u32),
    }
}

/// Grouped tensor-core GEMM with the weight's rows `k`: `y[r, :] = x[r, :] · w[e]` for every
/// row `r` of expert `e`. Parameters: x (`[N, K]`), w (`[E, K, n]`, experts `w_stride` elements
/// apart; split: its rows `k < split_k`, and `w2` the same shape for `k ≥ split_k`, row `k −
/// split_k`), y (rows `ldy` apart), offsets (`u32 [E + 1]`), experts, n, k, ldy, w_stride,
/// split_k. The host requires `K % 8 == 0`, `n % 8 == 0`, 16-byte aligned `x` and `w`, an even
/// `ldy` and `y` at an even element. Grid: [`GroupedTcNnConfig::grid`], block
/// [`GroupedTcNnConfig::threads`].
pub fn moe_grouped_tc_nn(cfg: &GroupedTcNnConfig) -> Result<Kernel, VerifyError> {
    let gemm = cfg.gemm();
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GroupedTcNnValues { x, w, w2, y, offsets, experts, n, k, ldy, w_stride, split_k } =
        GroupedTcNnParams::declare(&mut b, cfg);
    let tiles = tc_shared(&mut b, &gemm);
    let io = TcOperands { w_major: Major::Mn { ld: n }, ..TcOperands::k_major(x, y, None, None, n, k) };
    let bm = cfg.tile.dims().0;
    tc_block(&mut b, &gemm, io, tiles, |b, block_row, _| {
        let (row0, m, w_off, k_end) = grouped_rows(b, offsets, experts, block_row, bm, w_stride, k);
        let w_e = b.ptr_add(w, w_off);
        let w_split = w2.zip(split_k).map(|(w2, from_k)| WSplit { w: b.ptr_add(w2, w_off), from_k });
        TcRows { row0, m, w: w_e, w_split, k_end, ldy }
    });
    b.finish()
}

/// Per-expert weight gradient on tensor cores: `out[e, i, j] = Σ_r a[r · lda + a_offset + i] ·
/// b[r · ldb + j]` over expert `e`'s rows `offsets[e] <= r < offsets[e + 1]`, `f32` sums of the
/// mma (the rows in tiles of `BK`), zeros for an expert without rows. Parameters: a, b, offsets
/// (`u32 [E + 1]`), out (`f32 [E, m, n]`), m, n, lda, ldb, a_offset. The host requires `m`, `n`,
/// `lda`, `ldb` and `a_offset` multiples of 8 and 16-byte aligned `a` and `b`. Grid:
/// [`ExpertWeightGradTcConfig::grid`] (`z` the expert), block
/// [`ExpertWeightGradTcConfig::threads`].
pub fn moe_expert_grad_weight_tc(cfg: &ExpertWeightGradTcConfig) -> Result<Kernel, VerifyError> {
    let gemm = cfg.gemm();
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let ExpertWeightGradTcValues { a, b: bv, offsets, out, m, n, lda, ldb, a_offset } =
        ExpertWeightGradTcParams::declare(&mut b, cfg);
    let tiles = tc_shared(&mut b, &gemm);
    let e = b.special(SpecialReg::CtaidZ);
    let p = b.ptr_add(offsets, e);
    let start = b.load(p);
    let one = b.const_u32(1);
    let next = b.add(e, one);
    let p = b.ptr_add(offsets, next);
    let end = b.load(p);
    let count = b.sub(end, start);
    let a_first = b.fma(start, lda, a_offset);
    let a_e = b.ptr_add(a, a_first);
    let b_first = b.mul(start, ldb);
    let b_e = b.ptr_add(bv, b_first);
    let mn = b.mul(m, n);
    let out_first = b.mul(e, mn);
    let out_e = b.ptr_add(out, out_first);
    let io = TcOperands {
        x_major: Major::Mn { ld: lda },
        w_major: Major::Mn { ld: ldb },
        ..TcOperands::k_major(a_e, out_e, None, None, n, count)
    };
    tc_block(&mut b, &gemm, io, tiles, |b, block_row, bm| TcRows {
        row0: b.mul(block_row, bm),
        m,
        w: b_e,
        w_split: None,
        k_end: count,
        ldy: n,
    });
    b.finish()
}

//! Tiled SIMT GEMM: `C[M, N] = A[M, K] · B`, with `B` either `[K, N]` (row-major) or `[N, K]`
//! (transposed, the layout of `nn.Linear` weights), and optionally `+ bias[N]`. Inputs, bias and
//! output share one dtype (f32/f16/bf16); products accumulate in `f32` with fused multiply-adds
//! in `k` order, and the bias joins that sum before the one rounding to the output (cuBLAS's
//! epilogue; a separate `add_bias` would round twice).
//!
//! Each block computes a `64 × 64` tile of `C` with 256 threads; each thread owns a `4 × 4`
//! micro-tile strided by 16 in both directions (so that shared-memory reads are broadcasts in
//! one direction and consecutive in the other). Tiles of `A` and `B`, `16` deep in `k`, are
//! staged through shared memory as `f32`, zero-filled past the matrix edges.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::{load_f32, offset, store_from_f32};

const BM: u32 = 64;
const BN: u32 = 64;
const BK: u32 = 16;
const THREADS: u32 = 256;
/// Threads along each side of the block's thread grid (16 × 16).
const SIDE: u32 = 16;
/// Micro-tile size per thread along each side (BM / SIDE).
const MICRO: u32 = 4;
/// Row pitch of both staged tiles (each 64 wide), in f32: the tiles are stored k-major, and a warp's staging
/// store writes 16 consecutive `k` of two rows, so unpadded rows of 64 would put all 16 in one
/// bank (a 16-way conflict, found by `rudac profile`); 66 spreads them over every bank. The
/// compute loop's reads (broadcasts, or 16 consecutive words) stay conflict-free.
const PITCH: u32 = BM + 2;
const _: () = assert!(BM == BN, "both tiles share PITCH");

/// Layout of the `B` operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BLayout {
    /// `B` is `[K, N]`.
    RowMajor,
    /// `B` is `[N, K]` (`C = A · Bᵀ`).
    Transposed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmConfig {
    pub dtype: ScalarType,
    pub b_layout: BLayout,
    /// Adds `bias[N]` before the rounding.
    pub bias: bool,
}

impl GemmConfig {
    pub fn id(&self) -> String {
        let layout = match self.b_layout {
            BLayout::RowMajor => "nn",
            BLayout::Transposed => "nt",
        };
        let bias = if self.bias { ".bias" } else { "" };
        format!("gemm_simt.{}.{layout}{bias}", self.dtype)
    }

    /// Grid for an `M × N` output: `(ceil(N / 64), ceil(M / 64))`.
    pub fn grid(m: u32, n: u32) -> [u32; 3] {
        [n.div_ceil(BN), m.div_ceil(BM), 1]
    }

    pub const THREADS: u32 = THREADS;
}

crate::kernel_params! {
    /// The parameters of [`gemm_simt`], in order.
    pub struct GemmSimtParams, GemmSimtValues for GemmConfig as cfg {
        a: tensor(cfg.dtype),
        b: tensor(cfg.dtype),
        bias: opt_tensor(cfg.dtype, cfg.bias),
        c: tensor(cfg.dtype),
        m: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
    }
}

/// Build the kernel. Parameters: a, b, [bias], c, m, n, k (all `u32` dimensions).
pub fn gemm_simt(cfg: &GemmConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GemmSimtValues { a: a_ptr, b: b_ptr, bias, c: c_ptr, m, n, k } = GemmSimtParams::declare(&mut b, cfg);
    let io = SimtOperands { a: a_ptr, bias, c: c_ptr, n, k };
    simt_block(&mut b, cfg.b_layout, io, |b, block_row, bm| BlockRows {
        row0: b.mul(block_row, bm),
        m,
        b: b_ptr,
        k_end: k,
        ldc: n,
    });
    b.finish()
}

/// The rows a block of a tiled GEMM computes, found by its caller from the block's row index
/// (`ctaid.y`): the plain GEMM's `[64 · y, 64 · y + 64) ∩ [0, m)`, or a grouped GEMM's tile of
/// one expert's rows with that expert's `B`.
pub(crate) struct BlockRows {
    /// The first row (of `A` and `C`).
    pub row0: Value,
    /// Rows from `m` on do not exist (loads zero-fill, stores skip them).
    pub m: Value,
    /// The `B` operand of this block.
    pub b: Value,
    /// The `k` loop's end: `k`, or 0 for a block with nothing to compute.
    pub k_end: Value,
    /// Elements between rows of `C`.
    pub ldc: Value,
}

/// The operands every block of a SIMT GEMM shares: `A`, the optional bias `[N]`, `C`, and the
/// sizes `n` and `k`.
pub(crate) struct SimtOperands {
    pub a: Value,
    pub bias: Option<Value>,
    pub c: Value,
    pub n: Value,
    pub k: Value,
}

/// The SIMT GEMM's work for one block, after its parameters: launch bounds, the staged
/// tiles, the `k` loop and the stores. `rows` is called with the block's row index and `BM`,
/// where the plain kernel computes its first row.
pub(crate) fn simt_block(
    b: &mut KernelBuilder,
    b_layout: BLayout,
    io: SimtOperands,
    rows: impl FnOnce(&mut KernelBuilder, Value, Value) -> BlockRows,
) {
    let SimtOperands { a: a_ptr, bias: bias_ptr, c: c_ptr, n, k } = io;
    b.launch_bounds(THREADS, None);
    let a_tile = b.shared_array("a_tile", ScalarType::F32, BK * PITCH);
    let b_tile = b.shared_array("b_tile", ScalarType::F32, BK * PITCH);

    let tid = b.thread_id_x();
    let side = b.const_u32(SIDE);
    let tx = b.rem(tid, side);
    let ty = b.div(tid, side);
    let bn_c = b.const_u32(BN);
    let bm_c = b.const_u32(BM);
    let pitch = b.const_u32(PITCH);
    let block_col = b.block_id_x();
    let block_row = b.block_id_y();
    let col0 = b.mul(block_col, bn_c);
    let BlockRows { row0, m, b: b_ptr, k_end, ldc } = rows(b, block_row, bm_c);
    let a_smem = b.shared_ptr(a_tile);
    let b_smem = b.shared_ptr(b_tile);
    let zero_f = b.const_f32(0.0);
    let zero = b.const_u32(0);
    let bk_c = b.const_u32(BK);
    let init = vec![zero_f; (MICRO * MICRO) as usize];

    let acc = b.for_range(zero, k_end, bk_c, &init, |b, k0, acc| {
        // Stage the A tile (BM × BK, stored k-major) and the B tile (BK × BN).
        for r in 0..(BM * BK / THREADS) {
            let e = offset(b, tid, r * THREADS);
            let (mi, ki) = split(b, e, BK);
            let row = b.add(row0, mi);
            let kk = b.add(k0, ki);
            let v = guarded_load(b, row, m, kk, k, |b| {
                let idx = b.fma(row, k, kk);
                load_f32(b, a_ptr, idx)
            });
            let s = b.fma(ki, pitch, mi);
            let p = b.ptr_add(a_smem, s);
            b.store(p, v);
        }
        for r in 0..(BN * BK / THREADS) {
            let e = offset(b, tid, r * THREADS);
            let (ki, ni) = match b_layout {
                BLayout::RowMajor => split(b, e, BN),
                BLayout::Transposed => {
                    let (ni, ki) = split(b, e, BK);
                    (ki, ni)
                }
            };
            let col = b.add(col0, ni);
            let kk = b.add(k0, ki);
            let v = guarded_load(b, col, n, kk, k, |b| {
                let idx = match b_layout {
                    BLayout::RowMajor => b.fma(kk, n, col),
                    BLayout::Transposed => b.fma(col, k, kk),
                };
                load_f32(b, b_ptr, idx)
            });
            let s = b.fma(ki, pitch, ni);
            let p = b.ptr_add(b_smem, s);
            b.store(p, v);
        }
        b.barrier();
        let one = b.const_u32(1);
        let acc = b.for_range(zero, bk_c, one, acc, |b, kk, acc| {
            let a_row = b.mul(kk, pitch);
            let b_row = b.mul(kk, pitch);
            let a_vals: Vec<Value> = (0..MICRO)
                .map(|i| {
                    let mi = offset(b, ty, i * SIDE);
                    let s = b.add(a_row, mi);
                    let p = b.ptr_add(a_smem, s);
                    b.load(p)
                })
                .collect();
            let b_vals: Vec<Value> = (0..MICRO)
                .map(|j| {
                    let ni = offset(b, tx, j * SIDE);
                    let s = b.add(b_row, ni);
                    let p = b.ptr_add(b_smem, s);
                    b.load(p)
                })
                .collect();
            let mut next = Vec::with_capacity(acc.len());
            for i in 0..MICRO as usize {
                for j in 0..MICRO as usize {
                    next.push(b.fma(a_vals[i], b_vals[j], acc[i * MICRO as usize + j]));
                }
            }
            next
        });
        // The tiles are overwritten next iteration only after every thread has read them.
        b.barrier();
        acc
    });

    for i in 0..MICRO {
        for j in 0..MICRO {
            let ri = offset(b, ty, i * SIDE);
            let row = b.add(row0, ri);
            let ci = offset(b, tx, j * SIDE);
            let col = b.add(col0, ci);
            let row_ok = b.lt(row, m);
            let col_ok = b.lt(col, n);
            let ok = b.and(row_ok, col_ok);
            let value = acc[(i * MICRO + j) as usize];
            b.if_then(ok, |b| {
                let value = bias_ptr.map_or(value, |bp| {
                    let bias = load_f32(b, bp, col);
                    b.add(value, bias)
                });
                let idx = b.fma(row, ldc, col);
                store_from_f32(b, c_ptr, idx, value);
            });
        }
    }
}

/// `(e / width, e % width)` for a power-of-two width.
#[track_caller]
fn split(b: &mut KernelBuilder, e: Value, width: u32) -> (Value, Value) {
    let shift = b.const_u32(width.trailing_zeros());
    let mask = b.const_u32(width - 1);
    (b.shr(e, shift), b.and(e, mask))
}

/// `load()` when `outer < outer_len && inner < inner_len`, else `0.0`.
#[track_caller]
fn guarded_load(
    b: &mut KernelBuilder,
    outer: Value,
    outer_len: Value,
    inner: Value,
    inner_len: Value,
    load: impl FnOnce(&mut KernelBuilder) -> Value,
) -> Value {
    let o = b.lt(outer, outer_len);
    let i = b.lt(inner, inner_len);
    let ok = b.and(o, i);
    b.if_else(ok, |b| vec![load(b)], |b| vec![b.const_f32(0.0)])[0]
}

//! AWQ kernels over AutoAWQ's GEMM layout: `qweight [K, N/8]` and `qzeros [K/G, N/8]` (`i32`,
//! eight 4-bit values per word), `scales [K/G, N]` (`f16`). Word `j` of a row holds columns
//! `8j..8j+8`, column `8j + c` in nibble [`AWQ_NIBBLE`]`[c]` (AutoAWQ packs in the order
//! `0, 2, 4, 6, 1, 3, 5, 7`). The weight of input `k`, output `n` is
//! `f16((q[k, n] - zero[k / G, n]) · scale[k / G, n])`: the difference is a small integer and the
//! product is exact in `f32`, so the one rounding to `f16` is the one AutoAWQ's own f16
//! dequantisation makes, and both kernels here see bit-identical weights.
//!
//! - [`awq_gemv`]: `y[M, N] = x[M, K] · W` (plus a bias) for decode, reading the packed weights
//!   once. A block covers [`AWQ_GEMV_WORDS`] words (64 columns) of every row of a tile of `x`:
//!   lane `t % 8` takes a word, `t / 8` one of [`AWQ_GEMV_SLICES`] consecutive slices of `K`
//!   (so each warp reads four rows' 32-byte sectors whole). A slice's sums run over its `k` in
//!   increasing order, `f32` fused multiply-adds; the slices are then added in increasing
//!   order through shared memory, the bias added, and the sum rounded once.
//! - [`awq_dequantize`]: `W` as a dense `[N, K]` weight (`nn.Linear`'s layout) in a float dtype,
//!   for the tensor-core GEMM to take over prefill-sized `x`. A block transposes a tile of 32
//!   rows × 32 words through shared memory, so both its reads and its writes are coalesced.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::{load_f32, load_halves8, offset, row_ptr, store_from_f32};

/// The nibble of a word that holds its column `c` (the inverse of AutoAWQ's packing order).
pub const AWQ_NIBBLE: [u32; 8] = [0, 4, 1, 5, 2, 6, 3, 7];
/// Packed words (eight columns each) per GEMV block.
pub const AWQ_GEMV_WORDS: u32 = 8;
/// Slices of `K` per GEMV block.
pub const AWQ_GEMV_SLICES: u32 = 16;
/// Threads per GEMV block.
pub const AWQ_GEMV_THREADS: u32 = AWQ_GEMV_WORDS * AWQ_GEMV_SLICES;
/// The compiled row tiles of `x`; a launch uses the smallest that covers `M`, and a grid row per
/// tile beyond it.
pub const AWQ_GEMV_M_TILES: [u32; 2] = [1, 8];
/// Rows of `K` and words per dequantisation tile.
pub const AWQ_DEQUANT_TILE: u32 = 32;
/// Threads per dequantisation block.
pub const AWQ_DEQUANT_THREADS: u32 = 256;

/// Shared-memory row stride of the GEMV's slice sums: 4 more than the 128 sums of a column
/// offset, so that the 32 lanes reading 32 consecutive columns hit 32 banks.
const SUMS_STRIDE: u32 = AWQ_GEMV_WORDS * AWQ_GEMV_SLICES + 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AwqGemvConfig {
    /// The dtype of `x`, the bias and the output.
    pub dtype: ScalarType,
    /// Rows of `x` per block (one of [`AWQ_GEMV_M_TILES`]).
    pub m_tile: u32,
    /// Add `bias[N]` to the `f32` sum before the one rounding.
    pub bias: bool,
}

impl AwqGemvConfig {
    /// `awq_gemv.f16.m1`, `awq_gemv.bf16.m8.bias`.
    pub fn id(&self) -> String {
        format!("awq_gemv.{}.m{}{}", self.dtype, self.m_tile, if self.bias { ".bias" } else { "" })
    }

    /// The smallest compiled row tile for `m` rows (the largest above it: more rows take more
    /// grid rows).
    pub fn m_tile_for(m: u32) -> u32 {
        AWQ_GEMV_M_TILES.into_iter().find(|&t| t >= m).unwrap_or(AWQ_GEMV_M_TILES[AWQ_GEMV_M_TILES.len() - 1])
    }
}

crate::kernel_params! {
    /// The parameters of [`awq_gemv`], in order.
    pub struct AwqGemvParams, AwqGemvValues for AwqGemvConfig as cfg {
        x: tensor(cfg.dtype),
        qweight: tensor(ScalarType::I32),
        qzeros: tensor(ScalarType::I32),
        scales: tensor(ScalarType::F16),
        out: tensor(cfg.dtype),
        bias: opt_tensor(cfg.dtype, cfg.bias),
        m: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
        group_size: scalar(u32),
    }
}

/// Nibble `AWQ_NIBBLE[c]` of the packed word `w` (`u32`), as an `f32` in `0..=15`.
fn nibble(b: &mut KernelBuilder, w: Value, c: usize) -> Value {
    let shift = b.const_u32(4 * AWQ_NIBBLE[c]);
    let shifted = b.shr(w, shift);
    let mask = b.const_u32(15);
    let v = b.and(shifted, mask);
    b.cvt(v, ScalarType::F32)
}

/// Element `index` of an `i32` tensor, as the `u32` of its bits.
fn load_word(b: &mut KernelBuilder, base: Value, index: Value) -> Value {
    let p = b.ptr_add(base, index);
    let v = b.load(p);
    b.bitcast(v, ScalarType::U32)
}

/// `f16((q - zero) · scale)` in `dtype` (rounded again for bf16, as a dense bf16 copy holds
/// it), widened back to `f32`.
fn weight(b: &mut KernelBuilder, dtype: ScalarType, q: Value, zero: Value, scale: Value) -> Value {
    let diff = b.sub(q, zero);
    let w = b.mul(diff, scale);
    let h = b.cvt(w, ScalarType::F16);
    let w = b.cvt(h, ScalarType::F32);
    if dtype == ScalarType::BF16 {
        let w = b.cvt(w, ScalarType::BF16);
        b.cvt(w, ScalarType::F32)
    } else {
        w
    }
}

/// Build the GEMV. Parameters: x `[M, K]`, qweight, qzeros, scales, out `[M, N]`, with
/// `cfg.bias` bias `[N]`, then m, n, k, group_size (`u32`; `N % 8 == 0`, `K % G == 0`). Grid:
/// `(ceil(N / 64), ceil(M / m_tile))`, block [`AWQ_GEMV_THREADS`].
pub fn awq_gemv(cfg: &AwqGemvConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let AwqGemvValues { x, qweight, qzeros, scales, out, bias, m, n, k, group_size } =
        AwqGemvParams::declare(&mut b, cfg);
    b.launch_bounds(AWQ_GEMV_THREADS, None);
    let sums = b.shared_array("slice_sums", ScalarType::F32, 8 * SUMS_STRIDE);
    let sums = b.shared_ptr(sums);

    let tid = b.thread_id_x();
    let seven = b.const_u32(7);
    let three = b.const_u32(3);
    let one = b.const_u32(1);
    let lane_word = b.and(tid, seven);
    let slice = b.shr(tid, three);
    let words = b.shr(n, three);
    let block_words = b.const_u32(AWQ_GEMV_WORDS);
    let bx = b.block_id_x();
    let word = b.fma(bx, block_words, lane_word);
    // Lanes past the last word compute on the last one (every thread reaches the barriers)
    // and store nothing.
    let last_word = b.sub(words, one);
    let word = b.min(word, last_word);
    let m_tile = b.const_u32(cfg.m_tile);
    let by = b.block_id_y();
    let row0 = b.mul(by, m_tile);
    let last_row = b.sub(m, one);
    let x_rows: Vec<Value> = (0..cfg.m_tile)
        .map(|r| {
            let r = b.const_u32(r);
            let row = b.add(row0, r);
            let row = b.min(row, last_row);
            row_ptr(&mut b, x, row, k)
        })
        .collect();

    // This slice's range of K, then the groups it overlaps.
    let slices = b.const_u32(AWQ_GEMV_SLICES);
    let per_slice = offset(&mut b, k, AWQ_GEMV_SLICES - 1);
    let per_slice = b.div(per_slice, slices);
    let k0 = b.mul(slice, per_slice);
    let k0 = b.min(k0, k);
    let k1 = b.add(k0, per_slice);
    let k1 = b.min(k1, k);
    let g_lo = b.div(k0, group_size);
    let g_hi = b.add(k1, group_size);
    let g_hi = b.sub(g_hi, one);
    let g_hi = b.div(g_hi, group_size);
    let zero_f = b.const_f32(0.0);
    let init = vec![zero_f; 8 * cfg.m_tile as usize];
    let acc = b.for_range(g_lo, g_hi, one, &init, |b, g, acc| {
        let zeros = row_ptr(b, qzeros, g, words);
        let zw = load_word(b, zeros, word);
        // The word's eight scales in one 16-byte load (rows of `N % 8 == 0` halves start
        // 16-byte aligned when `scales` does).
        let scale_row = row_ptr(b, scales, g, n);
        let scales8 = load_halves8(b, ScalarType::F16, scale_row, word);
        let zs: Vec<(Value, Value)> = scales8.into_iter().enumerate().map(|(c, s)| (nibble(b, zw, c), s)).collect();
        let g_start = b.mul(g, group_size);
        let g_end = b.add(g_start, group_size);
        let kb = b.max(k0, g_start);
        let ke = b.min(k1, g_end);
        b.for_range(kb, ke, one, acc, |b, kk, acc| {
            let row = row_ptr(b, qweight, kk, words);
            let qw = load_word(b, row, word);
            let ws: Vec<Value> = zs
                .iter()
                .enumerate()
                .map(|(c, &(z, s))| {
                    let q = nibble(b, qw, c);
                    weight(b, cfg.dtype, q, z, s)
                })
                .collect();
            let mut acc = acc.to_vec();
            for (r, &x_row) in x_rows.iter().enumerate() {
                let xv = load_f32(b, x_row, kk);
                for (c, &w) in ws.iter().enumerate() {
                    acc[r * 8 + c] = b.fma(xv, w, acc[r * 8 + c]);
                }
            }
            acc
        })
    });

    // Per row of the tile: the slices' sums through shared memory, added in slice order by the
    // block's first 64 threads, one column each.
    let cols_per_block = b.const_u32(8 * AWQ_GEMV_WORDS);
    let slot = b.fma(slice, block_words, lane_word);
    let reader = b.lt(tid, cols_per_block);
    let col_in_word = b.and(tid, seven);
    let word_of_col = b.shr(tid, three);
    let col = b.fma(bx, cols_per_block, tid);
    let stride = b.const_u32(SUMS_STRIDE);
    for r in 0..cfg.m_tile {
        for c in 0..8u32 {
            let base = b.const_u32(c * SUMS_STRIDE);
            let idx = b.add(base, slot);
            let p = b.ptr_add(sums, idx);
            b.store(p, acc[(r * 8 + c) as usize]);
        }
        b.barrier();
        let row = offset(&mut b, row0, r);
        let row_ok = b.lt(row, m);
        let col_ok = b.lt(col, n);
        let store = b.and(reader, row_ok);
        let store = b.and(store, col_ok);
        b.if_then(store, |b| {
            let base = b.mul(col_in_word, stride);
            let base = b.add(base, word_of_col);
            let zero = b.const_u32(0);
            let total = b.for_range(zero, slices, one, &[zero_f], |b, s, total| {
                let idx = b.fma(s, block_words, base);
                let p = b.ptr_add(sums, idx);
                let v = b.load(p);
                vec![b.add(total[0], v)]
            })[0];
            let total = match bias {
                Some(bias) => {
                    let bv = load_f32(b, bias, col);
                    b.add(total, bv)
                }
                None => total,
            };
            let out_row = row_ptr(b, out, row, n);
            store_from_f32(b, out_row, col, total);
        });
        b.barrier();
    }
    b.finish()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AwqDequantizeConfig {
    /// The dtype of the dense weight written.
    pub dtype: ScalarType,
}

impl AwqDequantizeConfig {
    /// `awq_dequantize.bf16`.
    pub fn id(&self) -> String {
        format!("awq_dequantize.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`awq_dequantize`], in order.
    pub struct AwqDequantizeParams, AwqDequantizeValues for AwqDequantizeConfig as cfg {
        qweight: tensor(ScalarType::I32),
        qzeros: tensor(ScalarType::I32),
        scales: tensor(ScalarType::F16),
        out: tensor(cfg.dtype),
        n: scalar(u32),
        k: scalar(u32),
        group_size: scalar(u32),
    }
}

/// Build the dequantisation: out `[N, K]` from qweight, qzeros, scales; then n, k, group_size
/// (`u32`). Grid: `(ceil(K / 32), ceil(N / 256))`, block [`AWQ_DEQUANT_THREADS`]: block `(x, y)`
/// reads rows `32x..` of words `32y..` (lanes along the words), then writes their columns
/// (lanes along `K`).
pub fn awq_dequantize(cfg: &AwqDequantizeConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let AwqDequantizeValues { qweight, qzeros, scales, out, n, k, group_size } =
        AwqDequantizeParams::declare(&mut b, cfg);
    b.launch_bounds(AWQ_DEQUANT_THREADS, None);
    let tile_len = AWQ_DEQUANT_TILE;
    // One more word per tile row: the column reads of the second phase hit 32 banks.
    let tile = b.shared_array("tile", ScalarType::U32, tile_len * (tile_len + 1));
    let tile = b.shared_ptr(tile);

    let tid = b.thread_id_x();
    let lane = b.lane_id();
    let five = b.const_u32(5);
    let warp = b.shr(tid, five);
    let three = b.const_u32(3);
    let words = b.shr(n, three);
    let t = b.const_u32(tile_len);
    let pitch = b.const_u32(tile_len + 1);
    let bx = b.block_id_x();
    let by = b.block_id_y();
    let k_base = b.mul(bx, t);
    let w_base = b.mul(by, t);
    let rows_per_pass = AWQ_DEQUANT_THREADS / 32;

    let word = b.add(w_base, lane);
    let word_ok = b.lt(word, words);
    for p in 0..tile_len / rows_per_pass {
        let r = b.const_u32(p * rows_per_pass);
        let kk = b.add(warp, r);
        let kg = b.add(k_base, kk);
        let k_ok = b.lt(kg, k);
        let ok = b.and(k_ok, word_ok);
        b.if_then(ok, |b| {
            let row = row_ptr(b, qweight, kg, words);
            let w = load_word(b, row, word);
            let idx = b.fma(kk, pitch, lane);
            let p = b.ptr_add(tile, idx);
            b.store(p, w);
        });
    }
    b.barrier();

    let kg = b.add(k_base, lane);
    let k_ok = b.lt(kg, k);
    b.if_then(k_ok, |b| {
        let g = b.div(kg, group_size);
        let zeros = row_ptr(b, qzeros, g, words);
        let scale_row = row_ptr(b, scales, g, n);
        for p in 0..tile_len / rows_per_pass {
            let r = b.const_u32(p * rows_per_pass);
            let jj = b.add(warp, r);
            let wg = b.add(w_base, jj);
            let w_ok = b.lt(wg, words);
            b.if_then(w_ok, |b| {
                let idx = b.fma(lane, pitch, jj);
                let tp = b.ptr_add(tile, idx);
                let qw = b.load(tp);
                let zw = load_word(b, zeros, wg);
                let eight = b.const_u32(8);
                let first_col = b.mul(wg, eight);
                for c in 0..8 {
                    let col = offset(b, first_col, c as u32);
                    let s = load_f32(b, scale_row, col);
                    let q = nibble(b, qw, c);
                    let z = nibble(b, zw, c);
                    let w = weight(b, cfg.dtype, q, z, s);
                    let out_row = row_ptr(b, out, col, k);
                    store_from_f32(b, out_row, kg, w);
                }
            });
        }
    });
    b.finish()
}

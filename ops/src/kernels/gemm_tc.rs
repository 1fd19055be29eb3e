//! Tensor-core GEMM: `y[M, N] = x[M, K] · w[N, K]ᵀ` (both row-major, `K` contiguous: the
//! layout of `nn.Linear`), f16 or bf16 inputs, f32 accumulation with `mma.m16n8k16`, output in
//! the input dtype.
//!
//! Each block of 4 warps computes a `64 × 64` tile of `y`; warp `w` owns the `32 × 32` warp
//! tile at `(32 * (w / 2), 32 * (w % 2))`, i.e. `2 × 4` mma tiles of `16 × 8`. Tiles of `x` and
//! `w`, [`BK`] deep in `k`, are staged through shared memory as 16-bit values with 16-byte
//! global loads (the host requires `K % 8 == 0` and 16-byte aligned bases), zero-filled past
//! the matrix edges. Shared rows are padded to [`SROW`] elements (80 bytes) so the 8 rows one
//! `ldmatrix` reads fall in distinct banks while staying 16-byte aligned.
//!
//! Fragments (see `Op::Mma` / `Op::LdMatrix`): A (`x` rows `m`, columns `k`) is `ldmatrix.x4`
//! of the four 8x8 quadrants (rows 0-7/8-15 × k 0-7, then × k 8-15); B is `16 × 8` with rows
//! `k`, whose column `n` is row `n` of `w`, so `ldmatrix.x2` (not transposed) of `w`'s rows
//! `n` at k 0-7 and k 8-15 gives exactly B's registers.

use ruda_ir::{AddrSpace, Kernel, KernelBuilder, MmaType, ScalarType, Type, Value, VerifyError};

use super::common::store_from_f32;

const BM: u32 = 64;
const BN: u32 = 64;
const BK: u32 = 32;
/// Padded shared row length in 16-bit elements (`BK + 8`: 80 bytes).
const SROW: u32 = BK + 8;
const THREADS: u32 = 128;
/// 16-byte chunks (8 elements) per staged row.
const CHUNKS_PER_ROW: u32 = BK / 8;
/// mma tiles per warp along `m` (16 rows each) and `n` (8 columns each).
const WARP_TILES_M: u32 = 2;
const WARP_TILES_N: u32 = 4;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmTcConfig {
    /// The input (and output) type.
    pub ty: MmaType,
}

impl GemmTcConfig {
    /// The config for a tensor dtype, if tensor cores take it.
    pub fn for_dtype(dtype: ScalarType) -> Option<GemmTcConfig> {
        match dtype {
            ScalarType::F16 => Some(GemmTcConfig { ty: MmaType::F16 }),
            ScalarType::BF16 => Some(GemmTcConfig { ty: MmaType::BF16 }),
            _ => None,
        }
    }

    pub fn dtype(&self) -> ScalarType {
        match self.ty {
            MmaType::F16 => ScalarType::F16,
            MmaType::BF16 => ScalarType::BF16,
        }
    }

    pub fn id(&self) -> String {
        format!("gemm.{}.tc{BM}x{BN}", self.dtype())
    }

    /// Grid for an `M × N` output: `(ceil(N / 64), ceil(M / 64))`.
    pub fn grid(m: u32, n: u32) -> [u32; 3] {
        [n.div_ceil(BN), m.div_ceil(BM), 1]
    }

    /// Elements of `k` each 16-byte load covers: `K` must be a multiple.
    pub const K_MULTIPLE: u32 = 8;
    pub const THREADS: u32 = THREADS;
}

/// Build the kernel. Parameters: x, w, y, m, n, k (all `u32` dimensions).
pub fn gemm_tc(cfg: &GemmTcConfig) -> Result<Kernel, VerifyError> {
    let mma_ty = cfg.ty;
    let dtype = cfg.dtype();
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let x_ptr = b.param("x", Type::Ptr(AddrSpace::Global, dtype));
    let w_ptr = b.param("w", Type::Ptr(AddrSpace::Global, dtype));
    let y_ptr = b.param("y", Type::Ptr(AddrSpace::Global, dtype));
    let m = b.param("m", Type::U32);
    let n = b.param("n", Type::U32);
    let k = b.param("k", Type::U32);
    b.launch_bounds(THREADS, None);
    let x_tile = b.shared_array("x_tile", dtype, BM * SROW);
    let w_tile = b.shared_array("w_tile", dtype, BN * SROW);

    let tid = b.thread_id_x();
    let lane = b.lane_id();
    let c32 = b.const_u32(32);
    let warp = b.div(tid, c32);
    let (one, two, four, eight) = (b.const_u32(1), b.const_u32(2), b.const_u32(4), b.const_u32(8));
    let wm = b.div(warp, two);
    let wn = b.rem(warp, two);
    let warp_row = b.mul(wm, c32);
    let warp_col = b.mul(wn, c32);
    let (bm_c, bn_c) = (b.const_u32(BM), b.const_u32(BN));
    let block_col = b.block_id_x();
    let block_row = b.block_id_y();
    let col0 = b.mul(block_col, bn_c);
    let row0 = b.mul(block_row, bm_c);
    let x_smem = b.shared_ptr(x_tile);
    let w_smem = b.shared_ptr(w_tile);
    let x_gmem32 = b.ptr_cast(x_ptr, ScalarType::U32);
    let w_gmem32 = b.ptr_cast(w_ptr, ScalarType::U32);
    let x_smem32 = b.ptr_cast(x_smem, ScalarType::U32);
    let w_smem32 = b.ptr_cast(w_smem, ScalarType::U32);
    let srow = b.const_u32(SROW);
    let zero_u = b.const_u32(0);
    let zero_chunk = b.make_vector(&[zero_u; 4]);

    // ldmatrix row addresses (element offsets into a tile, before the k step and tile offset).
    // A (x4): lane l addresses row l % 16 of the 16-row tile, at k 8 * (l / 16).
    let c16 = b.const_u32(16);
    let a_r = b.rem(lane, c16);
    let a_k8 = b.div(lane, c16);
    let a_k = b.mul(a_k8, eight);
    let a_row = b.add(warp_row, a_r);
    let a_off = b.fma(a_row, srow, a_k);
    // B (x2): lane l addresses row l % 8 of the 8 `w` rows, at k 8 * ((l / 8) % 2); lanes
    // 16-31 repeat lanes 0-15 (their addresses are ignored).
    let b_r = b.rem(lane, eight);
    let b_m = b.div(lane, eight);
    let b_m = b.rem(b_m, two);
    let b_k = b.mul(b_m, eight);
    let b_row = b.add(warp_col, b_r);
    let b_off = b.fma(b_row, srow, b_k);

    let zero_f = b.const_f32(0.0);
    let tiles = (WARP_TILES_M * WARP_TILES_N) as usize;
    let init = vec![zero_f; tiles * 4];
    let bk_c = b.const_u32(BK);

    let acc = b.for_range(zero_u, k, bk_c, &init, |b, k0, acc| {
        for (gmem32, smem32, dim, base) in [(x_gmem32, x_smem32, m, row0), (w_gmem32, w_smem32, n, col0)] {
            for r in 0..(BM * CHUNKS_PER_ROW / THREADS) {
                let e = offset(b, tid, r * THREADS);
                let cpr = b.const_u32(CHUNKS_PER_ROW);
                let row = b.div(e, cpr);
                let chunk = b.rem(e, cpr);
                let kc = b.mul(chunk, eight);
                let grow = b.add(base, row);
                let gk = b.add(k0, kc);
                let row_ok = b.lt(grow, dim);
                let k_ok = b.lt(gk, k);
                let ok = b.and(row_ok, k_ok);
                // Shared offset in u32 units: (row * SROW + kc) / 2.
                let half_srow = b.const_u32(SROW / 2);
                let half_kc = b.mul(chunk, four);
                let s = b.fma(row, half_srow, half_kc);
                let sp = b.ptr_add(smem32, s);
                b.if_else(
                    ok,
                    |b| {
                        let idx = b.fma(grow, k, gk);
                        let idx = b.shr(idx, one);
                        let gp = b.ptr_add(gmem32, idx);
                        let v = b.load_vec(gp, 4);
                        b.store(sp, v);
                        vec![]
                    },
                    |b| {
                        b.store(sp, zero_chunk);
                        vec![]
                    },
                );
            }
        }
        b.barrier();
        let mut acc: Vec<Value> = acc.to_vec();
        for ks in 0..(BK / 16) {
            let a_frags: Vec<Value> = (0..WARP_TILES_M)
                .map(|i| {
                    let o = offset(b, a_off, i * 16 * SROW + ks * 16);
                    let p = b.ptr_add(x_smem, o);
                    b.ldmatrix(p, 4, false)
                })
                .collect();
            let b_frags: Vec<Value> = (0..WARP_TILES_N)
                .map(|j| {
                    let o = offset(b, b_off, j * 8 * SROW + ks * 16);
                    let p = b.ptr_add(w_smem, o);
                    b.ldmatrix(p, 2, false)
                })
                .collect();
            for i in 0..WARP_TILES_M as usize {
                for j in 0..WARP_TILES_N as usize {
                    let t = (i * WARP_TILES_N as usize + j) * 4;
                    let c = b.make_vector(&acc[t..t + 4]);
                    let d = b.mma_m16n8k16(mma_ty, a_frags[i], b_frags[j], c);
                    for (e, slot) in acc[t..t + 4].iter_mut().enumerate() {
                        *slot = b.extract(d, e as u8);
                    }
                }
            }
        }
        // The tiles are overwritten next iteration only after every warp has read them.
        b.barrier();
        acc
    });

    // Element e of mma tile (i, j) is y[16 i + g + 8 (e / 2)][8 j + 2 t + e % 2] of the warp tile.
    let g = b.div(lane, four);
    let t = b.rem(lane, four);
    let t2 = b.mul(t, two);
    let r_base = b.add(row0, warp_row);
    let r_base = b.add(r_base, g);
    let c_base = b.add(col0, warp_col);
    let c_base = b.add(c_base, t2);
    for i in 0..WARP_TILES_M {
        for j in 0..WARP_TILES_N {
            for e in 0..4u32 {
                let row = offset(&mut b, r_base, 16 * i + 8 * (e / 2));
                let col = offset(&mut b, c_base, 8 * j + e % 2);
                let row_ok = b.lt(row, m);
                let col_ok = b.lt(col, n);
                let ok = b.and(row_ok, col_ok);
                let value = acc[((i * WARP_TILES_N + j) * 4 + e) as usize];
                b.if_then(ok, |b| {
                    let idx = b.fma(row, n, col);
                    store_from_f32(b, y_ptr, idx, value);
                });
            }
        }
    }
    b.finish()
}

/// `v + constant` (the constant folded away when zero).
#[track_caller]
fn offset(b: &mut KernelBuilder, v: Value, constant: u32) -> Value {
    if constant == 0 {
        return v;
    }
    let c = b.const_u32(constant);
    b.add(v, c)
}

//! Tensor-core GEMM family: `y[M, N] = x[M, K] · w[N, K]ᵀ (+ bias[N]) (+ residual[M, N])`,
//! both operands row-major with `K` contiguous (the layout of `nn.Linear`), f16 or bf16 inputs,
//! f32 accumulation with `mma.m16n8k16`, output in bf16, f16 or f32, optionally batched over
//! `grid.z`.
//!
//! **Tiles.** A block computes a [`TcTile`] (`BM × BN`) of `y` with warps laid out
//! `warps_m × warps_n`, each owning a `WM × WN` warp tile of `WM / 16 × WN / 8` mma tiles.
//! Tiles of `x` and `w`, [`BK`] deep in `k`, are staged through shared memory with 16-byte
//! `cp.async` copies (the host requires `K % 8 == 0` and 16-byte aligned bases), zero-filled
//! past the matrix edges by a source size of 0.
//!
//! **Pipeline.** `stages` shared buffers form a ring: the copies of k-tile `t + stages - 1`
//! are in flight while the mma consume k-tile `t`, with one commit group per k-tile and one
//! barrier per k-step (see `k_loop`).
//!
//! **Swizzle.** A staged row is `BK = 32` halves: 64 bytes, four 16-byte chunks, so two rows
//! fill the 128 bytes of the 32 four-byte banks. Chunk `c` of row `r` is stored at chunk
//! `c ^ ((r >> 1) & 3)` of its row ([`swizzle_chunk`]). One phase of an `ldmatrix` reads 8
//! rows `r0..r0 + 8` (`r0` a multiple of 8) at one logical chunk `c`; its 16-byte bank group
//! is `(4 * (r & 1) + (c ^ ((r >> 1) & 3))) % 8`, and as `r` runs over the 8 rows,
//! `(r & 1, (r >> 1) & 3)` takes all 8 values, so the 8 groups are distinct: no conflicts. The
//! stores of a quarter warp (8 consecutive 16-byte chunks: two rows × four chunks) hit 8
//! distinct groups by the same argument. Row offsets that are multiples of 8 leave the swizzle
//! unchanged, so per-mma-tile offsets stay compile-time constants. (Padding rows to 80 bytes
//! would also avoid conflicts, at 25% more shared memory.)
//!
//! **Layouts.** Either operand may instead be stored with its own dimension contiguous
//! ([`Major::Mn`]: `x` as `[K, M]`, `w` as `[K, N]`, rows `ld` apart; the grouped GEMMs of the
//! experts' backward). Its tile is staged as `BK` rows of `k`, each the tile's width (64 or 128
//! halves: 8 or 16 chunks), chunk `c` of row `r` at chunk `c ^ (r & 7)` ([`swizzle_mn_chunk`]),
//! and read with `ldmatrix.trans`. One phase reads 8 consecutive `k` rows at one logical chunk:
//! rows are a multiple of 128 bytes, so its bank group is `c ^ (r & 7)` mod 8, distinct over the
//! 8 rows; a quarter warp's stores are 8 aligned consecutive chunks of one row, permuted by the
//! XOR. The tile offsets of a warp's mma tiles then change the swizzled chunk, so each lane
//! keeps one address per mma tile (instead of one per k step) and the k steps are 16 rows apart.
//!
//! **Fragments** (see `Op::Mma` / `Op::LdMatrix`): A (`x` rows `m`, columns `k`) is
//! `ldmatrix.x4` of the four 8x8 quadrants (rows 0-7/8-15 × k 0-7, then × k 8-15); B is
//! `16 × 8` with rows `k`, whose column `n` is row `n` of `w`, so one `ldmatrix.x4` (not
//! transposed) of `w`'s rows `n..n + 8` and `n + 8..n + 16` at k 0-7 and k 8-15 gives the B
//! registers of two adjacent mma tiles. Transposed, a stored 8 × 8 matrix of rows `k` gives
//! lane `(g, t)` its elements `[2t][g]` and `[2t + 1][g]`: the same fragments from the other
//! layout.
//!
//! **Epilogue.** `acc + bias[col]` then `+ residual[row, col]`, in f32, rounded once to the
//! output type (nearest even). A lane's two adjacent columns are one 2-element store (and
//! residual load) when `N` is even; the host requires `y` and `residual` to start at even
//! elements. PyTorch's `F.linear(x, w, b) + r` in bf16 rounds twice (after
//! the bias epilogue, then after the add), so results may differ from it by one rounding of
//! the output type; with an f32 output they agree up to the f32 summation order. The bias has
//! the input dtype, the residual the output dtype; `residual` may alias `y` (each element is
//! read before the same thread writes it).

use ruda_ir::{Kernel, KernelBuilder, MmaType, ScalarType, SharedId, SpecialReg, Value, VerifyError};

use crate::blocks::{load_f32, offset, store_from_f32, to_f32};
use crate::gemm::load::{k_loop, swizzle, swizzle_mn, Chunk, Segment, CHUNKS_PER_ROW};
pub use crate::gemm::load::{swizzle_chunk, swizzle_mn_chunk};
use crate::gemm::tile::GemmTile;
pub use crate::gemm::tile::{TcTile, BK, STAGES};

/// One configuration of the family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmTcConfig {
    /// The input type of `x` and `w` (and of the bias).
    pub ty: MmaType,
    /// The output type (f16, bf16 or f32; also the residual's).
    pub out: ScalarType,
    pub tile: TcTile,
    /// Shared-memory stages filled by `cp.async` (at least 2; see [`STAGES`]).
    pub stages: u32,
    /// Adds `bias[N]`.
    pub bias: bool,
    /// Adds `residual[M, N]`.
    pub residual: bool,
    /// `grid.z` runs over a batch; `x`, `w`, `y` (and the residual, like `y`) advance by
    /// per-batch strides given as parameters (`w_batch = 0` shares one weight).
    pub batched: bool,
}

impl GemmTcConfig {
    /// Elements of `k` each 16-byte load covers: `K` must be a multiple.
    pub const K_MULTIPLE: u32 = 8;

    /// The plain configuration: output in the input dtype, no epilogue, no batch.
    pub fn new(ty: MmaType, tile: TcTile, stages: u32) -> GemmTcConfig {
        let out = mma_dtype(ty);
        GemmTcConfig { ty, out, tile, stages, bias: false, residual: false, batched: false }
    }

    /// The tensor-core input type of a tensor dtype, if tensor cores take it.
    pub fn mma_type(dtype: ScalarType) -> Option<MmaType> {
        match dtype {
            ScalarType::F16 => Some(MmaType::F16),
            ScalarType::BF16 => Some(MmaType::BF16),
            _ => None,
        }
    }

    pub fn dtype(&self) -> ScalarType {
        mma_dtype(self.ty)
    }

    /// `gemm.bf16.tc128x128.s1` then `.out_f32` (output not the input dtype), `.bias`,
    /// `.residual`, `.batch`.
    pub fn id(&self) -> String {
        let mut id = format!("gemm.{}.{}.s{}", self.dtype(), self.tile.name(), self.stages);
        if self.out != self.dtype() {
            id.push_str(&format!(".out_{}", self.out));
        }
        for (on, s) in [(self.bias, ".bias"), (self.residual, ".residual"), (self.batched, ".batch")] {
            if on {
                id.push_str(s);
            }
        }
        id
    }

    pub fn threads(&self) -> u32 {
        self.tile.threads()
    }

    /// Grid for `batch` outputs of `M × N`: `(ceil(N / BN), ceil(M / BM), batch)`.
    pub fn grid(&self, m: u32, n: u32, batch: u32) -> [u32; 3] {
        let (bm, bn) = self.tile.dims();
        [n.div_ceil(bn), m.div_ceil(bm), batch]
    }

    /// Bytes of static shared memory.
    pub fn shared_bytes(&self) -> u32 {
        let (bm, bn) = self.tile.dims();
        self.stages * (bm + bn) * BK * 2
    }
}

/// The registered configurations: every tile and pipeline depth plain in bf16 (any may be
/// picked or tuned) and the deepest in f16; Qwen's fused epilogues (the QKV bias, the residual
/// add after `o_proj` / `down_proj`) on every bf16 tile; f32 output, both addends together and
/// the batched form once or twice each.
pub fn registered_configs() -> Vec<GemmTcConfig> {
    use MmaType::{BF16, F16};
    let deep = *STAGES.last().unwrap_or(&1);
    let mut cfgs: Vec<GemmTcConfig> = Vec::new();
    for tile in TcTile::ALL {
        cfgs.extend(STAGES.map(|s| GemmTcConfig::new(BF16, tile, s)));
        cfgs.push(GemmTcConfig::new(F16, tile, deep));
    }
    for tile in TcTile::ALL {
        cfgs.push(GemmTcConfig { bias: true, ..GemmTcConfig::new(BF16, tile, deep) });
        cfgs.push(GemmTcConfig { residual: true, ..GemmTcConfig::new(BF16, tile, deep) });
    }
    let (small, large) = (TcTile::T64x64, TcTile::T128x128W4);
    cfgs.push(GemmTcConfig { bias: true, residual: true, ..GemmTcConfig::new(F16, small, deep) });
    cfgs.push(GemmTcConfig { out: ScalarType::F32, ..GemmTcConfig::new(BF16, large, deep) });
    cfgs.push(GemmTcConfig { out: ScalarType::F32, bias: true, ..GemmTcConfig::new(F16, small, deep) });
    cfgs.push(GemmTcConfig { batched: true, ..GemmTcConfig::new(BF16, small, deep) });
    // (At 4 warps, NVRTC's code for this one spills on sm_80.)
    cfgs.push(GemmTcConfig { batched: true, out: ScalarType::F32, ..GemmTcConfig::new(F16, TcTile::T128x128, deep) });
    cfgs
}

fn mma_dtype(ty: MmaType) -> ScalarType {
    match ty {
        MmaType::F16 => ScalarType::F16,
        MmaType::BF16 => ScalarType::BF16,
    }
}

crate::kernel_params! {
    /// The parameters of [`gemm_tc`], in order: the bias and residual with those epilogues,
    /// the batch strides (elements) when batched.
    pub struct GemmTcParams, GemmTcValues for GemmTcConfig as cfg {
        x: tensor(cfg.dtype()),
        w: tensor(cfg.dtype()),
        bias: opt_tensor(cfg.dtype(), cfg.bias),
        residual: opt_tensor(cfg.out, cfg.residual),
        y: tensor(cfg.out),
        m: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
        x_batch: opt_scalar(u32, cfg.batched),
        w_batch: opt_scalar(u32, cfg.batched),
        y_batch: opt_scalar(u32, cfg.batched),
    }
}

/// Build the kernel. Parameters: `x`, `w`, `[bias]`, `[residual]`, `y`, `m`, `n`, `k`, and
/// when batched `x_batch`, `w_batch`, `y_batch` (element strides between batch entries; the
/// residual uses `y_batch`). All dimensions `u32`.
pub fn gemm_tc(cfg: &GemmTcConfig) -> Result<Kernel, VerifyError> {
    if !(2..=8).contains(&cfg.stages) || !matches!(cfg.out, ScalarType::F16 | ScalarType::BF16 | ScalarType::F32) {
        return Err(VerifyError {
            kernel: cfg.id().replace('.', "_"),
            op: "kernel".into(),
            loc: None,
            message: format!(
                "gemm_tc: {} stages and output {} (2 to 8 stages; f16, bf16 or f32 output)",
                cfg.stages, cfg.out
            ),
            context: String::new(),
        });
    }
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GemmTcValues {
        x: x_param,
        w: w_param,
        bias: bias_ptr,
        residual: res_param,
        y: y_param,
        m,
        n,
        k,
        x_batch,
        w_batch,
        y_batch,
    } = GemmTcParams::declare(&mut b, cfg);
    let tiles = tc_shared(&mut b, cfg);

    // Batch entry `ctaid.z`: advance the base pointers.
    let (x_ptr, w_ptr, y_ptr, res_ptr) = if let (Some(xs), Some(ws), Some(ys)) = (x_batch, w_batch, y_batch) {
        let z = b.special(SpecialReg::CtaidZ);
        let (xo, wo, yo) = (b.mul(z, xs), b.mul(z, ws), b.mul(z, ys));
        let res = res_param.map(|r| b.ptr_add(r, yo));
        (b.ptr_add(x_param, xo), b.ptr_add(w_param, wo), b.ptr_add(y_param, yo), res)
    } else {
        (x_param, w_param, y_param, res_param)
    };
    let io = TcOperands::k_major(x_ptr, y_ptr, bias_ptr, res_ptr, n, k);
    tc_block(&mut b, cfg, io, tiles, |b, block_row, bm| TcRows {
        row0: b.mul(block_row, bm),
        m,
        w: w_ptr,
        w_split: None,
        k_end: k,
        ldy: n,
    });
    b.finish()
}

/// How an operand of [`tc_block`] is stored.
#[derive(Clone, Copy)]
pub(crate) enum Major {
    /// `K` contiguous: rows of `x` (`[M, K]`) or of `w` (`[N, K]`), `k` elements apart.
    K,
    /// Its own dimension contiguous: `x` as `[K, M]`, `w` as `[K, N]`, rows `ld` elements apart.
    /// The host keeps that dimension and `ld` multiples of 8 (whole 16-byte chunks).
    Mn { ld: Value },
}

/// The operands of [`tc_block`] other than the rows: `x`, `y`, the optional epilogue addends,
/// `n`, `k` (the row stride of a `K`-major operand) and how `x` and `w` are stored.
pub(crate) struct TcOperands {
    pub x: Value,
    pub y: Value,
    pub bias: Option<Value>,
    pub residual: Option<Value>,
    pub n: Value,
    pub k: Value,
    pub x_major: Major,
    pub w_major: Major,
}

impl TcOperands {
    /// Both operands `K`-major (the layout of `nn.Linear`).
    pub fn k_major(x: Value, y: Value, bias: Option<Value>, residual: Option<Value>, n: Value, k: Value) -> Self {
        TcOperands { x, y, bias, residual, n, k, x_major: Major::K, w_major: Major::K }
    }
}

/// A `w` stored as two matrices along `k`: rows `k ≥ from_k` are rows `k - from_k` of `w`
/// (a [`Major::Mn`] weight: split gate and up; `K`-major weights are never split).
#[derive(Clone, Copy)]
pub(crate) struct WSplit {
    pub w: Value,
    pub from_k: Value,
}

/// The rows a block computes and the weight it multiplies them by (see
/// [`super::simt::BlockRows`]): rows `row0..` below `m` of `x` and `y`, `w` (and where its
/// later `k` rows live if it is two matrices), the `k` loop's end (0 for a block with nothing
/// to do) and the elements between rows of `y` (and the residual; the host keeps it even where
/// `n` is, for the paired stores).
pub(crate) struct TcRows {
    pub row0: Value,
    pub m: Value,
    pub w: Value,
    pub w_split: Option<WSplit>,
    pub k_end: Value,
    pub ldy: Value,
}

/// Launch bounds and the staged tiles of `x` and `w` (in that order: the first declarations
/// after the parameters).
pub(crate) fn tc_shared(b: &mut KernelBuilder, cfg: &GemmTcConfig) -> (SharedId, SharedId) {
    let (bm, bn) = cfg.tile.dims();
    b.launch_bounds(cfg.threads(), None);
    let x_tile = b.shared_array("x_tile", cfg.dtype(), cfg.stages * bm * BK);
    let w_tile = b.shared_array("w_tile", cfg.dtype(), cfg.stages * bn * BK);
    (x_tile, w_tile)
}

/// The tensor-core GEMM's work for one block: fragments, the pipelined `k` loop, the
/// epilogue. `rows` is called with the block's row index (`ctaid.y`) and `BM` where the plain
/// kernel computes its first row.
pub(crate) fn tc_block(
    b: &mut KernelBuilder,
    cfg: &GemmTcConfig,
    io: TcOperands,
    (x_tile, w_tile): (SharedId, SharedId),
    rows: impl FnOnce(&mut KernelBuilder, Value, Value) -> TcRows,
) {
    let TcOperands { x: x_ptr, y: y_ptr, bias: bias_ptr, residual: res_ptr, n, k, x_major, w_major } = io;
    let (bm, bn) = cfg.tile.dims();
    let warps_n = cfg.tile.warps().1;
    let (wm, wn) = cfg.tile.warp_tile();
    let (tiles_m, tiles_n) = (wm / 16, wn / 8);
    let threads = cfg.threads();
    let tid = b.thread_id_x();
    let lane = b.lane_id();
    let c32 = b.const_u32(32);
    let warp = b.div(tid, c32);
    let (one, two, four, eight) = (b.const_u32(1), b.const_u32(2), b.const_u32(4), b.const_u32(8));
    let warps_n_c = b.const_u32(warps_n);
    let wmi = b.div(warp, warps_n_c);
    let wni = b.rem(warp, warps_n_c);
    let (wm_c, wn_c) = (b.const_u32(wm), b.const_u32(wn));
    let warp_row = b.mul(wmi, wm_c);
    let warp_col = b.mul(wni, wn_c);
    let (bm_c, bn_c) = (b.const_u32(bm), b.const_u32(bn));
    let block_col = b.block_id_x();
    let block_row = b.block_id_y();
    let col0 = b.mul(block_col, bn_c);
    let TcRows { row0, m, w: w_ptr, w_split, k_end, ldy } = rows(b, block_row, bm_c);
    let x_smem = b.shared_ptr(x_tile);
    let w_smem = b.shared_ptr(w_tile);

    // The chunks this thread copies per k-tile: thread `e` (plus multiples of the block size)
    // takes chunk `e` of the `x` tile, then of the `w` tile (see `k_major_chunk`, `mn_chunk`).
    let mut chunks: Vec<(bool, Chunk)> = Vec::new();
    for (is_x, width, dim, base, major) in [(true, bm, m, row0, x_major), (false, bn, n, col0, w_major)] {
        let segment = match (is_x, w_split, major) {
            (false, Some(split), Major::Mn { ld }) => {
                Some(Segment { base: split.w, from_k: split.from_k, skip: b.mul(split.from_k, ld) })
            }
            _ => None,
        };
        for r in 0..(width * CHUNKS_PER_ROW / threads) {
            let e = offset(b, tid, r * threads);
            let mut chunk = match major {
                Major::K => k_major_chunk(b, e, base, dim, k),
                Major::Mn { ld } => mn_chunk(b, e, width, base, dim, ld),
            };
            chunk.segment = segment;
            chunks.push((is_x, chunk));
        }
    }

    // ldmatrix row addresses (element offsets into a stage).
    // A (x4): lane l addresses row l % 16 of the 16-row tile, logical chunk l / 16 (+ 2 ks).
    // B (x4): lane l addresses matrix q = l / 8: row l % 8 + 8 (q / 2), logical chunk q % 2.
    let a_frags = match x_major {
        Major::K => {
            let c16 = b.const_u32(16);
            let a_r = b.rem(lane, c16);
            let a_c = b.div(lane, c16);
            let a_row = b.add(warp_row, a_r);
            k_major_frags(b, a_row, a_c)
        }
        Major::Mn { .. } => mn_frags(b, lane, warp_row, bm, tiles_m, true),
    };
    let b_frags = match w_major {
        Major::K => {
            let q = b.div(lane, eight);
            let b_r = b.rem(lane, eight);
            let q_hi = b.shr(q, one);
            let b_r = b.fma(q_hi, eight, b_r);
            let b_c = b.and(q, one);
            let b_row = b.add(warp_col, b_r);
            k_major_frags(b, b_row, b_c)
        }
        Major::Mn { .. } => mn_frags(b, lane, warp_col, bn, tiles_n / 2, false),
    };

    let zero_f = b.const_f32(0.0);
    let acc_len = (tiles_m * tiles_n * 4) as usize;
    let init = vec![zero_f; acc_len];
    let acc = k_loop(
        b,
        GemmTile { tile: cfg.tile, stages: cfg.stages },
        &chunks,
        [x_ptr, w_ptr],
        [x_smem, w_smem],
        k_end,
        &init,
        |b, (x_stage, w_stage), acc| mma_k_tile(b, cfg, x_stage, w_stage, &a_frags, &b_frags, acc),
    );

    // Element e of mma tile (i, j) is y[16 i + g + 8 (e / 2)][8 j + 2 t + e % 2] of the warp tile.
    let g = b.div(lane, four);
    let t = b.rem(lane, four);
    let t2 = b.mul(t, two);
    let r_base = b.add(row0, warp_row);
    let r_base = b.add(r_base, g);
    let c_base = b.add(col0, warp_col);
    let c_base = b.add(c_base, t2);
    // Columns (j, e % 2): index, in range, and the bias there (0 past the edge).
    let cols: Vec<(Value, Value, Option<Value>)> = (0..tiles_n * 2)
        .map(|jc| {
            let col = offset(b, c_base, 8 * (jc / 2) + jc % 2);
            let ok = b.lt(col, n);
            let bias = bias_ptr.map(|bp| b.if_else(ok, |b| vec![load_f32(b, bp, col)], |b| vec![b.const_f32(0.0)])[0]);
            (col, ok, bias)
        })
        .collect();
    // Each lane holds column pairs (2t, 2t + 1): with `n` even an in-range pair is one aligned
    // 2-element access (the host requires `y` and `residual` to start at even elements).
    let n_odd = b.and(n, one);
    let zero = b.const_u32(0);
    let n_even = b.eq(n_odd, zero);
    for ir in 0..tiles_m * 2 {
        let row = offset(b, r_base, 16 * (ir / 2) + 8 * (ir % 2));
        let row_ok = b.lt(row, m);
        let row_idx = b.mul(row, ldy);
        let pairs_ok = b.and(row_ok, n_even);
        for j in 0..tiles_n as usize {
            let e0 = 2 * (ir % 2) as usize;
            let t = (ir / 2) as usize * tiles_n as usize + j;
            // acc + bias, then + residual at `idx`.
            let with_bias = |b: &mut KernelBuilder, h: usize| {
                let v = acc[t * 4 + e0 + h];
                cols[2 * j + h].2.map_or(v, |bias| b.add(v, bias))
            };
            let (c0, c1_ok) = (cols[2 * j].0, cols[2 * j + 1].1);
            let pair = b.and(pairs_ok, c1_ok);
            b.if_else(
                pair,
                |b| {
                    let idx = b.add(row_idx, c0);
                    let mut v = [with_bias(b, 0), with_bias(b, 1)];
                    if let Some(rp) = res_ptr {
                        let p = b.ptr_add(rp, idx);
                        let r = b.load_vec(p, 2);
                        for (h, v) in v.iter_mut().enumerate() {
                            let r = b.extract(r, h as u8);
                            let r = to_f32(b, r);
                            *v = b.add(*v, r);
                        }
                    }
                    let v = v.map(|v| if cfg.out == ScalarType::F32 { v } else { b.cvt(v, cfg.out) });
                    let v = b.make_vector(&v);
                    let p = b.ptr_add(y_ptr, idx);
                    b.store(p, v);
                    vec![]
                },
                |b| {
                    for h in 0..2 {
                        let (col, col_ok, _) = cols[2 * j + h];
                        let ok = b.and(row_ok, col_ok);
                        b.if_then(ok, |b| {
                            let idx = b.add(row_idx, col);
                            let mut v = with_bias(b, h);
                            if let Some(rp) = res_ptr {
                                let r = load_f32(b, rp, idx);
                                v = b.add(v, r);
                            }
                            store_from_f32(b, y_ptr, idx, v);
                        });
                    }
                    vec![]
                },
            );
        }
    }
}

/// Chunk `e` of a `K`-major tile: row `e / 4` (of `x` or `w`, clamped into the matrix), chunk
/// `e % 4` of its `BK` elements.
#[track_caller]
fn k_major_chunk(b: &mut KernelBuilder, e: Value, base: Value, dim: Value, k: Value) -> Chunk {
    let (one, two, eight) = (b.const_u32(1), b.const_u32(2), b.const_u32(8));
    let bk_c = b.const_u32(BK);
    let row = b.shr(e, two);
    let three = b.const_u32(CHUNKS_PER_ROW - 1);
    let chunk = b.and(e, three);
    let phys = swizzle(b, row, chunk);
    let p8 = b_mul(b, phys, 8);
    let smem = b.fma(row, bk_c, p8);
    let kc = b.mul(chunk, eight);
    let grow = b.add(base, row);
    let row_ok = b.lt(grow, dim);
    let last = b.sub(dim, one);
    let grow = b.min(grow, last);
    let gidx = b.fma(grow, k, kc);
    Chunk { smem, gidx, row_ok, kc, k_stride: None, segment: None }
}

/// Chunk `e` of a tile whose rows are `k` (`width` elements each): row `e / (width / 8)`,
/// chunk `e % (width / 8)`, columns `base + 8 chunk` of a matrix whose rows are `ld` apart.
#[track_caller]
fn mn_chunk(b: &mut KernelBuilder, e: Value, width: u32, base: Value, dim: Value, ld: Value) -> Chunk {
    let per_row = width / 8;
    let shift = b.const_u32(per_row.trailing_zeros());
    let row = b.shr(e, shift);
    let mask = b.const_u32(per_row - 1);
    let chunk = b.and(e, mask);
    let phys = swizzle_mn(b, row, chunk);
    let p8 = b_mul(b, phys, 8);
    let width_c = b.const_u32(width);
    let smem = b.fma(row, width_c, p8);
    let c8 = b_mul(b, chunk, 8);
    let col = b.add(base, c8);
    let row_ok = b.lt(col, dim);
    let gidx = b.fma(row, ld, col);
    Chunk { smem, gidx, row_ok, kc: row, k_stride: Some(ld), segment: None }
}

/// A lane's `ldmatrix` element offsets into a stage for one operand.
enum Frags {
    /// `K`-major: one offset per k step; a warp's mma tiles (pairs for B) are 16 rows apart.
    PerStep(Vec<Value>),
    /// Rows of `k`, `width` wide: one offset per mma tile (pair for B), read transposed; the k
    /// steps are 16 rows apart.
    PerTile { at: Vec<Value>, width: u32 },
}

impl Frags {
    #[track_caller]
    fn at(&self, b: &mut KernelBuilder, ks: u32, tile: u32) -> Value {
        match self {
            Frags::PerStep(at) => offset(b, at[ks as usize], tile * 16 * BK),
            Frags::PerTile { at, width } => offset(b, at[tile as usize], ks * 16 * width),
        }
    }

    fn trans(&self) -> bool {
        matches!(self, Frags::PerTile { .. })
    }
}

/// The `K`-major offsets of the lane's staged row `row` at logical chunk `chunk` (+ 2 per k step).
#[track_caller]
fn k_major_frags(b: &mut KernelBuilder, row: Value, chunk: Value) -> Frags {
    let bk_c = b.const_u32(BK);
    let at = (0..BK / 16)
        .map(|ks| {
            let c = offset(b, chunk, 2 * ks);
            let phys = swizzle(b, row, c);
            let p8 = b_mul(b, phys, 8);
            b.fma(row, bk_c, p8)
        })
        .collect();
    Frags::PerStep(at)
}

/// The offsets of `tiles` mma tiles (A) or tile pairs (B) of 16 columns from `warp_off` in a
/// stage of `k` rows `width` wide. Lane `l` addresses matrix `q = l / 8` at `k` row `l % 8`
/// plus 8 for the second `k` half; A orders its matrices (m 0-7, k 0-7), (m 8-15, k 0-7),
/// (m 0-7, k 8-15), (m 8-15, k 8-15), B (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, ...).
#[track_caller]
fn mn_frags(b: &mut KernelBuilder, lane: Value, warp_off: Value, width: u32, tiles: u32, is_a: bool) -> Frags {
    let (one, three, seven) = (b.const_u32(1), b.const_u32(3), b.const_u32(7));
    let eight = b.const_u32(8);
    let q = b.shr(lane, three);
    let r8 = b.and(lane, seven);
    let q_hi = b.shr(q, one);
    let q_lo = b.and(q, one);
    let (k_half, col_half) = if is_a { (q_hi, q_lo) } else { (q_lo, q_hi) };
    let krow = b.fma(k_half, eight, r8);
    let warp_chunk = b.shr(warp_off, three);
    let chunk0 = b.add(warp_chunk, col_half);
    let width_c = b.const_u32(width);
    let row_base = b.mul(krow, width_c);
    let at = (0..tiles)
        .map(|t| {
            let chunk = offset(b, chunk0, 2 * t);
            let phys = b.xor(chunk, r8);
            let p8 = b_mul(b, phys, 8);
            b.add(row_base, p8)
        })
        .collect();
    Frags::PerTile { at, width }
}

/// The mma work of one staged k-tile: two k steps of ldmatrix + `tiles_m × tiles_n` mma.
fn mma_k_tile(
    b: &mut KernelBuilder,
    cfg: &GemmTcConfig,
    x_stage: Value,
    w_stage: Value,
    a_frags: &Frags,
    b_frags: &Frags,
    acc: &[Value],
) -> Vec<Value> {
    let (wm, wn) = cfg.tile.warp_tile();
    let (tiles_m, tiles_n) = ((wm / 16) as usize, (wn / 8) as usize);
    let mut acc = acc.to_vec();
    for ks in 0..BK / 16 {
        let a_regs: Vec<Value> = (0..tiles_m as u32)
            .map(|i| {
                let o = a_frags.at(b, ks, i);
                let p = b.ptr_add(x_stage, o);
                b.ldmatrix(p, 4, a_frags.trans())
            })
            .collect();
        let mut b_regs = Vec::with_capacity(tiles_n);
        for j2 in 0..(tiles_n / 2) as u32 {
            let o = b_frags.at(b, ks, j2);
            let p = b.ptr_add(w_stage, o);
            let regs = b.ldmatrix(p, 4, b_frags.trans());
            for half in 0..2u8 {
                let lo = b.extract(regs, 2 * half);
                let hi = b.extract(regs, 2 * half + 1);
                b_regs.push(b.make_vector(&[lo, hi]));
            }
        }
        for (i, &a) in a_regs.iter().enumerate() {
            for (j, &bf) in b_regs.iter().enumerate() {
                let t = (i * tiles_n + j) * 4;
                let c = b.make_vector(&acc[t..t + 4]);
                let d = b.mma_m16n8k16(cfg.ty, a, bf, c);
                for (e, slot) in acc[t..t + 4].iter_mut().enumerate() {
                    *slot = b.extract(d, e as u8);
                }
            }
        }
    }
    acc
}

#[track_caller]
fn b_mul(b: &mut KernelBuilder, v: Value, c: u32) -> Value {
    let c = b.const_u32(c);
    b.mul(v, c)
}

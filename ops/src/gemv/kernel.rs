//! GEMV / skinny GEMM for decode: `y[M, N] = x[M, K] · W[N, K]ᵀ` with `M ≤ 16`, `W` row-major
//! (the layout of `nn.Linear` weights). Inputs f32/f16/bf16, products accumulated in `f32` with
//! fused multiply-adds, output in the input dtype (or `f32` partials for split-K).
//!
//! One warp per output column `n` (a row of `W`), [`GEMV_WARPS`] columns per block. Each lane
//! walks the row in chunks: 16 bytes per load (8 halves or 4 floats) in the vector variant, one
//! element in the scalar variant (for `K` not a multiple of the chunk, or unaligned tensors).
//! Chunk `c` of the row goes to lane `c % 32`, so each warp load reads 512 contiguous bytes. The
//! chunks are visited in groups of `32 · unroll` whose `W` loads are all issued before any of
//! them is used (loads in flight are what a memory-bound kernel needs), then a tail of single
//! chunks. `x` is read straight from global memory: it is at most 16 rows, shared by every warp
//! of the GPU, so it stays in L1/L2, and staging it in shared memory would cap `M · K`.
//!
//! Rows of `x` beyond `M` (when `M` is smaller than the compiled `m_tile`) read row `M - 1`
//! again instead of branching, and their results are not stored.
//!
//! Summation order, fixed for a configuration: lane `l` accumulates its chunks in increasing
//! order, elements of a chunk in order; then a butterfly over the 32 lanes. Split-K splits the
//! chunk range into consecutive pieces of `chunks_per_split`, writes one `f32` partial per piece,
//! and [`gemv_reduce`] adds the pieces in order.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::{load_f32, load_halves8, row_ptr, store_from_f32, warp_reduce, Combine};

/// Output columns (warps) per block.
pub const GEMV_WARPS: u32 = 4;
/// Threads per GEMV block.
pub const GEMV_THREADS: u32 = GEMV_WARPS * 32;
/// The compiled row counts of `x`; a launch uses the smallest that is at least `M`.
pub const GEMV_M_TILES: [u32; 5] = [1, 2, 4, 8, 16];
/// Threads per block of the split-K reduction.
pub const GEMV_REDUCE_THREADS: u32 = 256;

/// How a lane reads its chunk of a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GemvLoads {
    /// 16-byte vector loads: needs `K` a multiple of `16 / dtype size` and 16-byte aligned
    /// tensor starts.
    Vector,
    /// One element per load: any `K`, any alignment.
    Scalar,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvConfig {
    pub dtype: ScalarType,
    /// Rows of `x` the kernel is compiled for (one of [`GEMV_M_TILES`]).
    pub m_tile: u32,
    pub loads: GemvLoads,
    /// Write `f32` partials `[splits, M, N]` instead of the output.
    pub split_k: bool,
    /// Add `bias[N]` (the input dtype) to the f32 sum before the one rounding, as cuBLAS's
    /// epilogue does. Not with `split_k`: there [`GemvReduceConfig::bias`] adds it.
    pub bias: bool,
}

impl GemvConfig {
    /// `gemv.bf16.m1`, `gemv.f16.m4.splitk`, `gemv.f32.m16.scalar`, `gemv.bf16.m1.bias`.
    pub fn id(&self) -> String {
        let loads = match self.loads {
            GemvLoads::Vector => "",
            GemvLoads::Scalar => ".scalar",
        };
        let split = if self.split_k { ".splitk" } else { "" };
        let bias = if self.bias { ".bias" } else { "" };
        format!("gemv.{}.m{}{loads}{split}{bias}", self.dtype, self.m_tile)
    }

    /// Elements per load: 16 bytes' worth for vector loads, one for scalar loads.
    pub fn chunk(&self) -> u32 {
        self.warp_dot().chunk()
    }

    fn warp_dot(&self) -> WarpDot {
        WarpDot { dtype: self.dtype, loads: self.loads, unroll: self.unroll() }
    }

    /// Chunk groups in flight per lane: fewer for many rows, whose accumulators and `x` values
    /// take the registers.
    fn unroll(&self) -> u32 {
        if self.m_tile <= 4 {
            4
        } else {
            2
        }
    }

    /// The smallest compiled row count that covers `m` rows (`None` above 16).
    pub fn m_tile_for(m: u32) -> Option<u32> {
        GEMV_M_TILES.into_iter().find(|&t| t >= m)
    }
}

/// How a warp reads rows for its dot products: the element type, the load width, and how many
/// groups of 32 chunks per lane are in flight.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WarpDot {
    pub dtype: ScalarType,
    pub loads: GemvLoads,
    pub unroll: u32,
}

impl WarpDot {
    /// Elements per load: 16 bytes' worth for vector loads, one for scalar loads.
    pub fn chunk(&self) -> u32 {
        match self.loads {
            GemvLoads::Vector => 16 / self.dtype.bytes(),
            GemvLoads::Scalar => 1,
        }
    }

    /// Load chunk `c` (in units of [`WarpDot::chunk`] elements) of the row at `row` as `f32`s.
    #[track_caller]
    fn load_chunk(&self, b: &mut KernelBuilder, row: Value, c: Value) -> Vec<Value> {
        match (self.loads, self.dtype) {
            (GemvLoads::Scalar, _) => vec![load_f32(b, row, c)],
            (GemvLoads::Vector, ScalarType::F32) => {
                let four = b.const_u32(4);
                let i = b.mul(c, four);
                let p = b.ptr_add(row, i);
                let v = b.load_vec(p, 4);
                (0..4).map(|j| b.extract(v, j)).collect()
            }
            (GemvLoads::Vector, half) => load_halves8(b, half, row, c),
        }
    }

    /// This lane's partial sums of `w_rows[r] · x_rows[i]` over the chunks `start..end`
    /// (chunk `c` to lane `c % 32`), `r`-major: `out[r · x_rows.len() + i]`. The chunks go in
    /// groups of `32 · unroll` whose `w` loads are all issued before any is used, then a tail
    /// of single chunks; each sum adds its chunks in increasing order, elements in order.
    #[track_caller]
    pub fn lane_dots(
        &self,
        b: &mut KernelBuilder,
        w_rows: &[Value],
        x_rows: &[Value],
        start: Value,
        end: Value,
    ) -> Vec<Value> {
        let len = b.sub(end, start);
        let group = b.const_u32(32 * self.unroll);
        let groups = b.div(len, group);
        let lane = b.lane_id();
        let first = b.add(start, lane);
        let zero_f = b.const_f32(0.0);
        let init = vec![zero_f; w_rows.len() * x_rows.len()];
        // Every row of x against every row of w on one chunk, x loaded once.
        let fma_chunk = |b: &mut KernelBuilder, acc: &mut [Value], c: Value, ws: &[Vec<Value>]| {
            for (i, &x_row) in x_rows.iter().enumerate() {
                let xs = self.load_chunk(b, x_row, c);
                for (r, wv) in ws.iter().enumerate() {
                    let a = &mut acc[r * x_rows.len() + i];
                    for (xv, wv) in xs.iter().zip(wv) {
                        *a = b.fma(*xv, *wv, *a);
                    }
                }
            }
        };
        let (zero, one) = (b.const_u32(0), b.const_u32(1));
        let acc = b.for_range(zero, groups, one, &init, |b, g, acc| {
            let base = b.fma(g, group, first);
            let chunk_ids: Vec<Value> = (0..self.unroll)
                .map(|u| {
                    let off = b.const_u32(u * 32);
                    b.add(base, off)
                })
                .collect();
            let ws: Vec<Vec<Vec<Value>>> =
                chunk_ids.iter().map(|&c| w_rows.iter().map(|&w| self.load_chunk(b, w, c)).collect()).collect();
            let mut acc = acc.to_vec();
            for (c, wv) in chunk_ids.iter().zip(&ws) {
                fma_chunk(b, &mut acc, *c, wv);
            }
            acc
        });
        let tail = b.fma(groups, group, first);
        let thirty_two = b.const_u32(32);
        b.for_range(tail, end, thirty_two, &acc, |b, c, acc| {
            let ws: Vec<Vec<Value>> = w_rows.iter().map(|&w| self.load_chunk(b, w, c)).collect();
            let mut acc = acc.to_vec();
            fma_chunk(b, &mut acc, c, &ws);
            acc
        })
    }
}

crate::kernel_params! {
    /// The parameters of [`gemv`], in order: `out` (the input dtype), or `partials` (`f32`)
    /// with split-K; `bias` when biased and not split (split-K adds it in the reduction).
    pub struct GemvParams, GemvValues for GemvConfig as cfg {
        x: tensor(cfg.dtype),
        w: tensor(cfg.dtype),
        out: opt_tensor(cfg.dtype, !cfg.split_k),
        partials: opt_tensor(ScalarType::F32, cfg.split_k),
        bias: opt_tensor(cfg.dtype, cfg.bias && !cfg.split_k),
        m: scalar(u32),
        n: scalar(u32),
        k: scalar(u32),
        chunks_per_split: scalar(u32),
    }
}

/// Build the kernel. Parameters: x `[M, K]`, w `[N, K]`, out `[M, N]` (or partials
/// `[splits, M, N]` f32), with `cfg.bias` bias `[N]`, then m, n, k, chunks_per_split (all `u32`). Grid: `(ceil(N / 4), splits)`,
/// block [`GEMV_THREADS`]. `k` must be a multiple of [`GemvConfig::chunk`].
pub fn gemv(cfg: &GemvConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GemvValues { x, w, out, partials, bias, m, n, k, chunks_per_split } = GemvParams::declare(&mut b, cfg);
    let out = out.or(partials).expect("one of out and partials is declared");
    b.launch_bounds(GEMV_THREADS, None);

    let tid = b.thread_id_x();
    let five = b.const_u32(5);
    let warp = b.shr(tid, five);
    let lane = b.lane_id();
    let warps = b.const_u32(GEMV_WARPS);
    let block = b.block_id_x();
    let col = b.fma(block, warps, warp);
    let split = b.block_id_y();
    let col_ok = b.lt(col, n);
    // The whole warp takes the same branch, so its shuffles see every lane.
    b.if_then(col_ok, |b| {
        let shift = b.const_u32(cfg.chunk().trailing_zeros());
        let chunks = b.shr(k, shift);
        let start = b.mul(split, chunks_per_split);
        let end = b.add(start, chunks_per_split);
        let end = b.min(end, chunks);
        let start = b.min(start, end);
        let w_row = row_ptr(b, w, col, k);
        let one = b.const_u32(1);
        let last_row = b.sub(m, one);
        let x_rows: Vec<Value> = (0..cfg.m_tile)
            .map(|i| {
                let i = b.const_u32(i);
                let r = b.min(i, last_row);
                row_ptr(b, x, r, k)
            })
            .collect();
        let acc = cfg.warp_dot().lane_dots(b, &[w_row], &x_rows, start, end);

        let zero = b.const_u32(0);
        let lane0 = b.eq(lane, zero);
        for (i, a) in acc.iter().enumerate() {
            let total = warp_reduce(b, Combine::Sum, *a);
            let i = b.const_u32(i as u32);
            let row_ok = b.lt(i, m);
            let store = b.and(lane0, row_ok);
            b.if_then(store, |b| {
                let row = if cfg.split_k { b.fma(split, m, i) } else { i };
                let idx = b.fma(row, n, col);
                let total = match bias {
                    Some(bias) => {
                        let bv = load_f32(b, bias, col);
                        b.add(total, bv)
                    }
                    None => total,
                };
                store_from_f32(b, out, idx, total);
            });
        }
    });
    b.finish()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemvReduceConfig {
    /// The output dtype.
    pub dtype: ScalarType,
    /// Add `bias[i % n]` (the output dtype) before the rounding.
    pub bias: bool,
}

impl GemvReduceConfig {
    /// `gemv.bf16.splitk_reduce`, `gemv.bf16.splitk_reduce.bias`.
    pub fn id(&self) -> String {
        let bias = if self.bias { ".bias" } else { "" };
        format!("gemv.{}.splitk_reduce{bias}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`gemv_reduce`], in order (`bias` and `n` only when biased).
    pub struct GemvReduceParams, GemvReduceValues for GemvReduceConfig as cfg {
        partials: tensor(ScalarType::F32),
        out: tensor(cfg.dtype),
        bias: opt_tensor(cfg.dtype, cfg.bias),
        len: scalar(u32),
        splits: scalar(u32),
        n: opt_scalar(u32, cfg.bias),
    }
}

/// `out[i] = Σ_s partials[s · len + i] (+ bias[i % n])` in increasing `s`, rounded once to the
/// output dtype. Parameters: partials (f32), out, with `cfg.bias` bias, then len, splits, and with
/// `cfg.bias` n (`u32`). One thread per output element.
pub fn gemv_reduce(cfg: &GemvReduceConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let GemvReduceValues { partials, out, bias, len, splits, n } = GemvReduceParams::declare(&mut b, cfg);
    b.launch_bounds(GEMV_REDUCE_THREADS, None);

    let i = b.global_thread_id_x();
    let in_range = b.lt(i, len);
    b.if_then(in_range, |b| {
        let zero = b.const_u32(0);
        let one = b.const_u32(1);
        let zero_f = b.const_f32(0.0);
        let sum = b.for_range(zero, splits, one, &[zero_f], |b, s, acc| {
            let idx = b.fma(s, len, i);
            let p = load_f32(b, partials, idx);
            vec![b.add(acc[0], p)]
        })[0];
        let sum = match bias.zip(n) {
            Some((bias, n)) => {
                let col = b.rem(i, n);
                let bv = load_f32(b, bias, col);
                b.add(sum, bv)
            }
            None => sum,
        };
        store_from_f32(b, out, i, sum);
    });
    b.finish()
}

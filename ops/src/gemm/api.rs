//! Matrix multiplication: `matmul` (`a · b`), and `linear` (`x · wᵀ`, the layout of
//! `nn.Linear`) with its bias / residual epilogue and batched form.

use ruda_ir::ScalarType;
use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernels::simt::{gemm_simt, BLayout, GemmConfig, GemmSimtParams};
use super::kernels::tc::{gemm_tc, GemmTcConfig, GemmTcParams};
use super::tile::{heuristic_gemm_tile, GemmTile};
use crate::elementwise::api::add;
use crate::error::{OpError, Result};
use crate::gemv::api::{gemv_launch, gemv_named, GEMV_MAX_M};
use crate::host::*;
use crate::params;

/// `a · b (+ bias[N])`, the bias added to the f32 sum before the one rounding.
fn gemm_into(
    name: &'static str,
    layout: BLayout,
    stream: &Stream,
    a: &Tensor,
    b: &Tensor,
    bias: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let dtype = float_dtype(name, a)?;
    for (n, t) in [("a", a), ("b", b), ("out", out)] {
        contiguous_nonempty(name, n, t)?;
        expect_dtype(name, n, t, a.dtype())?;
        if t.rank() != 2 {
            return Err(OpError::Shape { op: name, message: format!("`{n}` must be 2-D, is {:?}", t.shape()) });
        }
    }
    same_device(name, stream, &[("a", a), ("b", b), ("out", out)])?;
    let (m, k) = (a.shape()[0], a.shape()[1]);
    let (kb, n) = match layout {
        BLayout::RowMajor => (b.shape()[0], b.shape()[1]),
        BLayout::Transposed => (b.shape()[1], b.shape()[0]),
    };
    if kb != k {
        return Err(OpError::Shape {
            op: name,
            message: format!("inner dimensions differ: a is {:?}, b is {:?}", a.shape(), b.shape()),
        });
    }
    expect_shape(name, "out", out, &[m, n])?;
    if let Some(bias) = bias {
        expect_tensor(name, "bias", bias, a.dtype(), &[n])?;
        same_device(name, stream, &[("bias", bias)])?;
    }
    // Element indices are computed in u32 inside the kernel.
    for (what, len) in [("a", m * k), ("b", k * n), ("out", m * n)] {
        to_u32(name, &format!("elements of `{what}`"), len)?;
    }
    let (m, n, k) = (to_u32(name, "m", m)?, to_u32(name, "n", n)?, to_u32(name, "k", k)?);
    if layout == BLayout::Transposed && tensor_cores_apply(a, b, k as usize, &[out]) {
        let p = TcProblem { m, n, k, batch: 1, w_batch: 0, out: dtype };
        let tile = heuristic_gemm_tile(stream.device(), m as usize, n as usize);
        return launch_tc(stream, &LinearProblem::new(a, b, out), &Epilogue { bias, residual: None }, &p, tile);
    }
    let cfg = GemmConfig { dtype, b_layout: layout, bias: bias.is_some() };
    let kern = kernel(cfg.id(), || gemm_simt(&cfg))?;
    let launch =
        LaunchConfig { grid: GemmConfig::grid(m, n), block: [GemmConfig::THREADS, 1, 1], dynamic_shared_bytes: 0 };
    params::launch(stream, &kern, launch, &GemmSimtParams { a, b, bias, c: out, m, n, k }.args())
}

/// `out[M, N] = a[M, K] · b[K, N]`, accumulating in `f32`.
pub fn matmul_into(stream: &Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    gemm_into("matmul", BLayout::RowMajor, stream, a, b, None, out)
}

/// `a[M, K] · b[K, N]`.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (m, n) = (a.shape().first().copied().unwrap_or(0), b.shape().get(1).copied().unwrap_or(0));
    let out = Tensor::empty(a.device(), a.dtype(), &[m, n])?;
    matmul_into(&a.device().default_stream(), a, b, &out)?;
    Ok(out)
}

/// `out[M, N] = x[M, K] · wᵀ` for a weight `w[N, K]` (the layout of `nn.Linear`). Up to
/// [`GEMV_MAX_M`] rows of `x` (decode) run on the GEMV kernels (without split-K, which needs a
/// workspace: call [`gemv_into`] for it), more on the tensor-core GEMM (f16/bf16, `K % 8 == 0`,
/// 16-byte aligned `x` and `w`; tile by [`heuristic_gemm_tile`]) or else the tiled SIMT GEMM.
pub fn linear_into(stream: &Stream, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    plain_into(stream, x, w, None, out)
}

/// [`Strategy::Auto`] with at most a bias (`x`'s dtype, added before the one rounding): the
/// GEMV for decode-sized `x`, else the GEMMs (which check their operands themselves).
fn plain_into(stream: &Stream, x: &Tensor, w: &Tensor, bias: Option<&Tensor>, out: &Tensor) -> Result<()> {
    if x.rank() == 2 && (1..=GEMV_MAX_M).contains(&x.shape()[0]) {
        return match bias {
            None => gemv_named("linear", stream, x, w, out, None),
            Some(_) => gemv_launch("linear", stream, x, w, bias, out, None, 1),
        };
    }
    gemm_into("linear", BLayout::Transposed, stream, x, w, bias, out)
}

/// `x[M, K] · w[N, K]ᵀ`.
pub fn linear(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let (m, n) = (x.shape().first().copied().unwrap_or(0), w.shape().first().copied().unwrap_or(0));
    let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
    linear_into(&x.device().default_stream(), x, w, &out)?;
    Ok(out)
}

/// Whether the tensor-core GEMM takes `x · wᵀ` into `outputs` (the output and residual):
/// f16/bf16, `K % 8 == 0` and both first elements 16-byte aligned (allocations themselves
/// are), so every row start is; the outputs start at even elements (paired accesses).
fn tensor_cores_apply(x: &Tensor, w: &Tensor, k: usize, outputs: &[&Tensor]) -> bool {
    let aligned = |t: &Tensor| (t.offset() * t.dtype().size()).is_multiple_of(16);
    GemmTcConfig::mma_type(x.dtype().scalar_type()).is_some()
        && k.is_multiple_of(GemmTcConfig::K_MULTIPLE as usize)
        && aligned(x)
        && aligned(w)
        && outputs.iter().all(|t| t.offset().is_multiple_of(2))
}

/// The sizes of a validated tensor-core launch.
struct TcProblem {
    m: u32,
    n: u32,
    k: u32,
    /// Batch entries (1: not batched).
    batch: u32,
    /// Elements between the weights of consecutive batch entries (0: one shared weight).
    w_batch: u32,
    out: ScalarType,
}

fn launch_tc(stream: &Stream, o: &LinearProblem<'_>, e: &Epilogue<'_>, p: &TcProblem, choice: GemmTile) -> Result<()> {
    let (x, w, out, bias, residual) = (o.x, o.w, o.out, e.bias, e.residual);
    let ty = GemmTcConfig::mma_type(x.dtype().scalar_type()).ok_or_else(|| OpError::DType {
        op: "linear",
        message: format!("{} (tensor cores take f16 or bf16)", x.dtype()),
    })?;
    let cfg = GemmTcConfig {
        ty,
        out: p.out,
        tile: choice.tile,
        stages: choice.stages,
        bias: bias.is_some(),
        residual: residual.is_some(),
        batched: p.batch > 1,
    };
    let kern = kernel(cfg.id(), || gemm_tc(&cfg))?;
    let launch =
        LaunchConfig { grid: cfg.grid(p.m, p.n, p.batch), block: [cfg.threads(), 1, 1], dynamic_shared_bytes: 0 };
    let batched = |stride: u32| cfg.batched.then_some(stride);
    let args = GemmTcParams {
        x,
        w,
        bias,
        residual,
        y: out,
        m: p.m,
        n: p.n,
        k: p.k,
        x_batch: batched(p.m * p.k),
        w_batch: batched(p.w_batch),
        y_batch: batched(p.m * p.n),
    };
    params::launch(stream, &kern, launch, &args.args())
}

/// Validated operands of the epilogue and batched forms.
struct Linear {
    problem: TcProblem,
    tensor_cores: bool,
}

/// Check `x[(B,) M, K]`, `w[(B,) N, K]`, `bias[N]`, `residual` and `out[(B,) M, N]`.
fn check_linear(
    name: &'static str,
    stream: &Stream,
    o: &LinearProblem<'_>,
    e: &Epilogue<'_>,
    batched: bool,
) -> Result<Linear> {
    let (x, w, out, bias, residual) = (o.x, o.w, o.out, e.bias, e.residual);
    float_dtype(name, x)?;
    let mut all = vec![("x", x), ("w", w), ("out", out)];
    all.extend(bias.map(|b| ("bias", b)));
    all.extend(residual.map(|r| ("residual", r)));
    for (tn, t) in &all {
        contiguous_nonempty(name, tn, t)?;
    }
    same_device(name, stream, &all)?;
    expect_dtype(name, "w", w, x.dtype())?;
    let out_ok = out.dtype() == x.dtype() || (out.dtype() == DType::F32 && x.dtype() != DType::F32);
    if !out_ok {
        return Err(OpError::DType {
            op: name,
            message: format!("`out` is {}; for {} inputs it must be {} or f32", out.dtype(), x.dtype(), x.dtype()),
        });
    }
    let rank = if batched { 3 } else { 2 };
    if x.rank() != rank || !(w.rank() == 2 || (batched && w.rank() == 3)) {
        let want = if batched { "x [B, M, K] and w [B, N, K] or [N, K]" } else { "x [M, K] and w [N, K]" };
        return Err(OpError::Shape {
            op: name,
            message: format!("expected {want}, got x {:?} and w {:?}", x.shape(), w.shape()),
        });
    }
    let (batch, m, k) =
        if batched { (x.shape()[0], x.shape()[1], x.shape()[2]) } else { (1, x.shape()[0], x.shape()[1]) };
    let (wb, n, wk) =
        if w.rank() == 3 { (w.shape()[0], w.shape()[1], w.shape()[2]) } else { (1, w.shape()[0], w.shape()[1]) };
    if wk != k || (w.rank() == 3 && wb != batch) {
        return Err(OpError::Shape {
            op: name,
            message: format!(
                "x is {:?} but w is {:?} (expected [{n}, {k}] or [{batch}, {n}, {k}])",
                x.shape(),
                w.shape()
            ),
        });
    }
    let out_shape: Vec<usize> = if batched { vec![batch, m, n] } else { vec![m, n] };
    expect_shape(name, "out", out, &out_shape)?;
    if let Some(b) = bias {
        expect_dtype(name, "bias", b, x.dtype())?;
        expect_shape(name, "bias", b, &[n])?;
    }
    if let Some(r) = residual {
        expect_dtype(name, "residual", r, out.dtype())?;
        expect_shape(name, "residual", r, &out_shape)?;
    }
    // Element indices, batch offsets included, are computed in u32 inside the kernel.
    for (what, len) in [("x", x.numel()), ("w", w.numel()), ("out", out.numel())] {
        to_u32(name, &format!("elements of `{what}`"), len)?;
    }
    let w_batch = if w.rank() == 3 { n * k } else { 0 };
    let problem = TcProblem {
        m: to_u32(name, "m", m)?,
        n: to_u32(name, "n", n)?,
        k: to_u32(name, "k", k)?,
        batch: to_u32(name, "batch", batch)?,
        w_batch: to_u32(name, "w batch stride", w_batch)?,
        out: out.dtype().scalar_type(),
    };
    let mut outputs = vec![out];
    outputs.extend(residual);
    Ok(Linear { problem, tensor_cores: tensor_cores_apply(x, w, k, &outputs) })
}

/// The operands of [`linear_with_into`]: `out[M, N] = x[M, K] · w[N, K]ᵀ` (the layout of
/// `nn.Linear`), and the `f32` workspace a split-K GEMV writes its partials to.
#[derive(Clone, Copy)]
pub struct LinearProblem<'a> {
    pub x: &'a Tensor,
    pub w: &'a Tensor,
    pub out: &'a Tensor,
    pub workspace: Option<&'a Tensor>,
}

impl<'a> LinearProblem<'a> {
    /// `out = x · wᵀ` without a workspace.
    pub fn new(x: &'a Tensor, w: &'a Tensor, out: &'a Tensor) -> LinearProblem<'a> {
        LinearProblem { x, w, out, workspace: None }
    }
}

/// What [`linear_with_into`] adds to the `f32` product before its one rounding to `out`'s
/// dtype (an `f32` `out` for f16/bf16 inputs keeps the sum unrounded): `bias[N]` (`x`'s dtype)
/// and `residual[M, N]` (`out`'s dtype; on CUDA it may be `out` itself). Further epilogues
/// (dequantisation scales, activations) are further fields.
#[derive(Clone, Copy, Default)]
pub struct Epilogue<'a> {
    pub bias: Option<&'a Tensor>,
    pub residual: Option<&'a Tensor>,
}

impl Epilogue<'_> {
    /// The plain product.
    pub const NONE: Epilogue<'static> = Epilogue { bias: None, residual: None };
}

/// How [`linear_with_into`] computes the product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// By shape (after checking the operands): without an epilogue and with `out` in `x`'s
    /// dtype, the GEMV for up to
    /// [`GEMV_MAX_M`] rows (unsplit), the tensor-core GEMM (f16/bf16, `K % 8 == 0`, 16-byte
    /// aligned `x` and `w`; tile by [`heuristic_gemm_tile`]) or else the tiled SIMT GEMM; with
    /// an epilogue or an `f32` output, the tensor-core GEMM with the heuristic's tile.
    Auto,
    /// The GEMV (`M ≤ 16`, bias only) with this many K-splits (`splits · M · N` `f32`s of
    /// workspace when more than 1; rounded so each split covers whole warps of chunks), or
    /// with `None` the heuristic's count (`gemv_splits`) lowered to what the workspace holds.
    Gemv { splits: Option<usize> },
    /// The tensor-core GEMM with this tile and depth (what autotuning picks).
    Tile(GemmTile),
}

/// `out = x · wᵀ` plus `epilogue`, computed as `strategy` says: the one entry point of the
/// linear family (the other `linear_*` and `gemv_*` forms are this with fixed arguments).
/// Neither allocates nor synchronises; errors name what the chosen strategy cannot take.
pub fn linear_with_into(
    stream: &Stream,
    problem: LinearProblem<'_>,
    epilogue: Epilogue<'_>,
    strategy: Strategy,
) -> Result<()> {
    let LinearProblem { x, w, out, workspace } = problem;
    match strategy {
        Strategy::Gemv { splits } => {
            if epilogue.residual.is_some() {
                return Err(OpError::InvalidArgument {
                    op: "gemv",
                    message: "the GEMV's epilogue is a bias; add a residual with `Strategy::Auto`".into(),
                });
            }
            match (splits, epilogue.bias) {
                (None, None) => gemv_named("gemv", stream, x, w, out, workspace),
                (None, Some(_)) => Err(OpError::InvalidArgument {
                    op: "gemv",
                    message: "a biased GEMV takes an explicit split count".into(),
                }),
                (Some(0), _) => {
                    Err(OpError::InvalidArgument { op: "gemv", message: "splits must be at least 1".into() })
                }
                (Some(s), bias) => {
                    gemv_launch("gemv", stream, x, w, bias, out, workspace, to_u32("gemv", "splits", s)?)
                }
            }
        }
        Strategy::Auto => {
            let l = check_linear("linear", stream, &problem, &epilogue, false)?;
            let p = &l.problem;
            // Without tensor cores a bias joins the GEMV's or the SIMT GEMM's epilogue.
            let plain = epilogue.residual.is_none() && p.out == x.dtype().scalar_type();
            if plain && (epilogue.bias.is_none() || !l.tensor_cores) {
                return plain_into(stream, x, w, epilogue.bias, out);
            }
            if !l.tensor_cores {
                return Err(OpError::InvalidArgument {
                    op: "linear",
                    message: format!(
                        "a residual or f32 output needs f16/bf16 inputs with K % 8 == 0, 16-byte aligned x and w, \
                         and out and residual starting at even elements (x is {} {:?}): use `linear_bias`, which adds \
                         the residual separately",
                        x.dtype(),
                        x.shape()
                    ),
                });
            }
            let tile = heuristic_gemm_tile(stream.device(), p.m as usize, p.n as usize);
            launch_tc(stream, &problem, &epilogue, p, tile)
        }
        Strategy::Tile(tile) => {
            let l = check_linear("linear", stream, &problem, &epilogue, false)?;
            if !l.tensor_cores {
                return Err(OpError::InvalidArgument {
                    op: "linear",
                    message: format!(
                        "tile {}: the tensor-core GEMM needs f16/bf16 inputs with K % 8 == 0, 16-byte aligned x and w, \
                         and out and residual starting at even elements (x is {} {:?})",
                        tile.name(),
                        x.dtype(),
                        x.shape()
                    ),
                });
            }
            launch_tc(stream, &problem, &epilogue, &l.problem, tile)
        }
    }
}

/// [`linear_with_into`] with a bias and residual, either optional ([`Strategy::Auto`]). A
/// residual (or an f32 output) runs on the tensor-core GEMM (any `M`), so it needs f16/bf16
/// inputs with `K % 8 == 0`, 16-byte aligned `x` and `w`, and `out` and `residual` starting at
/// even elements; [`linear_bias`] takes the rest. A bias alone joins the tensor-core GEMM's
/// epilogue where it applies, else the GEMV's (M ≤ 16) or the SIMT GEMM's.
pub fn linear_bias_into(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    linear_with_into(stream, LinearProblem::new(x, w, out), Epilogue { bias, residual }, Strategy::Auto)
}

/// `out[M, N] = x[M, K] · w[N, K]ᵀ` for `M ≤ 16`, `f32` accumulation, output in the input
/// dtype. 16-byte vector loads when `K` is a multiple of 8 halves (4 floats) and both tensors
/// start 16-byte aligned, element loads otherwise. With a `workspace` (`f32`, at least
/// [`crate::gemv::api::gemv_workspace_len`] elements) and too few output columns to fill the GPU, `K` is split
/// ([`crate::gemv::api::gemv_splits`]) and a second kernel adds the partials; a smaller workspace lowers the split
/// count. Results depend on the split count (summation order), which depends only on the device,
/// the shapes and the workspace size.
pub fn gemv_into(stream: &Stream, x: &Tensor, w: &Tensor, out: &Tensor, workspace: Option<&Tensor>) -> Result<()> {
    let problem = LinearProblem { x, w, out, workspace };
    linear_with_into(stream, problem, Epilogue::NONE, Strategy::Gemv { splits: None })
}

/// [`gemv_into`] with an explicit number of K-splits (`splits ≥ 1`; rounded so that each split
/// covers whole warps of chunks, so fewer may run). `workspace` needs `splits · M · N` `f32`s.
pub fn gemv_split_k_into(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    out: &Tensor,
    workspace: &Tensor,
    splits: usize,
) -> Result<()> {
    let problem = LinearProblem { x, w, out, workspace: Some(workspace) };
    linear_with_into(stream, problem, Epilogue::NONE, Strategy::Gemv { splits: Some(splits) })
}

/// `out[M, N] = x[M, K] · w[N, K]ᵀ + bias[N]` for `M ≤ 16` with `splits` K-splits: the bias
/// (`x`'s dtype) is added to the f32 sum and rounded once with it, as cuBLAS's epilogue does,
/// in the GEMV's store or, split, in its reduction. `workspace` (`f32`, `splits · M · N`) is
/// needed only for `splits > 1`. Neither allocates nor synchronises.
#[allow(clippy::too_many_arguments)]
pub fn gemv_bias_into(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: &Tensor,
    out: &Tensor,
    workspace: Option<&Tensor>,
    splits: usize,
) -> Result<()> {
    let problem = LinearProblem { x, w, out, workspace };
    linear_with_into(
        stream,
        problem,
        Epilogue { bias: Some(bias), residual: None },
        Strategy::Gemv { splits: Some(splits) },
    )
}

/// [`linear_bias_into`] with an explicit tensor-core configuration ([`Strategy::Tile`]).
pub fn linear_tile_into(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
    tile: GemmTile,
) -> Result<()> {
    linear_with_into(stream, LinearProblem::new(x, w, out), Epilogue { bias, residual }, Strategy::Tile(tile))
}

/// `x · wᵀ + bias + residual` in `x`'s dtype (see [`linear_bias_into`]), allocating the output.
/// Larger f16/bf16 products use the tensor-core GEMM with its fused epilogue, its tile
/// autotuned on a GPU. Decode-sized `x` (at most [`GEMV_MAX_M`] rows) and operands the
/// tensor-core GEMM does not take run the GEMV or the SIMT GEMM with the bias in their
/// epilogue (one rounding, as cuBLAS's), then add the residual with the elementwise op.
pub fn linear_bias(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
    let stream = x.device().default_stream();
    let (m, n) = (x.shape().first().copied().unwrap_or(0), w.shape().first().copied().unwrap_or(0));
    let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
    let l = check_linear("linear", &stream, &LinearProblem::new(x, w, &out), &Epilogue { bias, residual }, false)?;
    if l.tensor_cores && m > GEMV_MAX_M {
        crate::tune::gemm_tuned_into(&stream, x, w, bias, residual, &out)?;
        return Ok(out);
    }
    plain_into(&stream, x, w, bias, &out)?;
    match residual {
        Some(r) => add(&out, r),
        None => Ok(out),
    }
}

/// `out[b] = x[b] · w[b]ᵀ` for `x[B, M, K]`, `w[B, N, K]` (or one `w[N, K]` shared by every
/// entry) and `out[B, M, N]`, in `x`'s dtype or f32 for f16/bf16 inputs. One tensor-core launch
/// over the batch (`grid.z`) when tensor cores apply, else one plain product per entry.
pub fn linear_batched_into(stream: &Stream, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    let problem = LinearProblem::new(x, w, out);
    let l = check_linear("linear_batched", stream, &problem, &Epilogue::NONE, true)?;
    let p = &l.problem;
    if l.tensor_cores {
        let tile = heuristic_gemm_tile(stream.device(), p.m as usize, p.n as usize);
        return launch_tc(stream, &problem, &Epilogue::NONE, p, tile);
    }
    if p.out != x.dtype().scalar_type() {
        return Err(OpError::InvalidArgument {
            op: "linear_batched",
            message: format!(
                "an f32 output needs f16/bf16 inputs with K % 8 == 0, 16-byte aligned x and w, and out starting at an even \
                 element (x is {})",
                x.dtype()
            ),
        });
    }
    let entry = |t: &Tensor, b: usize| -> Result<Tensor> {
        let shape = t.shape()[1..].to_vec();
        Ok(t.narrow(0, b, 1)?.reshape(&shape)?)
    };
    for b in 0..p.batch as usize {
        let wb = if w.rank() == 3 { entry(w, b)? } else { w.clone() };
        gemm_into("linear_batched", BLayout::Transposed, stream, &entry(x, b)?, &wb, None, &entry(out, b)?)?;
    }
    Ok(())
}

/// `x[B, M, K] · w[(B,) N, K]ᵀ` (see [`linear_batched_into`]).
pub fn linear_batched(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let b = x.shape().first().copied().unwrap_or(0);
    let m = x.shape().get(1).copied().unwrap_or(0);
    let n = if w.rank() == 3 { w.shape().get(1) } else { w.shape().first() }.copied().unwrap_or(0);
    let out = Tensor::empty(x.device(), x.dtype(), &[b, m, n])?;
    linear_batched_into(&x.device().default_stream(), x, w, &out)?;
    Ok(out)
}

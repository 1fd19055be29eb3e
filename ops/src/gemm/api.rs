//! Matrix multiplication: `matmul` (`a · b`), and `linear` (`x · wᵀ`, the layout of
//! `nn.Linear`) with its bias / residual epilogue and batched form.

use ruda_ir::ScalarType;
use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernels::simt::{gemm_simt, BLayout, GemmConfig, GemmSimtParams};
use super::kernels::tc::{gemm_tc, GemmTcConfig, GemmTcParams};
use super::tile::{heuristic_gemm_tile, GemmTile};
use crate::elementwise::api::{add, add_bias};
use crate::error::{OpError, Result};
use crate::gemv::api::{gemv, gemv_named, GEMV_MAX_M};
use crate::host::*;
use crate::params;

fn gemm_into(name: &'static str, layout: BLayout, stream: &Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
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
    // Element indices are computed in u32 inside the kernel.
    for (what, len) in [("a", m * k), ("b", k * n), ("out", m * n)] {
        to_u32(name, &format!("elements of `{what}`"), len)?;
    }
    let (m, n, k) = (to_u32(name, "m", m)?, to_u32(name, "n", n)?, to_u32(name, "k", k)?);
    if layout == BLayout::Transposed && tensor_cores_apply(a, b, k as usize, &[out]) {
        let p = TcProblem { m, n, k, batch: 1, w_batch: 0, out: dtype };
        return launch_tc(
            stream,
            a,
            b,
            None,
            None,
            out,
            &p,
            heuristic_gemm_tile(stream.device(), m as usize, n as usize),
        );
    }
    let cfg = GemmConfig { dtype, b_layout: layout };
    let kern = kernel(cfg.id(), || gemm_simt(&cfg))?;
    let launch =
        LaunchConfig { grid: GemmConfig::grid(m, n), block: [GemmConfig::THREADS, 1, 1], dynamic_shared_bytes: 0 };
    params::launch(stream, &kern, launch, &GemmSimtParams { a, b, c: out, m, n, k }.args())
}

/// `out[M, N] = a[M, K] · b[K, N]`, accumulating in `f32`.
pub fn matmul_into(stream: &Stream, a: &Tensor, b: &Tensor, out: &Tensor) -> Result<()> {
    gemm_into("matmul", BLayout::RowMajor, stream, a, b, out)
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
    if x.rank() == 2 && (1..=GEMV_MAX_M).contains(&x.shape()[0]) {
        return gemv_named("linear", stream, x, w, out, None);
    }
    gemm_into("linear", BLayout::Transposed, stream, x, w, out)
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

#[allow(clippy::too_many_arguments)]
fn launch_tc(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
    p: &TcProblem,
    choice: GemmTile,
) -> Result<()> {
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
#[allow(clippy::too_many_arguments)]
fn check_linear(
    name: &'static str,
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
    batched: bool,
) -> Result<Linear> {
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

/// `out[M, N] = x[M, K] · w[N, K]ᵀ + bias[N] + residual[M, N]` with either addend optional,
/// added in f32 to the f32 accumulator and rounded once to `out`'s dtype (see
/// `kernels::gemm_tc` for how that compares with PyTorch's `F.linear(x, w, b) + residual`).
/// `out` is `x`'s dtype, or f32 for f16/bf16 inputs; `bias` has `x`'s dtype, `residual`
/// `out`'s. Without addends and with `out` in `x`'s dtype this is [`linear_into`]. The addends
/// run on the tensor-core GEMM (any `M`, tile by [`heuristic_gemm_tile`]), so they need
/// f16/bf16 inputs with `K % 8 == 0`, 16-byte aligned `x` and `w`, and `out` and `residual`
/// starting at even elements; [`linear_bias`] takes the rest. On CUDA `residual` may be `out` itself (in place).
pub fn linear_bias_into(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let l = check_linear("linear", stream, x, w, bias, residual, out, false)?;
    let p = &l.problem;
    if bias.is_none() && residual.is_none() && p.out == x.dtype().scalar_type() {
        return linear_into(stream, x, w, out);
    }
    if !l.tensor_cores {
        return Err(OpError::InvalidArgument {
            op: "linear",
            message: format!(
                "a bias, residual or f32 output needs f16/bf16 inputs with K % 8 == 0, 16-byte aligned x and w, and out \
                 and residual starting at even elements (x is {} {:?}): use `linear_bias`, which falls back to separate ops",
                x.dtype(),
                x.shape()
            ),
        });
    }
    launch_tc(stream, x, w, bias, residual, out, p, heuristic_gemm_tile(stream.device(), p.m as usize, p.n as usize))
}

/// [`linear_bias_into`] with an explicit tensor-core configuration (what autotuning picks);
/// an error when tensor cores do not apply to the operands.
pub fn linear_tile_into(
    stream: &Stream,
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
    tile: GemmTile,
) -> Result<()> {
    let l = check_linear("linear", stream, x, w, bias, residual, out, false)?;
    if !l.tensor_cores {
        return Err(OpError::InvalidArgument {
            op: "linear",
            message: format!(
                "tile {}: the tensor-core GEMM needs f16/bf16 inputs with K % 8 == 0, 16-byte aligned x and w, and out and \
                 residual starting at even elements (x is {} {:?})",
                tile.name(),
                x.dtype(),
                x.shape()
            ),
        });
    }
    launch_tc(stream, x, w, bias, residual, out, &l.problem, tile)
}

/// `x · wᵀ + bias + residual` in `x`'s dtype (see [`linear_bias_into`]), allocating the output.
/// Decode-sized `x` (at most [`GEMV_MAX_M`] rows) and operands the tensor-core GEMM does not
/// take run the plain product (GEMV, autotuned on a GPU) and then add the bias and residual
/// with the elementwise ops (rounding after each step); larger f16/bf16 products use the
/// tensor-core GEMM with its fused epilogue, its tile autotuned on a GPU.
pub fn linear_bias(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, residual: Option<&Tensor>) -> Result<Tensor> {
    let stream = x.device().default_stream();
    let (m, n) = (x.shape().first().copied().unwrap_or(0), w.shape().first().copied().unwrap_or(0));
    let out = Tensor::empty(x.device(), x.dtype(), &[m, n])?;
    let l = check_linear("linear", &stream, x, w, bias, residual, &out, false)?;
    if l.tensor_cores && m > GEMV_MAX_M {
        crate::tune::gemm_tuned_into(&stream, x, w, bias, residual, &out)?;
        return Ok(out);
    }
    let mut y = if m <= GEMV_MAX_M { gemv(x, w)? } else { linear(x, w)? };
    if let Some(b) = bias {
        y = add_bias(&y, b)?;
    }
    if let Some(r) = residual {
        y = add(&y, r)?;
    }
    Ok(y)
}

/// `out[b] = x[b] · w[b]ᵀ` for `x[B, M, K]`, `w[B, N, K]` (or one `w[N, K]` shared by every
/// entry) and `out[B, M, N]`, in `x`'s dtype or f32 for f16/bf16 inputs. One tensor-core launch
/// over the batch (`grid.z`) when tensor cores apply, else one plain product per entry.
pub fn linear_batched_into(stream: &Stream, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    let l = check_linear("linear_batched", stream, x, w, None, None, out, true)?;
    let p = &l.problem;
    if l.tensor_cores {
        return launch_tc(
            stream,
            x,
            w,
            None,
            None,
            out,
            p,
            heuristic_gemm_tile(stream.device(), p.m as usize, p.n as usize),
        );
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
        gemm_into("linear_batched", BLayout::Transposed, stream, &entry(x, b)?, &wb, &entry(out, b)?)?;
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

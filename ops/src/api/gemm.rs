//! Matrix multiplication.

use ruda_runtime::{Arg, LaunchConfig, Stream, Tensor};

use super::*;
use crate::kernels::{gemm_simt, gemm_tc, BLayout, GemmConfig, GemmTcConfig};

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
    // Tensor cores for `x · wᵀ` in f16/bf16 when every row start is 16-byte aligned (K a
    // multiple of 8, first elements aligned; allocations themselves are).
    let aligned = |t: &Tensor| (t.offset() * t.dtype().size()).is_multiple_of(16);
    if let Some(cfg) = GemmTcConfig::for_dtype(dtype).filter(|_| {
        layout == BLayout::Transposed && k.is_multiple_of(GemmTcConfig::K_MULTIPLE) && aligned(a) && aligned(b)
    }) {
        let kern = kernel(cfg.id(), || gemm_tc(&cfg))?;
        let launch =
            LaunchConfig { grid: GemmTcConfig::grid(m, n), block: [GemmTcConfig::THREADS, 1, 1], dynamic_shared_bytes: 0 };
        let args = [Arg::Tensor(a), Arg::Tensor(b), Arg::Tensor(out), Arg::scalar(m), Arg::scalar(n), Arg::scalar(k)];
        stream.launch(&*kern, launch, &args)?;
        return Ok(());
    }
    let cfg = GemmConfig { dtype, b_layout: layout };
    let kern = kernel(cfg.id(), || gemm_simt(&cfg))?;
    let launch = LaunchConfig { grid: GemmConfig::grid(m, n), block: [GemmConfig::THREADS, 1, 1], dynamic_shared_bytes: 0 };
    let args = [Arg::Tensor(a), Arg::Tensor(b), Arg::Tensor(out), Arg::scalar(m), Arg::scalar(n), Arg::scalar(k)];
    stream.launch(&*kern, launch, &args)?;
    Ok(())
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
/// 16-byte aligned `x` and `w`) or else the tiled SIMT GEMM.
pub fn linear_into(stream: &Stream, x: &Tensor, w: &Tensor, out: &Tensor) -> Result<()> {
    if x.rank() == 2 && (1..=GEMV_MAX_M).contains(&x.shape()[0]) {
        return super::gemv::gemv_named("linear", stream, x, w, out, None);
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

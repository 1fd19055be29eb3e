//! Matrix multiplication: `matmul` (`a · b`) and `linear` (`x · wᵀ`, the layout of `nn.Linear`)
//! with its bias / residual epilogue and batched form, by level:
//!
//! - [`tile`]: the tensor-core tile and pipeline depth ([`tile::GemmTile`]) and its heuristic;
//! - [`load`]: the tensor-core kernel's staged, swizzled, pipelined loads of `x` and `w`;
//! - [`kernels`]: the SIMT kernel (every float dtype, both `B` layouts) and the tensor-core
//!   kernel (f16/bf16 inputs, `mma.m16n8k16`, f32 accumulation);
//! - [`api`]: the entry points, which pick a kernel and a tile;
//! - [`tune`]: the tile tuned per GPU and shape.

pub mod api;
pub mod kernels;
pub mod load;
pub mod tile;
pub mod tune;

use ruda_runtime::DType;

use crate::blocks::FLOAT_DTYPES;
use crate::family::{Family, ShapeLine};
use crate::gemv::api::GEMV_MAX_M;
use crate::problem::Case;
use crate::registry::Registered;
use crate::tune::TuneShape;
use kernels::simt::{gemm_simt, BLayout, GemmConfig};
use kernels::tc::{gemm_tc, registered_configs};

/// The SIMT GEMM in every float dtype and both `B` layouts (family `gemm_simt`) and the
/// tensor-core GEMM's registered tiles (family `gemm`). Its shape-file lines are `linear`'s two
/// tuned strategies: the GEMV's split count for `M ≤ 16` (`gemv`) and the tile above (`gemm`).
pub struct Gemm;

impl Family for Gemm {
    fn names(&self) -> &'static [&'static str] {
        &["gemm_simt", "gemm"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            // The bias epilogue serves `linear` (`B` transposed) where the tensor cores do not apply.
            for (b_layout, bias) in
                [(BLayout::RowMajor, false), (BLayout::Transposed, false), (BLayout::Transposed, true)]
            {
                let cfg = GemmConfig { dtype, b_layout, bias };
                out.push(Registered::new(cfg.id(), "gemm_simt", Some(dtype), move || gemm_simt(&cfg)));
            }
        }
        for cfg in registered_configs() {
            out.push(Registered::new(cfg.id(), "gemm", Some(cfg.dtype()), move || gemm_tc(&cfg)));
        }
        out
    }

    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        let mut c = Case::new([2, 2, 1]);
        let s = &mut c.scalars;
        if name == "gemm_simt" {
            s.extend([("m", 70), ("n", 65), ("k", 33)]);
        } else {
            // Partial tiles in m and n; k a multiple of 8 (16-byte loads) but not of the tile.
            s.extend([("m", 70), ("n", 72), ("k", 40)]);
            // Two batch entries, one shared weight.
            s.extend([("x_batch", 70 * 40), ("w_batch", 0), ("y_batch", 70 * 72)]);
            c.grid[2] = if id.contains(".batch") { 2 } else { 1 };
        }
        Some(c)
    }

    fn shape_lines(&self) -> &'static [ShapeLine] {
        &[
            ShapeLine {
                op: "gemv",
                dims: &["m", "n", "k"],
                format: "`gemv DTYPE m=M n=N k=K` (1 ≤ M ≤ 16)",
                parse: gemv_shape,
            },
            ShapeLine {
                op: "gemm",
                dims: &["m", "n", "k"],
                format: "`gemm DTYPE m=M n=N k=K` (M > 16, DTYPE f16 or bf16)",
                parse: gemm_shape,
            },
        ]
    }
}

fn gemv_shape(dtype: DType, dims: &[usize]) -> Result<TuneShape, String> {
    let &[m, n, k] = dims else { return Err(format!("expected m, n and k, got {} dimensions", dims.len())) };
    if m > GEMV_MAX_M {
        return Err(format!("m={m}: GEMV takes at most {GEMV_MAX_M} rows"));
    }
    Ok(TuneShape::Gemv { dtype, m, n, k })
}

fn gemm_shape(dtype: DType, dims: &[usize]) -> Result<TuneShape, String> {
    let &[m, n, k] = dims else { return Err(format!("expected m, n and k, got {} dimensions", dims.len())) };
    if m <= GEMV_MAX_M {
        return Err(format!("m={m}: up to {GEMV_MAX_M} rows run on the GEMV (a `gemv` line)"));
    }
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(format!("{dtype}: the tensor-core GEMM takes f16 or bf16"));
    }
    Ok(TuneShape::Gemm { dtype, m, n, k })
}

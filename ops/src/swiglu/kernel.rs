//! SwiGLU on the output of a fused gate/up projection: `[T, 2I]` (gate in the first `I`
//! columns, up in the last `I`) → `out[T, I] = silu(gate) · up`, computed in `f32` and rounded
//! once to the dtype. (Hugging Face rounds `silu(gate)` to the model dtype before the product;
//! rounding once is at least as accurate and differs by at most one unit in the last place.)

use ruda_ir::{Kernel, KernelBuilder, ScalarType, VerifyError};

use crate::blocks::{load_f32, silu, store_from_f32};

/// Threads per SwiGLU block (along `I`).
pub const SWIGLU_THREADS: u32 = 256;
/// Most blocks along the rows; more rows loop.
pub const SWIGLU_MAX_ROW_BLOCKS: u32 = 65535;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SwigluConfig {
    pub dtype: ScalarType,
}

impl SwigluConfig {
    /// `swiglu.bf16`.
    pub fn id(&self) -> String {
        format!("swiglu.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`swiglu`], in order.
    pub struct SwigluParams, SwigluValues for SwigluConfig as cfg {
        gate_up: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        inter: scalar(u32),
        rows: scalar(u32),
    }
}

/// Parameters: gate_up `[T, 2I]`, out `[T, I]`, inter (`I`), rows (`T`) (`u32`). Grid:
/// `(ceil(I / 256), min(T, 65535))`, block [`SWIGLU_THREADS`]; block row `y` handles rows
/// `y, y + gridDim.y, ...`.
pub fn swiglu(cfg: &SwigluConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let SwigluValues { gate_up, out, inter, rows } = SwigluParams::declare(&mut b, cfg);
    b.launch_bounds(SWIGLU_THREADS, None);

    let j = b.global_thread_id_x();
    let in_range = b.lt(j, inter);
    b.if_then(in_range, |b| {
        let first = b.block_id_y();
        let step = b.special(ruda_ir::SpecialReg::NctaidY);
        let two = b.const_u32(2);
        let width = b.mul(inter, two);
        b.for_each(first, rows, step, |b, t| {
            let t64 = b.cvt(t, ScalarType::U64);
            let w64 = b.cvt(width, ScalarType::U64);
            let inter64 = b.cvt(inter, ScalarType::U64);
            let in_off = b.mul(t64, w64);
            let in_row = b.ptr_add(gate_up, in_off);
            let out_off = b.mul(t64, inter64);
            let out_row = b.ptr_add(out, out_off);
            let g = load_f32(b, in_row, j);
            let up_idx = b.add(j, inter);
            let u = load_f32(b, in_row, up_idx);
            let s = silu(b, g);
            let y = b.mul(s, u);
            store_from_f32(b, out_row, j, y);
        });
    });
    b.finish()
}

//! RMSNorm and LayerNorm over the last axis: `f32` statistics and affine parameters, output in
//! the input dtype rounded once. One block per row; the hidden
//! size is a compile-time parameter of the kernel, so each size is its own configuration.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::{block_reduce, load_f32, row_ptr, store_from_f32, strided_fold, Combine, ROW_BLOCK};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NormConfig {
    pub dtype: ScalarType,
    pub hidden: u32,
    /// LayerNorm only: whether the kernel takes a `beta` (shift) parameter.
    pub beta: bool,
}

impl NormConfig {
    pub fn rms_id(&self) -> String {
        format!("rms_norm.{}.h{}", self.dtype, self.hidden)
    }
    pub fn layer_id(&self) -> String {
        let suffix = if self.beta { "" } else { ".nobeta" };
        format!("layer_norm.{}.h{}{suffix}", self.dtype, self.hidden)
    }
}

/// `1 / sqrt(x)` with both steps correctly rounded, so every engine agrees bit for bit.
#[track_caller]
fn inv_sqrt(b: &mut KernelBuilder, x: Value) -> Value {
    let s = b.sqrt(x);
    b.rcp(s)
}

crate::kernel_params! {
    /// The parameters of [`rms_norm`], in order.
    pub struct RmsNormParams, RmsNormValues for NormConfig as cfg {
        input: tensor(cfg.dtype),
        gamma: tensor(ScalarType::F32),
        out: tensor(cfg.dtype),
        eps: scalar(f32),
    }
}

/// `out = x / sqrt(mean(x²) + eps) * gamma`. Parameters: input, gamma (f32), out, eps (f32).
pub fn rms_norm(cfg: &NormConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.rms_id().replace('.', "_"));
    let RmsNormValues { input, gamma, out, eps } = RmsNormParams::declare(&mut b, cfg);
    b.launch_bounds(ROW_BLOCK, None);
    let scratch = b.shared_array("partials", ScalarType::F32, ROW_BLOCK / 32);

    let row_id = b.block_id_x();
    let cols = b.const_u32(cfg.hidden);
    let row_in = row_ptr(&mut b, input, row_id, cols);
    let row_out = row_ptr(&mut b, out, row_id, cols);
    let partial = strided_fold(&mut b, Combine::Sum, row_in, cols, |b, x| b.mul(x, x));
    let sum_sq = block_reduce(&mut b, Combine::Sum, partial, ROW_BLOCK, scratch);
    let h = b.const_f32(cfg.hidden as f32);
    let mean_sq = b.div(sum_sq, h);
    let var_eps = b.add(mean_sq, eps);
    let scale = inv_sqrt(&mut b, var_eps);

    let tid = b.thread_id_x();
    let step = b.const_u32(ROW_BLOCK);
    b.for_each(tid, cols, step, |b, j| {
        let x = load_f32(b, row_in, j);
        let g = load_f32(b, gamma, j);
        let y = b.mul(x, scale);
        let y = b.mul(y, g);
        store_from_f32(b, row_out, j, y);
    });
    b.finish()
}

crate::kernel_params! {
    /// The parameters of [`layer_norm`], in order (`beta` only when `cfg.beta`).
    pub struct LayerNormParams, LayerNormValues for NormConfig as cfg {
        input: tensor(cfg.dtype),
        gamma: tensor(ScalarType::F32),
        beta: opt_tensor(ScalarType::F32, cfg.beta),
        out: tensor(cfg.dtype),
        eps: scalar(f32),
    }
}

/// `out = (x - mean) / sqrt(var + eps) * gamma + beta` with a two-pass (mean, then centred
/// squares) variance. Parameters: input, gamma (f32), beta (f32, only when `cfg.beta`), out,
/// eps (f32).
pub fn layer_norm(cfg: &NormConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.layer_id().replace('.', "_"));
    let LayerNormValues { input, gamma, beta, out, eps } = LayerNormParams::declare(&mut b, cfg);
    b.launch_bounds(ROW_BLOCK, None);
    let mean_scratch = b.shared_array("mean_partials", ScalarType::F32, ROW_BLOCK / 32);
    let var_scratch = b.shared_array("var_partials", ScalarType::F32, ROW_BLOCK / 32);

    let row_id = b.block_id_x();
    let cols = b.const_u32(cfg.hidden);
    let row_in = row_ptr(&mut b, input, row_id, cols);
    let row_out = row_ptr(&mut b, out, row_id, cols);
    let h = b.const_f32(cfg.hidden as f32);

    let partial = strided_fold(&mut b, Combine::Sum, row_in, cols, |_, x| x);
    let sum = block_reduce(&mut b, Combine::Sum, partial, ROW_BLOCK, mean_scratch);
    let mean = b.div(sum, h);
    let centred_sq = |b: &mut KernelBuilder, x: Value| {
        let d = b.sub(x, mean);
        b.mul(d, d)
    };
    let partial = strided_fold(&mut b, Combine::Sum, row_in, cols, centred_sq);
    let sum_sq = block_reduce(&mut b, Combine::Sum, partial, ROW_BLOCK, var_scratch);
    let var = b.div(sum_sq, h);
    let var_eps = b.add(var, eps);
    let rstd = inv_sqrt(&mut b, var_eps);

    let tid = b.thread_id_x();
    let step = b.const_u32(ROW_BLOCK);
    b.for_each(tid, cols, step, |b, j| {
        let x = load_f32(b, row_in, j);
        let g = load_f32(b, gamma, j);
        let d = b.sub(x, mean);
        let y = b.mul(d, rstd);
        let y = match beta {
            Some(beta) => {
                let be = load_f32(b, beta, j);
                b.fma(y, g, be)
            }
            None => b.mul(y, g),
        };
        store_from_f32(b, row_out, j, y);
    });
    b.finish()
}

//! Row-wise kernels over the last axis of a `[rows, cols]` tensor, one block per row: sum and
//! max reductions, and softmax. Statistics are `f32` whatever the input dtype.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::{block_reduce, load_f32, row_ptr, store_from_f32, strided_fold, Combine, ROW_BLOCK};

/// Which row reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowReduceOp {
    Sum,
    /// Maximum; a row containing NaN reduces to NaN.
    Max,
}

impl RowReduceOp {
    pub fn name(self) -> &'static str {
        match self {
            RowReduceOp::Sum => "sum",
            RowReduceOp::Max => "max",
        }
    }

    fn combine(self) -> Combine {
        match self {
            RowReduceOp::Sum => Combine::Sum,
            RowReduceOp::Max => Combine::MaxNan,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RowReduceConfig {
    pub op: RowReduceOp,
    pub dtype: ScalarType,
}

impl RowReduceConfig {
    pub fn id(&self) -> String {
        format!("reduce_{}.{}", self.op.name(), self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`row_reduce`].
    pub struct RowReduceParams, RowReduceValues for RowReduceConfig as cfg {
        input: tensor(cfg.dtype),
        out: tensor(ScalarType::F32),
        cols: scalar(u32),
    }
}

/// `out[row] = reduce(input[row, :])`, `out` is `f32` ([`RowReduceParams`]).
pub fn row_reduce(cfg: &RowReduceConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let RowReduceValues { input, out, cols } = RowReduceParams::declare(&mut b, cfg);
    b.launch_bounds(ROW_BLOCK, None);
    let scratch = b.shared_array("partials", ScalarType::F32, ROW_BLOCK / 32);

    let row_id = b.block_id_x();
    let row = row_ptr(&mut b, input, row_id, cols);
    let how = cfg.op.combine();
    let partial = strided_fold(&mut b, how, row, cols, |_, x| x);
    let total = block_reduce(&mut b, how, partial, ROW_BLOCK, scratch);
    let tid = b.thread_id_x();
    let zero = b.const_u32(0);
    let first = b.eq(tid, zero);
    b.if_then(first, |b| {
        let p = b.ptr_add(out, row_id);
        b.store(p, total);
    });
    b.finish()
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SoftmaxConfig {
    pub dtype: ScalarType,
}

impl SoftmaxConfig {
    pub fn id(&self) -> String {
        format!("softmax.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`softmax`], in order.
    pub struct SoftmaxParams, SoftmaxValues for SoftmaxConfig as cfg {
        input: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        cols: scalar(u32),
    }
}

/// Softmax over the last axis, output in the input dtype. `exp(x - max)` uses the approximate
/// `ex2`; a row containing NaN or +inf, or only -inf, gives NaN, not a number
/// that hides the bad input ([`SoftmaxParams`]).
pub fn softmax(cfg: &SoftmaxConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let SoftmaxValues { input, out, cols } = SoftmaxParams::declare(&mut b, cfg);
    b.launch_bounds(ROW_BLOCK, None);
    let max_scratch = b.shared_array("max_partials", ScalarType::F32, ROW_BLOCK / 32);
    let sum_scratch = b.shared_array("sum_partials", ScalarType::F32, ROW_BLOCK / 32);

    let row_id = b.block_id_x();
    let row_in = row_ptr(&mut b, input, row_id, cols);
    let row_out = row_ptr(&mut b, out, row_id, cols);
    let partial_max = strided_fold(&mut b, Combine::MaxNan, row_in, cols, |_, x| x);
    let max = block_reduce(&mut b, Combine::MaxNan, partial_max, ROW_BLOCK, max_scratch);
    let log2e = b.const_f32(std::f32::consts::LOG2_E);
    let exp_shifted = |b: &mut KernelBuilder, x: Value| {
        let d = b.sub(x, max);
        let t = b.mul(d, log2e);
        b.ex2(t)
    };
    let partial_sum = strided_fold(&mut b, Combine::Sum, row_in, cols, exp_shifted);
    let sum = block_reduce(&mut b, Combine::Sum, partial_sum, ROW_BLOCK, sum_scratch);
    let inv = b.rcp(sum);
    let tid = b.thread_id_x();
    let step = b.const_u32(ROW_BLOCK);
    b.for_each(tid, cols, step, |b, j| {
        let x = load_f32(b, row_in, j);
        let e = exp_shifted(b, x);
        let y = b.mul(e, inv);
        store_from_f32(b, row_out, j, y);
    });
    b.finish()
}

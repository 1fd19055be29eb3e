//! Elementwise kernels: binary arithmetic, SiLU and dtype casts. One thread per element, all
//! arithmetic in `f32`, the result rounded to the output dtype (nearest even).

use ruda_ir::{AddrSpace, Kernel, KernelBuilder, ScalarType, Type, VerifyError};

use super::common::{load_f32, store_from_f32};

/// Threads per block of every elementwise kernel.
pub const ELEMENTWISE_BLOCK: u32 = 256;

/// Which elementwise operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementwiseOp {
    /// `out = a + b`
    Add,
    /// `out = a * b`
    Mul,
    /// `out = x * sigmoid(x)`
    Silu,
    /// `out = x` converted to the output dtype
    Cast,
}

impl ElementwiseOp {
    pub fn name(self) -> &'static str {
        match self {
            ElementwiseOp::Add => "add",
            ElementwiseOp::Mul => "mul",
            ElementwiseOp::Silu => "silu",
            ElementwiseOp::Cast => "cast",
        }
    }

    pub fn arity(self) -> usize {
        match self {
            ElementwiseOp::Add | ElementwiseOp::Mul => 2,
            ElementwiseOp::Silu | ElementwiseOp::Cast => 1,
        }
    }
}

/// One elementwise kernel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseConfig {
    pub op: ElementwiseOp,
    pub input: ScalarType,
    pub output: ScalarType,
}

impl ElementwiseConfig {
    /// `add.bf16`, `cast.f32.bf16` (from, to).
    pub fn id(&self) -> String {
        match self.op {
            ElementwiseOp::Cast => format!("cast.{}.{}", self.input, self.output),
            op => format!("{}.{}", op.name(), self.input),
        }
    }
}

/// Build the kernel. Parameters: the inputs (one or two), the output, then `n: u32`.
pub fn elementwise(cfg: &ElementwiseConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let inputs: Vec<_> = ["a", "b"][..cfg.op.arity()]
        .iter()
        .map(|name| b.param(*name, Type::Ptr(AddrSpace::Global, cfg.input)))
        .collect();
    let out = b.param("out", Type::Ptr(AddrSpace::Global, cfg.output));
    let n = b.param("n", Type::U32);
    b.launch_bounds(ELEMENTWISE_BLOCK, None);

    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let x = load_f32(b, inputs[0], i);
        let y = match cfg.op {
            ElementwiseOp::Add => {
                let other = load_f32(b, inputs[1], i);
                b.add(x, other)
            }
            ElementwiseOp::Mul => {
                let other = load_f32(b, inputs[1], i);
                b.mul(x, other)
            }
            ElementwiseOp::Silu => silu(b, x),
            ElementwiseOp::Cast => x,
        };
        store_from_f32(b, out, i, y);
    });
    b.finish()
}

/// `x / (1 + 2^(-x * log2(e)))`: one approximate `ex2`, the rest correctly rounded.
#[track_caller]
pub fn silu(b: &mut KernelBuilder, x: ruda_ir::Value) -> ruda_ir::Value {
    let neg_log2e = b.const_f32(-std::f32::consts::LOG2_E);
    let t = b.mul(x, neg_log2e);
    let e = b.ex2(t);
    let one = b.const_f32(1.0);
    let denom = b.add(one, e);
    b.div(x, denom)
}

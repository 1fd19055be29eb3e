//! The gated shared expert of Qwen3.5-MoE (and Qwen2-MoE): every token also runs one dense
//! SwiGLU MLP, whose output is scaled per token by `sigmoid(x · w_gate)` (a `[1, H]` gate) and
//! added to the routed experts' combined output:
//!
//! ```text
//! out[t, c] = routed[t, c] + sigmoid(gate[t]) · shared[t, c]
//! ```
//!
//! [`shared_expert_add_into`] is that last step, in `f32` and rounded once (transformers rounds
//! the sigmoid, the product and the sum to the dtype in turn). One thread per output element.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, VerifyError};
use ruda_runtime::{LaunchConfig, Stream, Tensor};

use crate::blocks::{load_f32, store_from_f32, FLOAT_DTYPES};
use crate::error::Result;
use crate::family::Family;
use crate::host::*;
use crate::params;
use crate::problem::Case;
use crate::registry::Registered;

/// Threads per block.
pub const SHARED_EXPERT_THREADS: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SharedExpertConfig {
    pub dtype: ScalarType,
}

impl SharedExpertConfig {
    /// `moe_shared_expert_add.bf16`.
    pub fn id(&self) -> String {
        format!("moe_shared_expert_add.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`moe_shared_expert_add`], in order.
    pub struct SharedExpertParams, SharedExpertValues for SharedExpertConfig as cfg {
        routed: tensor(cfg.dtype),
        shared: tensor(cfg.dtype),
        gate: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        n: scalar(u32),
        hidden: scalar(u32),
    }
}

/// Parameters: routed, shared, out `[T, hidden]` (`n = T · hidden` elements), gate `[T, 1]`
/// (the gate's logit per token), n, hidden. Grid: `ceil(n / 256)` blocks of
/// [`SHARED_EXPERT_THREADS`].
pub fn moe_shared_expert_add(cfg: &SharedExpertConfig) -> std::result::Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let SharedExpertValues { routed, shared, gate, out, n, hidden } = SharedExpertParams::declare(&mut b, cfg);
    b.launch_bounds(SHARED_EXPERT_THREADS, None);
    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let row = b.div(i, hidden);
        let g = load_f32(b, gate, row);
        // 1 / (1 + e^-g), e^-g as 2^(-g · log2 e).
        let neg_log2e = b.const_f32(-std::f32::consts::LOG2_E);
        let t = b.mul(g, neg_log2e);
        let e = b.ex2(t);
        let one = b.const_f32(1.0);
        let d = b.add(one, e);
        let s = load_f32(b, shared, i);
        let scaled = b.div(s, d);
        let r = load_f32(b, routed, i);
        let y = b.add(r, scaled);
        store_from_f32(b, out, i, y);
    });
    b.finish()
}

/// `out = routed + sigmoid(gate) · shared`, `gate` `[T, 1]` broadcast over each row of
/// `routed`, `shared` and `out` `[T, H]`; one float dtype and device. `out` must be a buffer of
/// its own (not `routed` or `shared`). Allocates nothing and never waits.
pub fn shared_expert_add_into(
    stream: &Stream,
    routed: &Tensor,
    shared: &Tensor,
    gate: &Tensor,
    out: &Tensor,
) -> Result<()> {
    let op = "moe_shared_expert_add";
    let dtype = float_dtype(op, routed)?;
    let &[tokens, hidden] = routed.shape() else {
        return Err(crate::error::OpError::Shape {
            op,
            message: format!("`routed` is {:?}; expected [tokens, hidden]", routed.shape()),
        });
    };
    for (name, t, shape) in [
        ("routed", routed, [tokens, hidden]),
        ("shared", shared, [tokens, hidden]),
        ("gate", gate, [tokens, 1]),
        ("out", out, [tokens, hidden]),
    ] {
        contiguous_nonempty(op, name, t)?;
        expect_shape(op, name, t, &shape)?;
        expect_dtype(op, name, t, routed.dtype())?;
    }
    same_device(op, stream, &[("routed", routed), ("shared", shared), ("gate", gate), ("out", out)])?;
    let n = to_u32(op, "elements", routed.numel())?;
    let hidden = to_u32(op, "hidden", hidden)?;
    let cfg = SharedExpertConfig { dtype };
    let k = kernel(cfg.id(), || moe_shared_expert_add(&cfg))?;
    let launch = LaunchConfig::linear(n.div_ceil(SHARED_EXPERT_THREADS), SHARED_EXPERT_THREADS);
    params::launch(stream, &k, launch, &SharedExpertParams { routed, shared, gate, out, n, hidden }.args())
}

/// [`shared_expert_add_into`] into a new tensor, on `routed`'s default stream.
pub fn shared_expert_add(routed: &Tensor, shared: &Tensor, gate: &Tensor) -> Result<Tensor> {
    let out = Tensor::empty(routed.device(), routed.dtype(), routed.shape())?;
    shared_expert_add_into(&routed.device().default_stream(), routed, shared, gate, &out)?;
    Ok(out)
}

/// The shared expert's gated add (family `moe_shared_expert_add`) in every float dtype.
pub struct MoeSharedExpert;

impl Family for MoeSharedExpert {
    fn names(&self) -> &'static [&'static str] {
        &["moe_shared_expert_add"]
    }

    fn configs(&self) -> Vec<Registered> {
        FLOAT_DTYPES
            .into_iter()
            .map(|dtype| {
                let cfg = SharedExpertConfig { dtype };
                Registered::new(cfg.id(), "moe_shared_expert_add", Some(dtype), move || moe_shared_expert_add(&cfg))
            })
            .collect()
    }

    /// 7 tokens of 100 (700 elements: three blocks, the last partly idle), special values in
    /// the gate and the rows.
    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        let mut c = Case::new([3, 1, 1]);
        c.scalars.extend([("n", 700), ("hidden", 100)]);
        c.specials = true;
        Some(c)
    }
}

//! Paged MLA (DeepSeek's absorbed decode) over a shared latent cache: per query head `h`,
//! `scores = scale · (q[h] · latentᵀ + qp[h] · kpᵀ)`, softmax over the keys the query may
//! attend (causal: positions `<=` its own), context `= P · latent` (`[queries, H, R]`; the value
//! and output projections are the caller's). `scale` is the model's original QK scale, not one
//! derived from the latent rank.
//!
//! One block handles one query, a chunk of heads (as many as its shared accumulator holds, up
//! to [`MLA_MAX_HEADS_PER_BLOCK`]: 16 at R = 512) and one split of the keys. Tiles of latent and
//! positional rows are staged once in shared memory as `f32` and serve every head of the block,
//! so in decode each latent page is read once for those heads. Scores are warp dot products;
//! the online softmax is in the log2 domain with `f32` statistics; the unnormalised
//! accumulators live in shared memory. A split writes its accumulators and `(max, sum)` to an
//! `f32` workspace ([`mla_workspace_len`]) that [`mla_combine`] merges.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

pub use super::mla_kernel::*;
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// Most splits of the keys.
pub const MLA_MAX_SPLITS: usize = 32;

/// The scheduling metadata paged MLA reads, on the device (a paged attention plan's buffers):
/// `tables` u32 `[sequences, width]` (physical pages of each sequence), `lengths` u32
/// `[sequences]` (KV length after this step's append), `sequence_ids` and `positions` u32
/// `[queries]`, with the page size and the longest length, all validated on the host.
pub struct MlaPlanView<'a> {
    pub tables: &'a Tensor,
    pub lengths: &'a Tensor,
    pub sequence_ids: &'a Tensor,
    pub positions: &'a Tensor,
    pub page_size: usize,
    pub max_length: usize,
}

const OP: &str = "paged_mla";

fn shape_error(message: String) -> OpError {
    OpError::Shape { op: OP, message }
}

/// The validated sizes of one call: (queries, heads, rank, positional dim, table width).
fn check(
    stream: &Stream,
    plan: &MlaPlanView<'_>,
    [q, qp, latent, kp]: [&Tensor; 4],
    scale: f32,
    out: &Tensor,
) -> Result<[usize; 5]> {
    float_dtype(OP, q)?;
    let named = [("q", q), ("qp", qp), ("latent", latent), ("kp", kp), ("out", out)];
    for (n, t) in named {
        contiguous_nonempty(OP, n, t)?;
        expect_dtype(OP, n, t, q.dtype())?;
        to_u32(OP, &format!("elements of `{n}`"), t.numel())?;
    }
    let u32s = [("tables", plan.tables), ("lengths", plan.lengths), ("sequence_ids", plan.sequence_ids)];
    for (n, t) in u32s.into_iter().chain([("positions", plan.positions)]) {
        contiguous_nonempty(OP, n, t)?;
        expect_dtype(OP, n, t, DType::U32)?;
    }
    let mut all: Vec<(&str, &Tensor)> = named.to_vec();
    all.extend(u32s);
    all.push(("positions", plan.positions));
    same_device(OP, stream, &all)?;
    let rank_is = |n: &str, t: &Tensor, r: usize| {
        if t.rank() == r {
            Ok(())
        } else {
            Err(shape_error(format!("`{n}` must be {r}-D, is {:?}", t.shape())))
        }
    };
    rank_is("q", q, 3)?;
    rank_is("qp", qp, 3)?;
    rank_is("latent", latent, 4)?;
    rank_is("kp", kp, 4)?;
    rank_is("tables", plan.tables, 2)?;
    let (queries, heads, rank) = (q.shape()[0], q.shape()[1], q.shape()[2]);
    let pos_dim = qp.shape()[2];
    expect_shape(OP, "qp", qp, &[queries, heads, pos_dim])?;
    let (pages, page_size) = (latent.shape()[0], latent.shape()[1]);
    if page_size != plan.page_size {
        return Err(shape_error(format!("`latent` has pages of {page_size} slots, the plan {}", plan.page_size)));
    }
    expect_shape(OP, "latent", latent, &[pages, page_size, 1, rank])?;
    expect_shape(OP, "kp", kp, &[pages, page_size, 1, pos_dim])?;
    expect_shape(OP, "out", out, &[queries, heads, rank])?;
    expect_shape(OP, "sequence_ids", plan.sequence_ids, &[queries])?;
    expect_shape(OP, "positions", plan.positions, &[queries])?;
    if !(1..=MLA_MAX_RANK).contains(&rank) {
        return Err(shape_error(format!("the latent rank R ({rank}) must be in 1..={MLA_MAX_RANK}")));
    }
    if !(1..=MLA_MAX_POS_DIM).contains(&pos_dim) {
        return Err(shape_error(format!("the positional dim P ({pos_dim}) must be in 1..={MLA_MAX_POS_DIM}")));
    }
    if !(scale.is_finite() && scale > 0.0) {
        return Err(OpError::InvalidArgument {
            op: OP,
            message: format!("scale must be finite and positive, is {scale}"),
        });
    }
    let (hb, _) = mla_block_shape(heads, rank, pos_dim);
    if queries > 65535 || heads.div_ceil(hb) > 65535 {
        return Err(OpError::InvalidArgument {
            op: OP,
            message: format!("at most 65535 queries and head chunks per launch (got {queries} queries, {heads} heads)"),
        });
    }
    Ok([queries, heads, rank, pos_dim, plan.tables.shape()[1]])
}

/// Paged MLA into `out [queries, H, R]` (see the module docs): `q [queries, H, R]` absorbed
/// queries, `qp [queries, H, P]` positional queries, `latent [pages, page_size, 1, R]` and
/// `kp [pages, page_size, 1, P]` caches, one float dtype; R in 1..=1024, P in 1..=256, a finite
/// positive `scale`. With `split = Some((workspace, splits))` (2..=32 splits, an f32 workspace
/// of at least [`mla_workspace_len`] elements) the keys are split and merged in f32; neither
/// form allocates or waits for the device.
#[allow(clippy::too_many_arguments)]
pub fn paged_mla_into(
    stream: &Stream,
    plan: &MlaPlanView<'_>,
    q: &Tensor,
    qp: &Tensor,
    latent: &Tensor,
    kp: &Tensor,
    scale: f32,
    causal: bool,
    split: Option<(&Tensor, usize)>,
    out: &Tensor,
) -> Result<()> {
    let [queries, heads, rank, pos_dim, width] = check(stream, plan, [q, qp, latent, kp], scale, out)?;
    let dtype = q.dtype().scalar_type();
    let (hb, tile) = mla_block_shape(heads, rank, pos_dim);
    let splits = match split {
        None => 1,
        Some((ws, splits)) => {
            if !(2..=MLA_MAX_SPLITS).contains(&splits) {
                return Err(OpError::InvalidArgument {
                    op: OP,
                    message: format!("splits ({splits}) must be in 2..={MLA_MAX_SPLITS}"),
                });
            }
            let need = mla_workspace_len(queries, heads, rank, splits);
            expect_dtype(OP, "workspace", ws, DType::F32)?;
            same_device(OP, stream, &[("workspace", ws)])?;
            if !ws.is_contiguous() || ws.numel() < need {
                return Err(shape_error(format!(
                    "the workspace must be contiguous with at least {need} f32 elements, has {}",
                    ws.numel()
                )));
            }
            to_u32(OP, "workspace elements", need)?;
            splits
        }
    };
    let cfg = PagedMlaConfig { dtype, split: split.is_some() };
    let kern = kernel(cfg.id(), || paged_mla(&cfg))?;
    let block = [MLA_THREADS, 1, 1];
    let launch = LaunchConfig {
        grid: [splits as u32, heads.div_ceil(hb) as u32, queries as u32],
        block,
        dynamic_shared_bytes: 0,
    };
    let u = |what: &str, n: usize| to_u32(OP, what, n);
    let split_len = split.map(|(_, s)| plan.max_length.div_ceil(s).max(1) as u32);
    let params = PagedMlaParams {
        q,
        qp,
        latent,
        kp,
        tables: plan.tables,
        lengths: plan.lengths,
        sequence_ids: plan.sequence_ids,
        positions: plan.positions,
        out: split.is_none().then_some(out),
        workspace: split.map(|(ws, _)| ws),
        scale,
        heads: heads as u32,
        rank: rank as u32,
        pos_dim: pos_dim as u32,
        page_size: u("page_size", plan.page_size)?,
        table_width: u("table width", width)?,
        heads_per_block: hb as u32,
        tile: tile as u32,
        causal: causal as u32,
        split_len,
    };
    params::launch(stream, &kern, launch, &params.args())?;
    if let Some((ws, _)) = split {
        let kern = kernel(cfg.combine_id(), || mla_combine(&cfg))?;
        let launch = LaunchConfig {
            grid: [(rank as u32).div_ceil(MLA_THREADS), heads as u32, queries as u32],
            block,
            dynamic_shared_bytes: 0,
        };
        let p = MlaCombineParams { workspace: ws, out, heads: heads as u32, rank: rank as u32, splits: splits as u32 };
        params::launch(stream, &kern, launch, &p.args())?;
    }
    Ok(())
}

/// Paged MLA on `q`'s default stream, a new `[queries, H, R]` output (see [`paged_mla_into`]).
#[allow(clippy::too_many_arguments)]
pub fn paged_mla_forward(
    plan: &MlaPlanView<'_>,
    q: &Tensor,
    qp: &Tensor,
    latent: &Tensor,
    kp: &Tensor,
    scale: f32,
    causal: bool,
    split: Option<(&Tensor, usize)>,
) -> Result<Tensor> {
    let out = Tensor::empty(q.device(), q.dtype(), q.shape())?;
    paged_mla_into(&q.device().default_stream(), plan, q, qp, latent, kp, scale, causal, split, &out)?;
    Ok(out)
}

/// The paged MLA kernels in every float dtype, unsplit and split, with the split merge (family
/// `paged_mla`).
pub struct PagedMla;

impl crate::family::Family for PagedMla {
    fn names(&self) -> &'static [&'static str] {
        &["paged_mla"]
    }

    fn configs(&self) -> Vec<crate::registry::Registered> {
        use crate::registry::Registered;
        let mut out = Vec::new();
        for dtype in crate::blocks::FLOAT_DTYPES {
            for split in [false, true] {
                let cfg = PagedMlaConfig { dtype, split };
                out.push(Registered::new(cfg.id(), "paged_mla", Some(dtype), move || paged_mla(&cfg)));
            }
            let cfg = PagedMlaConfig { dtype, split: true };
            out.push(Registered::new(cfg.combine_id(), "paged_mla", Some(dtype), move || mla_combine(&cfg)));
        }
        out
    }

    fn sample(&self, _: &str, id: &str) -> Option<crate::problem::Case> {
        if id.starts_with("paged_mla_combine") {
            // Two queries, three heads, rank 64, two splits.
            let mut c = crate::problem::Case::new([1, 3, 2]);
            c.scalars.extend([("heads", 3), ("rank", 64), ("splits", 2)]);
            return Some(c);
        }
        // Two sequences of 13 and 7 keys over pages of 4 slots (8 physical pages, shuffled),
        // causal queries at positions 12 and 3; 3 heads, rank 64, positional dim 16.
        let split = id.ends_with(".split");
        let mut c = crate::problem::Case::new([if split { 2 } else { 1 }, 1, 2]);
        c.indices.insert("tables", vec![5, 2, 7, 0, 3, 6, 1, 4]);
        c.indices.insert("lengths", vec![13, 7]);
        c.indices.insert("sequence_ids", vec![0, 1]);
        c.indices.insert("positions", vec![12, 3]);
        let (hb, tile) = mla_block_shape(3, 64, 16);
        c.scalars.extend([("heads", 3), ("rank", 64), ("pos_dim", 16), ("page_size", 4), ("table_width", 4)]);
        c.scalars.extend([("heads_per_block", hb as u64), ("tile", tile as u64), ("causal", 1), ("split_len", 8)]);
        Some(c)
    }
}

impl super::api::DevicePlan {
    /// The plan's buffers as paged MLA reads them (the per-query ones cut to the plan's queries).
    fn mla_view(&self) -> Result<(Tensor, Tensor)> {
        Ok((self.sequence_ids.narrow(0, 0, self.queries)?, self.positions.narrow(0, 0, self.queries)?))
    }

    /// Paged MLA over this plan into `out [queries, H, R]` on `stream` (see [`paged_mla_into`];
    /// `split` as there): no allocation, no synchronisation.
    #[allow(clippy::too_many_arguments)]
    pub fn mla_into(
        &self,
        stream: &Stream,
        q: &Tensor,
        qp: &Tensor,
        latent: &Tensor,
        kp: &Tensor,
        scale: f32,
        causal: bool,
        split: Option<(&Tensor, usize)>,
        out: &Tensor,
    ) -> Result<()> {
        if latent.shape().first() != Some(&self.pages) {
            return Err(shape_error(format!(
                "`latent` must have the plan's {} pages, is {:?}",
                self.pages,
                latent.shape()
            )));
        }
        let (sequence_ids, positions) = self.mla_view()?;
        let view = MlaPlanView {
            tables: &self.tables,
            lengths: &self.lengths,
            sequence_ids: &sequence_ids,
            positions: &positions,
            page_size: self.page_size,
            max_length: self.max_length,
        };
        paged_mla_into(stream, &view, q, qp, latent, kp, scale, causal, split, out)
    }

    /// Paged MLA over this plan, unsplit: absorbed queries `q [queries, H, R]`, positional
    /// queries `qp [queries, H, P]`, caches `latent [pages, page_size, 1, R]` and
    /// `kp [pages, page_size, 1, P]` → compressed context `[queries, H, R]` (see the module docs).
    pub fn mla(
        &self,
        q: &Tensor,
        qp: &Tensor,
        latent: &Tensor,
        kp: &Tensor,
        scale: f32,
        causal: bool,
    ) -> Result<Tensor> {
        let out = Tensor::empty(q.device(), q.dtype(), q.shape())?;
        self.mla_into(&q.buffer().stream(), q, qp, latent, kp, scale, causal, None, &out)?;
        Ok(out)
    }

    /// Split paged MLA over this plan on `q`'s stream, over `workspace`'s splits (made for `q`'s
    /// queries and heads with value dim R, on that stream): a new `[queries, H, R]` (see
    /// [`mla`](Self::mla) and [`paged_mla_into`]).
    #[allow(clippy::too_many_arguments)]
    pub fn mla_with_workspace(
        &self,
        q: &Tensor,
        qp: &Tensor,
        latent: &Tensor,
        kp: &Tensor,
        scale: f32,
        causal: bool,
        workspace: &super::attention::SplitWorkspace,
    ) -> Result<Tensor> {
        let stream = q.buffer().stream();
        let [queries, heads, rank] = match *q.shape() {
            [a, b, c] => [a, b, c],
            _ => return Err(shape_error(format!("`q` must be [queries, heads, rank], is {:?}", q.shape()))),
        };
        let split = workspace.check(&stream, queries, heads, rank)?;
        let out = Tensor::empty_on(&stream, q.dtype(), q.shape())?;
        self.mla_into(&stream, q, qp, latent, kp, scale, causal, Some(split), &out)?;
        Ok(out)
    }
}

//! Mixture-of-experts routing: which experts each token goes to, and with what weights.
//!
//! - [`api::route`]: softmax over all experts in `f32`, top-k, optional renormalisation
//!   (Hugging Face's Qwen3-MoE `norm_topk_prob`; Mixtral's softmax over the top k is the
//!   renormalised form);
//! - [`api::route_sigmoid_grouped`]: sigmoid scores, a correction bias for selection only,
//!   group-limited top-k, weights from the original scores (DeepSeek-V3's `noaux_tc`).
//!
//! Both return a [`api::RoutingPlan`] (`u32 [T, top_k]` expert ids, best first, and `[T,
//! top_k]` weights in the logits' dtype); ties go to lower ids; rows with NaN or `+inf`, or only
//! `-inf`, get NaN weights and the indices `0..top_k`. The kernels (one block per token, a
//! thread per expert, selection by rank in shared memory) are documented in [`kernel`].
//!
//! Then [`experts`]: `RoutingPlan::dispatch` groups token rows by expert (a stable counting
//! sort, [`dispatch`]), `SwiGluExperts` runs each expert's SwiGLU MLP on its rows as grouped
//! GEMMs (SIMT or tensor cores, [`grouped`]), and `DispatchedTokens::combine` adds the
//! weighted expert rows back in token order. For a decode step ([`decode`]), the experts run
//! as GEMVs on the routing slots directly, each selected expert's weights read once.
//!
//! [`shared`]: Qwen3.5-MoE's gated shared expert, added to the routed experts' output.
//!
//! [`training`]: the weights of a fixed selection and their gradient with respect to the
//! logits, for first-order router training (kernels in [`training_kernel`]);
//! [`expert_training`]: the experts' and the combine's backward (scalar kernels in
//! [`expert_training_kernel`], tensor-core ones in [`expert_training_tc`]).

pub mod api;
pub mod decode;
pub mod dispatch;
pub mod expert_training;
pub mod expert_training_kernel;
pub mod expert_training_tc;
pub mod experts;
pub mod grouped;
pub mod kernel;
pub mod shared;
pub mod training;
pub mod training_kernel;
pub mod tune;

use crate::blocks::FLOAT_DTYPES;
use crate::family::{Family, ShapeLine};
use crate::problem::{f32_bits, Case};
use crate::registry::Registered;
use crate::tune::TuneShape;
use dispatch::{
    moe_combine, moe_dispatch_count, moe_dispatch_scan, moe_dispatch_scatter, CombineConfig, DispatchCountConfig,
    DispatchScanConfig, DispatchScatterConfig,
};
use expert_training_kernel::{
    moe_combine_grad_rows, moe_combine_grad_weights, moe_expert_grad_act, moe_expert_grad_input,
    moe_expert_grad_swiglu, moe_expert_grad_weight, CombineGradWeightsConfig, ExpertGradConfig, ExpertGradInputConfig,
    ExpertGradWeightConfig,
};
use expert_training_tc::{moe_expert_grad_weight_tc, moe_grouped_tc_nn, registered_backward_configs};
use grouped::{moe_grouped_simt, moe_grouped_tc, registered_tc_configs, GroupedSimtConfig};
use kernel::{moe_route, moe_route_grouped, GroupedRouteConfig, RouteConfig};
use ruda_ir::ScalarType;
use ruda_runtime::DType;
use training_kernel::{moe_router_backward, moe_router_weights, RouterTrainConfig, INDEX_DTYPES};

/// The routing kernels in every float dtype: softmax top-k (family `moe_route`) and grouped
/// sigmoid top-k without and with a correction bias (family `moe_route_grouped`); the dispatch
/// (`moe_dispatch_count` per weight dtype, `moe_dispatch_scan`, `moe_dispatch_scatter` per
/// dtype), the combine (`moe_combine`), and the experts' grouped GEMMs (`moe_grouped_simt`
/// per dtype, `moe_grouped_tc` per f16/bf16 tile).
pub struct Moe;

impl Family for Moe {
    fn shape_lines(&self) -> &'static [ShapeLine] {
        &[ShapeLine {
            op: "moe_experts",
            dims: &["tokens", "experts", "top_k", "hidden", "inter"],
            format:
                "`moe_experts DTYPE tokens=T experts=E top_k=K hidden=H inter=I` (DTYPE f16 or bf16, K ≤ E ≤ 1024, \
                     H and I multiples of 8)",
            parse: experts_shape,
        }]
    }

    fn names(&self) -> &'static [&'static str] {
        &[
            "moe_route",
            "moe_route_grouped",
            "moe_dispatch_count",
            "moe_dispatch_scan",
            "moe_dispatch_scatter",
            "moe_combine",
            "moe_grouped_simt",
            "moe_grouped_tc",
        ]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let cfg = RouteConfig { dtype };
            out.push(Registered::new(cfg.id(), "moe_route", Some(dtype), move || moe_route(&cfg)));
            for bias in [false, true] {
                let cfg = GroupedRouteConfig { dtype, bias };
                out.push(Registered::new(cfg.id(), "moe_route_grouped", Some(dtype), move || moe_route_grouped(&cfg)));
            }
        }
        for dtype in FLOAT_DTYPES {
            let cfg = DispatchCountConfig { weight_dtype: dtype };
            out.push(Registered::new(cfg.id(), "moe_dispatch_count", Some(dtype), move || moe_dispatch_count(&cfg)));
        }
        out.push(Registered::new(DispatchScanConfig.id(), "moe_dispatch_scan", None, || {
            moe_dispatch_scan(&DispatchScanConfig)
        }));
        for dtype in FLOAT_DTYPES {
            let cfg = DispatchScatterConfig { dtype };
            out.push(Registered::new(cfg.id(), "moe_dispatch_scatter", Some(dtype), move || {
                moe_dispatch_scatter(&cfg)
            }));
            let cfg = CombineConfig { dtype };
            out.push(Registered::new(cfg.id(), "moe_combine", Some(dtype), move || moe_combine(&cfg)));
            let cfg = GroupedSimtConfig { dtype };
            out.push(Registered::new(cfg.id(), "moe_grouped_simt", Some(dtype), move || moe_grouped_simt(&cfg)));
        }
        for cfg in registered_tc_configs() {
            out.push(Registered::new(cfg.id(), "moe_grouped_tc", Some(cfg.dtype()), move || moe_grouped_tc(&cfg)));
        }
        out
    }

    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        if let Some(c) = experts_sample(name, id) {
            return Some(c);
        }
        // Three tokens; 60 experts (Qwen1.5-MoE's count: not a multiple of a warp) top-8, or
        // 64 experts in 8 groups, 3 kept, top-6 (DeepSeek-V3's rules at a small size).
        let mut c = Case::new([3, 1, 1]);
        if name == "moe_route" {
            c.scalars.extend([("experts", 60), ("top_k", 8), ("renormalize", 1)]);
        } else {
            c.scalars.extend([
                ("experts", 64),
                ("top_k", 6),
                ("groups", 8),
                ("selected_groups", 3),
                ("group_top_two", 1),
                ("renormalize", 1),
                ("scale", f32_bits(2.5)),
            ]);
        }
        Some(c)
    }
}

/// A `moe_experts` line: the sizes the tensor-core grouped GEMMs take.
fn experts_shape(dtype: DType, dims: &[usize]) -> Result<TuneShape, String> {
    let &[tokens, experts, top_k, hidden, inter] = dims else {
        return Err(format!("expected tokens, experts, top_k, hidden and inter, got {} dimensions", dims.len()));
    };
    if dtype == DType::F32 {
        return Err("f32: the tensor-core grouped GEMM takes f16 or bf16".into());
    }
    if experts > kernel::MAX_EXPERTS as usize || top_k > experts {
        return Err(format!("top_k={top_k} of experts={experts}: need top_k ≤ experts ≤ {}", kernel::MAX_EXPERTS));
    }
    let multiple = crate::gemm::kernels::tc::GemmTcConfig::K_MULTIPLE as usize;
    if !hidden.is_multiple_of(multiple) || !inter.is_multiple_of(multiple) {
        return Err(format!(
            "hidden={hidden}, inter={inter}: the tensor-core grouped GEMM needs multiples of {multiple}"
        ));
    }
    Ok(TuneShape::MoeExperts { dtype, tokens, experts, top_k, hidden, inter })
}

/// The sample problems of the dispatch, combine and grouped GEMM kernels: 200 tokens routed to
/// 3 of 5 experts (600 entries, three chunks, the last partial) with a hidden size of 40; the
/// grouped GEMMs over 135 rows of 3 experts, the middle one empty (partial tiles, a row tile
/// bound above the tiles), 72 columns written 80 apart, `k` = 40.
fn experts_sample(name: &str, id: &str) -> Option<Case> {
    const TOKENS: u32 = 200;
    const TOP_K: u32 = 3;
    const EXPERTS: u32 = 5;
    const ENTRIES: u32 = TOKENS * TOP_K;
    let chunks = ENTRIES.div_ceil(dispatch::DISPATCH_CHUNK);
    // Entry i goes to expert (7i + i / 9) mod 5: every expert, uneven runs.
    let ids: Vec<u32> = (0..ENTRIES).map(|i| (7 * i + i / 9) % EXPERTS).collect();
    let mut c = Case::new([chunks, 1, 1]);
    match name {
        "moe_dispatch_count" => {
            c.indices.insert("indices", ids);
            c.scalars.extend([("entries", ENTRIES as u64), ("experts", EXPERTS as u64)]);
        }
        "moe_dispatch_scan" => {
            c.grid = [1, 1, 1];
            c.scalars.extend([("chunks", chunks as u64), ("experts", EXPERTS as u64)]);
        }
        "moe_dispatch_scatter" => {
            // The scan's outputs for `ids`: per-chunk prefixes and expert offsets.
            let mut counts = vec![0u32; (chunks * EXPERTS) as usize];
            let mut total = vec![0u32; EXPERTS as usize];
            for ch in 0..chunks as usize {
                for e in 0..EXPERTS as usize {
                    counts[ch * EXPERTS as usize + e] = total[e];
                }
                for &e in
                    ids.iter().skip(ch * dispatch::DISPATCH_CHUNK as usize).take(dispatch::DISPATCH_CHUNK as usize)
                {
                    total[e as usize] += 1;
                }
            }
            let offsets: Vec<u32> = std::iter::once(0)
                .chain(total.iter().scan(0, |acc, &n| {
                    *acc += n;
                    Some(*acc)
                }))
                .collect();
            c.indices.extend([("indices", ids), ("counts", counts), ("offsets", offsets)]);
            c.scalars.extend([
                ("entries", ENTRIES as u64),
                ("experts", EXPERTS as u64),
                ("top_k", TOP_K as u64),
                ("hidden", 40),
            ]);
        }
        "moe_combine" => {
            // Rows in a scattered order; 200 tokens over two block rows (the token loop).
            let rows: Vec<u32> = (0..ENTRIES).map(|i| (i * 7) % ENTRIES).collect();
            c.grid = [1, 2, 1];
            c.indices.insert("slot_rows", rows);
            c.scalars.extend([("tokens", TOKENS as u64), ("top_k", TOP_K as u64), ("hidden", 40)]);
        }
        "moe_grouped_simt" | "moe_grouped_tc" => {
            let (rows, experts, n) = (135u32, 3u32, 72u32);
            let (bm, bn) = if name == "moe_grouped_simt" {
                (grouped::SIMT_BM, grouped::SIMT_BN)
            } else {
                let tile = id.split('.').find_map(crate::gemm::tile::TcTile::from_name)?;
                tile.dims()
            };
            c.grid = [n.div_ceil(bn), grouped::row_tiles_bound(rows, experts, bm), 1];
            c.indices.insert("offsets", vec![0, 70, 70, rows]);
            c.scalars.extend([
                ("experts", experts as u64),
                ("n", n as u64),
                ("k", 40),
                ("ldy", 80),
                ("w_stride", (n * 40) as u64),
            ]);
        }
        _ => return None,
    }
    Some(c)
}

/// The router-training kernels in every float and index dtype: the selection's weights (family
/// `moe_router_weights`) and the logits' gradient (`moe_router_backward`).
pub struct MoeRouterTraining;

impl Family for MoeRouterTraining {
    fn names(&self) -> &'static [&'static str] {
        &["moe_router_weights", "moe_router_backward"]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            for index in INDEX_DTYPES {
                let cfg = RouterTrainConfig { dtype, index };
                let weights = move || moe_router_weights(&cfg);
                out.push(Registered::new(cfg.weights_id(), "moe_router_weights", Some(dtype), weights));
                let backward = move || moe_router_backward(&cfg);
                out.push(Registered::new(cfg.backward_id(), "moe_router_backward", Some(dtype), backward));
            }
        }
        out
    }

    fn sample(&self, _: &str, _: &str) -> Option<Case> {
        // Three tokens, 60 experts (not a multiple of a warp), top-8 renormalised softmax
        // weights scaled by 2.5.
        let mut c = Case::new([3, 1, 1]);
        c.scalars.extend([("experts", 60), ("top_k", 8), ("sigmoid", 0), ("renormalize", 1), ("scale", f32_bits(2.5))]);
        Some(c)
    }
}

/// The experts' training kernels in every float dtype (ruDNN section 12): the combine's
/// backward (`moe_combine_grad_rows`, `moe_combine_grad_weights` serial and plane), the SwiGLU
/// experts' data gradients (`moe_expert_grad_act`, `moe_expert_grad_input` for split and fused
/// gate/up) and weight gradients (`moe_expert_grad_weight`, an `f32` or dtype left operand times
/// a dtype right one); in f16 and bf16 the tensor-core backward's (`moe_grouped_tc_nn`,
/// `moe_expert_grad_swiglu`, `moe_expert_grad_weight_tc`).
pub struct MoeExpertTraining;

impl Family for MoeExpertTraining {
    fn names(&self) -> &'static [&'static str] {
        &[
            "moe_combine_grad_rows",
            "moe_combine_grad_weights",
            "moe_expert_grad_act",
            "moe_expert_grad_input",
            "moe_expert_grad_weight",
            "moe_expert_grad_swiglu",
            "moe_grouped_tc_nn",
            "moe_expert_grad_weight_tc",
        ]
    }

    fn configs(&self) -> Vec<Registered> {
        let mut out = Vec::new();
        for dtype in FLOAT_DTYPES {
            let cfg = ExpertGradConfig { dtype };
            out.push(Registered::new(cfg.rows_id(), "moe_combine_grad_rows", Some(dtype), move || {
                moe_combine_grad_rows(&cfg)
            }));
            for plane in [false, true] {
                let cfg = CombineGradWeightsConfig { dtype, plane };
                out.push(Registered::new(cfg.id(), "moe_combine_grad_weights", Some(dtype), move || {
                    moe_combine_grad_weights(&cfg)
                }));
            }
            out.push(Registered::new(cfg.act_id(), "moe_expert_grad_act", Some(dtype), move || {
                moe_expert_grad_act(&cfg)
            }));
            for fused in [false, true] {
                let cfg = ExpertGradInputConfig { dtype, fused };
                out.push(Registered::new(cfg.id(), "moe_expert_grad_input", Some(dtype), move || {
                    moe_expert_grad_input(&cfg)
                }));
            }
            let mut lefts = vec![ScalarType::F32];
            if dtype != ScalarType::F32 {
                lefts.push(dtype);
            }
            for a in lefts {
                let cfg = ExpertGradWeightConfig { a, b: dtype };
                out.push(Registered::new(cfg.id(), "moe_expert_grad_weight", Some(dtype), move || {
                    moe_expert_grad_weight(&cfg)
                }));
            }
            if dtype != ScalarType::F32 {
                out.push(Registered::new(cfg.swiglu_id(), "moe_expert_grad_swiglu", Some(dtype), move || {
                    moe_expert_grad_swiglu(&cfg)
                }));
            }
        }
        let (nn, weight) = registered_backward_configs();
        for cfg in nn {
            out.push(Registered::new(cfg.id(), "moe_grouped_tc_nn", Some(cfg.dtype()), move || {
                moe_grouped_tc_nn(&cfg)
            }));
        }
        for cfg in weight {
            out.push(Registered::new(cfg.id(), "moe_expert_grad_weight_tc", Some(cfg.dtype()), move || {
                moe_expert_grad_weight_tc(&cfg)
            }));
        }
        out
    }

    fn sample(&self, name: &str, id: &str) -> Option<Case> {
        expert_training_sample(name, id)
    }
}

/// The sample problems of the experts' training kernels: 70 tokens routed to 2 of 5 experts
/// (140 rows; entry `i` goes to `(3i + i / 7) mod 5`, so the rows of an expert are uneven),
/// hidden size 40, intermediate 24; the weight gradients over the rows of 3 experts, the middle
/// one empty (on tensor cores a 72 × 80 output per expert: two block rows and columns of the
/// small tile, 70 and 65 rows: partial `k` tiles from offsets that are not multiples of 8); the
/// grouped GEMM as the forward's sample.
fn expert_training_sample(name: &str, id: &str) -> Option<Case> {
    const TOKENS: u32 = 70;
    const TOP_K: u32 = 2;
    const EXPERTS: u32 = 5;
    const ROWS: u32 = TOKENS * TOP_K;
    const HIDDEN: u32 = 40;
    const INTER: u32 = 24;
    let ids: Vec<u32> = (0..ROWS).map(|i| (3 * i + i / 7) % EXPERTS).collect();
    let mut counts = vec![0u32; EXPERTS as usize];
    for &e in &ids {
        counts[e as usize] += 1;
    }
    let offsets: Vec<u32> = std::iter::once(0)
        .chain(counts.iter().scan(0, |acc, &n| {
            *acc += n;
            Some(*acc)
        }))
        .collect();
    // The stable counting sort's entry → row map.
    let mut next = offsets.clone();
    let slot_rows: Vec<u32> = ids
        .iter()
        .map(|&e| {
            let r = next[e as usize];
            next[e as usize] += 1;
            r
        })
        .collect();
    let mut c = Case::new([1, 1, 1]);
    match name {
        "moe_combine_grad_rows" => {
            c.grid = [HIDDEN.div_ceil(expert_training_kernel::GRAD_THREADS), ROWS, 1];
            c.indices.insert("slot_rows", slot_rows);
            c.scalars.extend([("entries", ROWS as u64), ("top_k", TOP_K as u64), ("hidden", HIDDEN as u64)]);
        }
        "moe_combine_grad_weights" => {
            // Enough blocks for the plane form (a warp per entry); the serial one's extra
            // blocks find no entries.
            c.grid = [ROWS.div_ceil(expert_training_kernel::PLANE_WARPS), 1, 1];
            c.indices.insert("slot_rows", slot_rows);
            c.scalars.extend([("entries", ROWS as u64), ("top_k", TOP_K as u64), ("hidden", HIDDEN as u64)]);
        }
        "moe_expert_grad_act" | "moe_expert_grad_input" | "moe_expert_grad_swiglu" => {
            let cols = if name == "moe_expert_grad_act" { INTER } else { HIDDEN };
            c.grid = [cols.div_ceil(expert_training_kernel::GRAD_THREADS), 64, 1];
            c.indices.insert("offsets", offsets);
            c.scalars.extend([
                ("rows", ROWS as u64),
                ("experts", EXPERTS as u64),
                ("hidden", HIDDEN as u64),
                ("inter", INTER as u64),
                ("w_stride", (2 * INTER * HIDDEN) as u64),
                ("up_offset", (INTER * HIDDEN) as u64),
            ]);
        }
        "moe_expert_grad_weight" => {
            c.grid = [HIDDEN.div_ceil(expert_training_kernel::GRAD_THREADS), INTER, 3];
            c.indices.insert("offsets", vec![0, 70, 70, ROWS]);
            c.scalars.extend([
                ("p", INTER as u64),
                ("q", HIDDEN as u64),
                ("lda", (2 * INTER) as u64),
                ("ldb", HIDDEN as u64),
                ("a_offset", INTER as u64),
                ("b_offset", 0),
            ]);
        }
        "moe_expert_grad_weight_tc" => {
            let (m, n) = (72u32, 80u32);
            let (bm, bn) = id.split('.').find_map(crate::gemm::tile::TcTile::from_name)?.dims();
            c.grid = [n.div_ceil(bn), m.div_ceil(bm), 3];
            c.indices.insert("offsets", vec![0, 70, 70, 135]);
            c.scalars.extend([("m", m as u64), ("n", n as u64), ("lda", 88), ("ldb", 80), ("a_offset", 8)]);
        }
        "moe_grouped_tc_nn" => {
            let (rows, experts, n) = (135u32, 3u32, 72u32);
            let (bm, bn) = id.split('.').find_map(crate::gemm::tile::TcTile::from_name)?.dims();
            c.grid = [n.div_ceil(bn), grouped::row_tiles_bound(rows, experts, bm), 1];
            c.indices.insert("offsets", vec![0, 70, 70, rows]);
            c.scalars.extend([
                ("experts", experts as u64),
                ("n", n as u64),
                ("k", 40),
                ("ldy", 80),
                ("w_stride", (n * 40) as u64),
                ("split_k", 24),
            ]);
        }
        _ => return None,
    }
    Some(c)
}

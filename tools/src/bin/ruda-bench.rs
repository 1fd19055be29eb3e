//! `ruda-bench`: times RUDA's ops on the device `RUDA_DEVICE` names and prints one JSON object
//! per line. The GPU rung (`scripts/gpu/run.sh`) runs it beside `bench/baseline.py`, which times
//! the same problems (same `op` and `shape`) with PyTorch on the same GPU;
//! `scripts/gpu/summarize.py` joins them into ratios.
//!
//! `ruda-bench --help` lists the flags (`--list`, `--quick`, the sample time and count, the
//! time budget), the filters and `--exclude`.
//!
//! Output lines: `{"op","shape","tag","ruda_ms","iters","flops","bytes"}` plus `"base"` (the
//! baseline row's op, when it differs) and `"splits"` (decode attention, GEMV) where they
//! apply. Progress goes to stderr.

use std::error::Error;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use half::bf16;
use ruda_ir::{AddrSpace, KernelBuilder, ScalarType, Type};
use ruda_ops::api;
use ruda_ops::gated_delta::api::{chunk_gated_delta_rule, gated_delta_rule, GatedDeltaInput};
use ruda_ops::tune::{tuned_decode_splits, tuned_gemv_splits};
use ruda_runtime::{Arg, DType, Device, Element, HashedKernel, LaunchConfig, Stream, Tensor};

type BoxError = Box<dyn Error>;
/// One timed launch of an op on its prepared inputs.
type Launch = Box<dyn Fn(&Stream) -> Result<(), BoxError>>;
/// Allocates a benchmark's inputs on a device; returns the launch and the split count chosen.
type Make = Box<dyn Fn(&Device) -> Result<(Launch, Option<usize>), BoxError>>;

struct Bench {
    op: &'static str,
    shape: Vec<usize>,
    /// Where the shape comes from (`qwen3-0.6b gate_up`, `square`), for the reader.
    tag: String,
    /// The baseline row's op when this row is a variant of it (tuned vs heuristic).
    base: Option<&'static str>,
    flops: f64,
    /// Bytes the op must move at least (inputs read once, outputs written once).
    bytes: f64,
    make: Make,
}

impl Bench {
    fn line(&self) -> String {
        format!("{} {:?} {}", self.op, self.shape, self.tag)
    }
}

/// A Qwen model's projection sizes.
struct Model {
    name: &'static str,
    hidden: usize,
    intermediate: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    vocab: usize,
}

const QWEN25_05B: Model = Model {
    name: "qwen2.5-0.5b",
    hidden: 896,
    intermediate: 4864,
    heads: 14,
    kv_heads: 2,
    head_dim: 64,
    vocab: 151_936,
};
const QWEN3_06B: Model = Model {
    name: "qwen3-0.6b",
    hidden: 1024,
    intermediate: 3072,
    heads: 16,
    kv_heads: 8,
    head_dim: 128,
    vocab: 151_936,
};
const TINY: Model =
    Model { name: "tiny", hidden: 128, intermediate: 256, heads: 2, kv_heads: 1, head_dim: 64, vocab: 1000 };

/// `len` pseudo-random values in [-1, 1).
fn uniform(len: usize, seed: u64) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// A tensor of `shape` holding `block` repeated (the values do not change the timing, and large
/// tensors are made quickly).
fn repeated<T: Element>(device: &Device, block: &[T], shape: &[usize]) -> Result<Tensor, BoxError> {
    let n: usize = shape.iter().product();
    let data: Vec<T> = block.iter().copied().cycle().take(n).collect();
    Ok(Tensor::from_slice(device, &data, shape)?)
}

/// Pseudo-random bf16 values in [-1, 1): a 64 Ki-element block, repeated.
fn random_bf16(device: &Device, shape: &[usize], seed: u64) -> Result<Tensor, BoxError> {
    let n: usize = shape.iter().product();
    let block: Vec<bf16> = uniform(n.min(1 << 16), seed).into_iter().map(bf16::from_f32).collect();
    repeated(device, &block, shape)
}

/// Pseudo-random bf16 rows (the last axis) of unit L2 norm, as the gated delta rule's queries
/// and keys arrive: a block of whole rows (at least 64 Ki elements), repeated.
fn random_unit_rows_bf16(device: &Device, shape: &[usize], seed: u64) -> Result<Tensor, BoxError> {
    let n: usize = shape.iter().product();
    let row = shape.last().copied().unwrap_or(1).max(1);
    let mut block = uniform(n.min(row * (1usize << 16).div_ceil(row)), seed);
    for r in block.chunks_mut(row) {
        let norm = r.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-6);
        r.iter_mut().for_each(|x| *x /= norm);
    }
    let block: Vec<bf16> = block.into_iter().map(bf16::from_f32).collect();
    repeated(device, &block, shape)
}

/// Pseudo-random f32 values `f(u)`, `u` in [-1, 1): a 64 Ki-element block, repeated.
fn random_f32(device: &Device, shape: &[usize], seed: u64, f: fn(f32) -> f32) -> Result<Tensor, BoxError> {
    let n: usize = shape.iter().product();
    let block: Vec<f32> = uniform(n.min(1 << 16), seed).into_iter().map(f).collect();
    repeated(device, &block, shape)
}

/// `dst = src` in 16-byte vectors, one per thread: the device-to-device copy bandwidth that
/// the memory-bound ops are compared with.
fn copy_kernel() -> Result<HashedKernel, BoxError> {
    let mut b = KernelBuilder::new("bench_copy_u32x4");
    let src = b.param("src", Type::Ptr(AddrSpace::Global, ScalarType::U32));
    let dst = b.param("dst", Type::Ptr(AddrSpace::Global, ScalarType::U32));
    let chunks = b.param("chunks", Type::U32);
    b.launch_bounds(256, None);
    let i = b.global_thread_id_x();
    let in_range = b.lt(i, chunks);
    b.if_then(in_range, |b| {
        let four = b.const_u32(4);
        let word = b.mul(i, four);
        let from = b.ptr_add(src, word);
        let v = b.load_vec(from, 4);
        let to = b.ptr_add(dst, word);
        b.store(to, v);
    });
    let mut k = b.finish()?;
    ruda_ir::passes::optimize(&mut k)?;
    Ok(HashedKernel::new(k))
}

fn linear_bench(op: &'static str, m: usize, n: usize, k: usize, tag: String, tuned: bool) -> Bench {
    let bytes = 2.0 * (m * k + n * k + m * n) as f64;
    let make: Make = Box::new(move |dev| {
        let x = random_bf16(dev, &[m, k], 1)?;
        let w = random_bf16(dev, &[n, k], 2)?;
        let y = Tensor::empty(dev, DType::BF16, &[m, n])?;
        if !tuned {
            let run: Launch = Box::new(move |s: &Stream| Ok(api::linear_into(s, &x, &w, &y)?));
            return Ok((run, None));
        }
        // The decode GEMV with its autotuned split-K count (tuned here, in the setup).
        let splits = tuned_gemv_splits(&dev.default_stream(), &x, &w)?;
        let ws = Tensor::empty(dev, DType::F32, &[splits.max(1) * m * n])?;
        let run: Launch = Box::new(move |s: &Stream| {
            if splits <= 1 {
                api::gemv_into(s, &x, &w, &y, None)?;
            } else {
                api::gemv_split_k_into(s, &x, &w, &y, &ws, splits)?;
            }
            Ok(())
        });
        Ok((run, Some(splits)))
    });
    let base = tuned.then_some("linear_bf16");
    Bench { op, shape: vec![m, n, k], tag, base, flops: 2.0 * (m * n * k) as f64, bytes, make }
}

/// An AWQ projection (4-bit, groups of 128, f16 activations) through `awq_linear_into`: the GEMV
/// over the packed words up to 16 rows, the dequantisation and the tensor-core GEMM beyond. Its
/// base is the dense bf16 product of the same shape; `bytes` counts the packed weight, so GB/s
/// over the copy row is the fraction of copy bandwidth.
fn awq_bench(m: usize, n: usize, k: usize, tag: String) -> Bench {
    const GROUP: usize = 128;
    let groups = k / GROUP;
    let bytes = (k * n / 2 + groups * n / 2 + 2 * groups * n + 2 * (m * k + m * n)) as f64;
    let make: Make = Box::new(move |dev| {
        let x = repeated(dev, &uniform(m * k, 21).into_iter().map(half::f16::from_f32).collect::<Vec<_>>(), &[m, k])?;
        let words: Vec<i32> = uniform(1 << 16, 22).into_iter().map(|u| (u * i32::MAX as f32) as i32).collect();
        let qweight = repeated(dev, &words, &[k, n / 8])?;
        let qzeros = repeated(dev, &words, &[groups, n / 8])?;
        let scales: Vec<half::f16> = uniform(1 << 16, 23).into_iter().map(|u| half::f16::from_f32(u / 64.0)).collect();
        let scales = repeated(dev, &scales, &[groups, n])?;
        let y = Tensor::empty(dev, DType::F16, &[m, n])?;
        let scratch = (m > api::GEMV_MAX_M).then(|| Tensor::empty(dev, DType::F16, &[n * k])).transpose()?;
        let run: Launch = Box::new(move |s: &Stream| {
            let w = api::AwqWeight { qweight: &qweight, qzeros: &qzeros, scales: &scales, group_size: GROUP };
            Ok(api::awq_linear_into(s, &x, &w, None, &y, scratch.as_ref(), api::Strategy::Auto)?)
        });
        Ok((run, None))
    });
    Bench {
        op: "awq_linear_f16",
        shape: vec![m, n, k],
        tag,
        base: Some("linear_bf16"),
        flops: 2.0 * (m * n * k) as f64,
        bytes,
        make,
    }
}

fn decode_bench(op: &'static str, b: usize, (hq, hkv, d): (usize, usize, usize), s: usize, tuned: bool) -> Bench {
    let make: Make = Box::new(move |dev| {
        let q = random_bf16(dev, &[b, hq, d], 11)?;
        let kc = random_bf16(dev, &[b, hkv, s, d], 12)?;
        let vc = random_bf16(dev, &[b, hkv, s, d], 13)?;
        let lens = Tensor::from_slice(dev, &vec![s as u32; b], &[b])?;
        let splits = if tuned {
            tuned_decode_splits(&dev.default_stream(), &q, &kc, &vc)?
        } else {
            api::decode_splits(b, hq, hkv, d, s)
        };
        let ws = api::DecodeWorkspace::new(&q, splits)?;
        let o = Tensor::empty(dev, DType::BF16, &[b, hq, d])?;
        let run: Launch =
            Box::new(move |st: &Stream| Ok(api::attention_decode_into(st, &q, &kc, &vc, &lens, None, &ws, &o)?));
        Ok((run, Some(splits)))
    });
    Bench {
        op,
        shape: vec![b, hq, hkv, d, s],
        tag: if tuned { "qwen3-0.6b heads, tuned splits".into() } else { "qwen3-0.6b heads, heuristic splits".into() },
        base: (!tuned).then_some("attention_decode_bf16"),
        flops: 4.0 * (b * hq * s * d) as f64,
        bytes: 2.0 * (2 * b * hkv * s * d + 2 * b * hq * d) as f64,
        make,
    }
}

/// Fused paged decode attention (`DevicePlan::attention_into`) of `b` sequences of `s` keys each
/// over pages of `page` positions, the pages of every sequence shuffled through the pool: its
/// GB/s against the copy row is the fraction of copy bandwidth the issue targets (≥ 0.85).
fn paged_decode_bench(b: usize, (hq, hkv, d): (usize, usize, usize), s: usize, page: usize) -> Bench {
    let make: Make = Box::new(move |dev| {
        use ruda_ops::api::paged_attention::{DevicePlan, HostPlan, SplitWorkspace};
        let per = s.div_ceil(page);
        let pages = b * per;
        // Page i of sequence q is physical page (i * b + q) * 7919 mod pages (a permutation when
        // pages is not a multiple of the prime 7919).
        let tables: Vec<Vec<u32>> =
            (0..b).map(|q| (0..per).map(|i| (((i * b + q) * 7919) % pages) as u32).collect()).collect();
        let lengths = vec![s as u32; b];
        let sequence_ids: Vec<u32> = (0..b as u32).collect();
        let positions = vec![s as u32 - 1; b];
        let host = HostPlan::new(page, pages, &tables, &lengths, &sequence_ids, &positions)?;
        let q = random_bf16(dev, &[b, hq, d], 11)?;
        let kc = random_bf16(dev, &[pages, page, hkv, d], 12)?;
        let vc = random_bf16(dev, &[pages, page, hkv, d], 13)?;
        let plan = DevicePlan::upload(&host, &q)?;
        let splits = api::decode_splits(b, hq, hkv, d, s);
        let ws = if splits > 1 { Some(SplitWorkspace::new(&q, b, hq, d, splits.min(32))?) } else { None };
        let o = Tensor::empty(dev, DType::BF16, &[b, hq, d])?;
        let scale = 1.0 / (d as f32).sqrt();
        let run: Launch = Box::new(move |st: &Stream| {
            match &ws {
                Some(ws) => plan.attention_with_workspace_into(st, &q, &kc, &vc, scale, true, ws, &o)?,
                None => plan.attention_into(st, &q, &kc, &vc, scale, true, None, &o)?,
            }
            Ok(())
        });
        Ok((run, Some(splits.min(32))))
    });
    Bench {
        op: "paged_attention_decode_bf16",
        shape: vec![b, hq, hkv, d, s, page],
        tag: "qwen3-0.6b heads, shuffled pages".into(),
        base: None,
        flops: 4.0 * (b * hq * s * d) as f64,
        bytes: 2.0 * (2 * b * hkv * s * d + 2 * b * hq * d) as f64,
        make,
    }
}

/// Gated delta heads `(Hk, Hv, K, V)`: Qwen3.5's linear attention (16 key heads, 32 value
/// heads, head dims 128).
type DeltaHeads = (usize, usize, usize, usize);
const QWEN35_DELTA_HEADS: DeltaHeads = (16, 32, 128, 128);

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// `ln sigmoid(x)`: a log decay `g <= 0`.
fn log_sigmoid(x: f32) -> f32 {
    -(-x).exp().ln_1p()
}

/// The gated delta rule's inputs as the model passes them: q/k rows L2-normalised, `beta` a
/// sigmoid, `log_decay` at most 0 (both f32), `[B, H, T, ·]`.
struct DeltaInputs {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    beta: Tensor,
    g: Tensor,
    scale: f32,
}

impl DeltaInputs {
    fn new(dev: &Device, b: usize, t: usize, (hk, hv, kd, vd): DeltaHeads, seed: u64) -> Result<Self, BoxError> {
        Ok(DeltaInputs {
            q: random_unit_rows_bf16(dev, &[b, hk, t, kd], seed)?,
            k: random_unit_rows_bf16(dev, &[b, hk, t, kd], seed + 1)?,
            v: random_bf16(dev, &[b, hv, t, vd], seed + 2)?,
            beta: random_f32(dev, &[b, hv, t], seed + 3, sigmoid)?,
            g: random_f32(dev, &[b, hv, t], seed + 4, log_sigmoid)?,
            scale: (kd as f32).powf(-0.5),
        })
    }

    fn input<'a>(&'a self, initial_state: Option<&'a Tensor>) -> GatedDeltaInput<'a> {
        GatedDeltaInput {
            query: &self.q,
            key: &self.k,
            value: &self.v,
            beta: &self.beta,
            log_decay: &self.g,
            initial_state,
            query_scale: self.scale,
        }
    }
}

/// The gated delta rule's flops per token and value head as the recurrence counts them: the
/// decay (K·V), `Sᵀk`, `k·dᵀ` and `Sᵀq` (2·K·V each). The chunked form does more (its in-chunk
/// `k kᵀ` and `q kᵀ`), so its TFLOP/s are those of the math, not of the kernel.
fn delta_flops(b: usize, t: usize, (_, hv, kd, vd): DeltaHeads) -> f64 {
    7.0 * (b * t * hv * kd * vd) as f64
}

/// Chunked prefill of one sequence of `t` tokens, from a zero state (as fla's
/// `chunk_gated_delta_rule` in bench/baseline.py, joined by op and shape `[B, T, Hk, Hv, K, V]`).
fn delta_chunk_bench(t: usize, heads: DeltaHeads, chunk: usize) -> Bench {
    let (hk, hv, kd, vd) = heads;
    Bench {
        op: "gated_delta_chunk_bf16",
        shape: vec![1, t, hk, hv, kd, vd],
        tag: format!("qwen3.5 heads, chunk {chunk}, one sequence, f32 gates"),
        base: None,
        flops: delta_flops(1, t, heads),
        // q, k, v and the output in bf16, the f32 gates, the final state written.
        bytes: (2 * t * (2 * hk * kd + 2 * hv * vd) + 8 * t * hv + 4 * hv * kd * vd) as f64,
        make: Box::new(move |dev| {
            let x = DeltaInputs::new(dev, 1, t, heads, 21)?;
            // The op launches on its tensors' default stream, the one `time` synchronises.
            let run: Launch = Box::new(move |_: &Stream| {
                chunk_gated_delta_rule(x.input(None), chunk)?;
                Ok(())
            });
            Ok((run, None))
        }),
    }
}

/// One recurrent step of `b` sequences from a given state (decode). `bytes` is the state traffic
/// alone, `2 · B · Hv · K · V · 4` (read, then written; q/k/v/gates add under 1 %), so its
/// GB/s over the copy bandwidth is the fraction of the step's floor that the GPU rung's summary
/// checks.
fn delta_decode_bench(b: usize, heads: DeltaHeads) -> Bench {
    let (hk, hv, kd, vd) = heads;
    Bench {
        op: "gated_delta_decode_bf16",
        shape: vec![b, hk, hv, kd, vd],
        tag: "qwen3.5 heads, one recurrent step, bytes: the state read and written".into(),
        base: None,
        flops: delta_flops(b, 1, heads),
        bytes: (2 * 4 * b * hv * kd * vd) as f64,
        make: Box::new(move |dev| {
            let x = DeltaInputs::new(dev, b, 1, heads, 31)?;
            let state = random_f32(dev, &[b, hv, kd, vd], 36, |u| 0.1 * u)?;
            let run: Launch = Box::new(move |_: &Stream| {
                gated_delta_rule(x.input(Some(&state)))?;
                Ok(())
            });
            Ok((run, None))
        }),
    }
}

/// Routed experts `(E, top_k, H, I)`: Qwen3-30B-A3B's (128 experts, 8 per token, hidden 2048,
/// 768 features per expert).
type ExpertShape = (usize, usize, usize, usize);
const QWEN3_30B_A3B_EXPERTS: ExpertShape = (128, 8, 2048, 768);

/// A routing of `t` tokens that spreads their `t · top_k` rows evenly: token `t`'s experts are
/// `t · top_k + j` mod E (distinct when `top_k ≤ E`), each weight `1 / top_k`. The timing of the
/// grouped GEMMs depends on the rows per expert, not on the values.
fn even_routing(dev: &Device, t: usize, (e, k, _, _): ExpertShape) -> Result<api::RoutingPlan, BoxError> {
    let ids: Vec<u32> = (0..t * k).map(|i| (i % e) as u32).collect();
    let weights = vec![bf16::from_f32(1.0 / k as f32); t * k];
    let plan = api::RoutingPlan::from_selection(
        Tensor::from_slice(dev, &ids, &[t, k])?,
        Tensor::from_slice(dev, &weights, &[t, k])?,
        e,
    )?;
    Ok(plan)
}

/// Random bf16 experts `[E, 2I, H]` (gate rows first) and `[E, H, I]`, scaled to keep the
/// activations finite.
fn random_experts(dev: &Device, (e, _, h, i): ExpertShape) -> Result<api::SwiGluExperts, BoxError> {
    let gate_up = random_bf16(dev, &[e, 2 * i, h], 41)?;
    let down = random_bf16(dev, &[e, h, i], 42)?;
    Ok(api::SwiGluExperts::from_fused(gate_up, down)?)
}

/// The routed experts on `t` tokens already dispatched (grouped gate/up GEMM, SwiGLU, grouped
/// down GEMM: `GroupedStrategy::Auto`, the tensor cores in bf16), as bench/baseline.py times
/// `torch._grouped_mm` (`moe_experts_bf16`) and a loop of one `torch.matmul` per expert
/// (`moe_experts_loop_bf16`) on the same rows sorted by expert. Shape `[T, E, top_k, H, I]`.
fn moe_experts_bench(op: &'static str, t: usize, shape: ExpertShape, tag: &str) -> Bench {
    let (e, k, h, i) = shape;
    let rows = t * k;
    Bench {
        op,
        shape: vec![t, e, k, h, i],
        tag: format!("{tag}, {} rows per expert", rows / e),
        base: None,
        flops: 6.0 * (rows * h * i) as f64,
        // Every expert's weights once, the rows in and out, the gate/up rows written and read.
        bytes: 2.0 * (3 * e * h * i + 2 * rows * h + 4 * rows * i) as f64,
        make: Box::new(move |dev| {
            let experts = random_experts(dev, shape)?;
            let x = random_bf16(dev, &[t, h], 43)?;
            let dispatched = even_routing(dev, t, shape)?.dispatch(&x)?;
            let workspace = api::ExpertsWorkspace::new(&experts, rows)?;
            let out = Tensor::empty(dev, DType::BF16, &[rows, h])?;
            let run: Launch = Box::new(move |s: &Stream| {
                experts.forward_dispatched_into(s, &dispatched, api::GroupedStrategy::Auto, &workspace, &out)?;
                Ok(())
            });
            Ok((run, None))
        }),
    }
}

/// One decode step's routed block on `t` tokens, as the model layer runs it from the router's
/// logits: routing, then the decode path (`moe_decode_bf16`: gate/up, down and a combine in slot
/// order, no dispatch) or the dispatched path (`moe_decode_grouped_bf16`: dispatch, grouped
/// GEMMs, combine), the latter the former's baseline in the same run. `bytes` is the selected
/// experts' weights alone (`3 · H · I` bf16 each, `min(T · top_k, E)` experts under the even
/// routing), so its GB/s over the copy bandwidth is the fraction of the step's floor.
fn moe_decode_bench(op: &'static str, t: usize, shape: ExpertShape) -> Bench {
    let (e, k, h, i) = shape;
    let selected = (t * k).min(e);
    let decode_path = op == "moe_decode_bf16";
    Bench {
        op,
        shape: vec![t, e, k, h, i],
        tag: if decode_path { "route, decode GEMVs, combine" } else { "route, dispatch, grouped GEMMs, combine" }
            .to_string()
            + "; bytes: the selected experts' weights",
        base: None,
        flops: 6.0 * (t * k * h * i) as f64,
        bytes: 2.0 * (3 * selected * h * i) as f64,
        make: Box::new(move |dev| {
            let experts = random_experts(dev, shape)?;
            let x = random_bf16(dev, &[t, h], 44)?;
            // Logits that pick the even routing's experts: token t's are t·k .. t·k + k - 1.
            let mut logits = vec![bf16::from_f32(-4.0); t * e];
            for (row, chunk) in logits.chunks_mut(e).enumerate() {
                for j in 0..k {
                    chunk[(row * k + j) % e] = bf16::from_f32(1.0 + j as f32 / k as f32);
                }
            }
            let logits = Tensor::from_slice(dev, &logits, &[t, e])?;
            let plan = even_routing(dev, t, shape)?;
            let out = Tensor::empty(dev, DType::BF16, &[t, h])?;
            let options = api::RoutingOptions { top_k: k, renormalize: true };
            let run: Launch = if decode_path {
                let workspace = api::ExpertsDecodeWorkspace::new(&experts, t, k)?;
                Box::new(move |s: &Stream| {
                    api::route_into(s, &logits, &options, plan.indices(), plan.weights())?;
                    experts.forward_decode_into(s, &x, &plan, &workspace, &out)?;
                    Ok(())
                })
            } else {
                let dispatched = plan.dispatch(&x)?;
                let workspace = api::ExpertsWorkspace::new(&experts, t * k)?;
                let expert_out = Tensor::empty(dev, DType::BF16, &[t * k, h])?;
                Box::new(move |s: &Stream| {
                    api::route_into(s, &logits, &options, plan.indices(), plan.weights())?;
                    plan.dispatch_into(s, &x, &dispatched)?;
                    let auto = api::GroupedStrategy::Auto;
                    experts.forward_dispatched_into(s, &dispatched, auto, &workspace, &expert_out)?;
                    dispatched.combine_into(s, &expert_out, &out)?;
                    Ok(())
                })
            };
            Ok((run, None))
        }),
    }
}

/// Every benchmark, in run order (`quick`: tiny shapes for the interpreter).
fn catalog(quick: bool) -> Vec<Bench> {
    let mut out: Vec<Bench> = Vec::new();
    // Copy bandwidth first: the reference of the memory-bound rows.
    let copy_bytes: usize = if quick { 1 << 16 } else { 1 << 29 };
    out.push(Bench {
        op: "copy",
        shape: vec![copy_bytes],
        tag: "device-to-device, 16-byte vectors".into(),
        base: None,
        flops: 0.0,
        bytes: 2.0 * copy_bytes as f64,
        make: Box::new(move |dev| {
            let words = copy_bytes / 4;
            let src = Tensor::zeros(dev, DType::U32, &[words])?;
            let dst = Tensor::zeros(dev, DType::U32, &[words])?;
            let k = copy_kernel()?;
            let chunks = (words / 4) as u32;
            let cfg = LaunchConfig::linear(chunks.div_ceil(256), 256);
            let run: Launch = Box::new(move |s: &Stream| {
                Ok(s.launch(&k, cfg, &[Arg::Tensor(&src), Arg::Tensor(&dst), Arg::scalar(chunks)])?)
            });
            Ok((run, None))
        }),
    });
    // GEMM / GEMV through `linear_into` (GEMV for M <= 16, tensor cores above).
    let squares: &[usize] = if quick { &[64] } else { &[2048, 4096, 8192] };
    for &s in squares {
        out.push(linear_bench("linear_bf16", s, s, s, "square".into(), false));
    }
    let models: &[Model] = if quick { &[TINY] } else { &[QWEN25_05B, QWEN3_06B] };
    let ms: &[usize] = if quick { &[1, 8, 32] } else { &[1, 8, 128, 2048] };
    for model in models {
        let (h, q, kv) = (model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim);
        let projections = [
            ("q", q, h),
            ("k,v", kv, h),
            ("o", h, q),
            ("gate_up", 2 * model.intermediate, h),
            ("down", h, model.intermediate),
            ("lm_head", model.vocab, h),
        ];
        for &m in ms {
            for (proj, n, k) in projections {
                let tag = format!("{} {proj}", model.name);
                if let Some(b) = out.iter_mut().find(|b| b.op == "linear_bf16" && b.shape == [m, n, k]) {
                    b.tag.push_str(&format!(", {proj}"));
                    continue;
                }
                out.push(linear_bench("linear_bf16", m, n, k, tag.clone(), false));
                if m <= api::GEMV_MAX_M {
                    out.push(linear_bench("linear_tuned_bf16", m, n, k, format!("{tag}, tuned GEMV"), true));
                }
            }
        }
    }
    // Attention with Qwen3-0.6B's heads: 16 query, 8 key/value, D = 128.
    let heads = (16, 8, 128);
    for t in if quick { vec![64] } else { vec![1024, 4096, 16384] } {
        let (hq, hkv, d) = heads;
        out.push(Bench {
            op: "attention_prefill_bf16",
            shape: vec![t, hq, hkv, d],
            tag: "qwen3-0.6b heads, causal, one sequence".into(),
            base: None,
            // Causal: half of the T x T scores, two GEMMs of 2 flops per multiply-add.
            flops: 2.0 * (t * t * hq * d) as f64,
            bytes: 2.0 * (2 * t * hq * d + 2 * t * hkv * d) as f64,
            make: Box::new(move |dev| {
                let q = random_bf16(dev, &[t, hq, d], 8)?;
                let k = random_bf16(dev, &[t, hkv, d], 9)?;
                let v = random_bf16(dev, &[t, hkv, d], 10)?;
                // Two tensors: the CPU device does not let one buffer be two arguments.
                let cu_q = Tensor::from_slice(dev, &[0u32, t as u32], &[2])?;
                let cu_k = Tensor::from_slice(dev, &[0u32, t as u32], &[2])?;
                let o = Tensor::empty(dev, DType::BF16, &[t, hq, d])?;
                let run: Launch = Box::new(move |s: &Stream| {
                    Ok(api::attention_prefill_varlen_into(s, &q, &k, &v, &cu_q, &cu_k, t, None, true, &o)?)
                });
                Ok((run, None))
            }),
        });
    }
    let (batches, contexts) = if quick { (vec![1, 2], vec![64, 300]) } else { (vec![1, 16], vec![1024, 4096, 16384]) };
    for &b in &batches {
        for &s in &contexts {
            out.push(decode_bench("attention_decode_bf16", b, heads, s, true));
            out.push(decode_bench("attention_decode_heuristic_bf16", b, heads, s, false));
            out.push(paged_decode_bench(b, heads, s, 16));
        }
    }
    // The gated delta rule at Qwen3.5's heads: decode steps, then chunked prefill, longest last.
    // The T = 65536 row takes seconds a launch, so `time` gives it fewer samples: the current
    // kernel runs one warp per (V tile, value head), 128 blocks on 132 SMs, each ~5·10⁵ warp
    // instructions per chunk of 64 (`rudac profile`), ~1-3 ms at ~2 GHz with one warp an SM to
    // hide latency; 1024 chunks.
    let (delta_heads, delta_batches, delta_tokens) = if quick {
        ((1, 2, 32, 40), vec![1, 2], vec![70])
    } else {
        (QWEN35_DELTA_HEADS, vec![1, 32], vec![2048, 8192, 65536])
    };
    for &b in &delta_batches {
        out.push(delta_decode_bench(b, delta_heads));
    }
    for &t in &delta_tokens {
        out.push(delta_chunk_bench(t, delta_heads, 64));
    }
    // Routed experts at Qwen3-30B-A3B's shapes (the GPU rung's `moe` step): prefill-sized
    // batches against torch._grouped_mm and a per-expert loop, then decode steps.
    let (expert_shape, expert_tokens, decode_tokens) =
        if quick { ((6, 2, 40, 24), vec![9], vec![1]) } else { (QWEN3_30B_A3B_EXPERTS, vec![512, 4096], vec![1, 8]) };
    for &t in &expert_tokens {
        let tag = if quick { "tiny experts" } else { "qwen3-30b-a3b experts" };
        out.push(moe_experts_bench("moe_experts_bf16", t, expert_shape, &format!("{tag} vs torch._grouped_mm")));
        out.push(moe_experts_bench("moe_experts_loop_bf16", t, expert_shape, &format!("{tag} vs a torch.matmul loop")));
    }
    for &t in &decode_tokens {
        out.push(moe_decode_bench("moe_decode_bf16", t, expert_shape));
        out.push(moe_decode_bench("moe_decode_grouped_bf16", t, expert_shape));
    }
    // Row-wise and elementwise ops at 4096 x 4096.
    let (rows, hidden) = if quick { (64, 256) } else { (4096, 4096) };
    let n = rows * hidden;
    let row_bytes = 2.0 * 2.0 * n as f64;
    out.push(Bench {
        op: "rms_norm_bf16",
        shape: vec![rows, hidden],
        tag: String::new(),
        base: None,
        flops: 0.0,
        bytes: row_bytes,
        make: Box::new(move |dev| {
            let x = random_bf16(dev, &[rows, hidden], 3)?;
            let g = Tensor::from_slice(dev, &vec![1.0f32; hidden], &[hidden])?;
            let y = Tensor::empty(dev, DType::BF16, &[rows, hidden])?;
            Ok((Box::new(move |s: &Stream| Ok(api::rms_norm_into(s, &x, &g, 1e-6, &y)?)) as Launch, None))
        }),
    });
    out.push(Bench {
        op: "rms_norm_residual_bf16",
        shape: vec![rows, hidden],
        tag: "x + residual, then RMSNorm".into(),
        base: None,
        flops: 0.0,
        bytes: 2.0 * row_bytes,
        make: Box::new(move |dev| {
            let x = random_bf16(dev, &[rows, hidden], 14)?;
            let r = random_bf16(dev, &[rows, hidden], 15)?;
            let g = Tensor::from_slice(dev, &vec![1.0f32; hidden], &[hidden])?;
            let y = Tensor::empty(dev, DType::BF16, &[rows, hidden])?;
            let r_out = Tensor::empty(dev, DType::BF16, &[rows, hidden])?;
            Ok((
                Box::new(move |s: &Stream| Ok(api::rms_norm_residual_into(s, &x, &r, &g, 1e-6, &y, &r_out)?)) as Launch,
                None,
            ))
        }),
    });
    out.push(Bench {
        op: "softmax_bf16",
        shape: vec![rows, hidden],
        tag: String::new(),
        base: None,
        flops: 0.0,
        bytes: row_bytes,
        make: Box::new(move |dev| {
            let x = random_bf16(dev, &[rows, hidden], 4)?;
            let y = Tensor::empty(dev, DType::BF16, &[rows, hidden])?;
            Ok((Box::new(move |s: &Stream| Ok(api::softmax_last_axis_into(s, &x, &y)?)) as Launch, None))
        }),
    });
    out.push(Bench {
        op: "add_bf16",
        shape: vec![n],
        tag: String::new(),
        base: None,
        flops: 0.0,
        bytes: 3.0 * 2.0 * n as f64,
        make: Box::new(move |dev| {
            let a = random_bf16(dev, &[n], 5)?;
            let b = random_bf16(dev, &[n], 6)?;
            let y = Tensor::empty(dev, DType::BF16, &[n])?;
            Ok((Box::new(move |s: &Stream| Ok(api::add_into(s, &a, &b, &y)?)) as Launch, None))
        }),
    });
    out.push(Bench {
        op: "silu_bf16",
        shape: vec![n],
        tag: String::new(),
        base: None,
        flops: 0.0,
        bytes: row_bytes,
        make: Box::new(move |dev| {
            let x = random_bf16(dev, &[n], 7)?;
            let y = Tensor::empty(dev, DType::BF16, &[n])?;
            Ok((Box::new(move |s: &Stream| Ok(api::silu_into(s, &x, &y)?)) as Launch, None))
        }),
    });
    out.push(Bench {
        op: "swiglu_bf16",
        shape: vec![rows, hidden],
        tag: "silu(gate) * up on [rows, 2 * hidden]".into(),
        base: None,
        flops: 0.0,
        bytes: 3.0 * 2.0 * n as f64,
        make: Box::new(move |dev| {
            let gu = random_bf16(dev, &[rows, 2 * hidden], 17)?;
            let y = Tensor::empty(dev, DType::BF16, &[rows, hidden])?;
            Ok((Box::new(move |s: &Stream| Ok(api::swiglu_into(s, &gu, &y)?)) as Launch, None))
        }),
    });
    let vocab = if quick { 1000 } else { 151_936 };
    out.push(Bench {
        op: "argmax_bf16",
        shape: vec![1, vocab],
        tag: "one row of logits".into(),
        base: None,
        flops: 0.0,
        bytes: 2.0 * vocab as f64,
        make: Box::new(move |dev| {
            let logits = random_bf16(dev, &[1, vocab], 16)?;
            let ids = Tensor::empty(dev, DType::U32, &[1])?;
            let ws_len = api::argmax_workspace_len(dev, 1, vocab);
            let ws = Tensor::empty(dev, DType::U64, &[ws_len.max(1)])?;
            Ok((
                Box::new(move |s: &Stream| Ok(api::argmax_into(s, &logits, &ids, (ws_len > 0).then_some(&ws))?))
                    as Launch,
                None,
            ))
        }),
    });
    // Last (the bench step's budget cuts the tail first): AWQ at Qwen2.5-0.5B's projections (its AWQ checkpoint's group size, 128): decode rows and
    // a prefill chunk.
    let model = if quick { &TINY } else { &QWEN25_05B };
    let (h, q, kv) = (model.hidden, model.heads * model.head_dim, model.kv_heads * model.head_dim);
    for m in if quick { vec![1, 32] } else { vec![1, 8, 128] } {
        for (proj, n, k) in
            [("q", q, h), ("k,v", kv, h), ("gate_up", 2 * model.intermediate, h), ("down", h, model.intermediate)]
        {
            out.push(awq_bench(m, n, k, format!("{} {proj}, AWQ group 128", model.name)));
        }
    }
    out
}

/// Times RUDA's ops on the device RUDA_DEVICE names and prints one JSON object per line.
///
/// Timing: 3 warm-up launches, then --samples samples of as many launches as fill --sample-ms
/// each, host wall clock around a synchronise; the median per launch (rows of half a second or
/// more a launch: one warm-up and the samples that fit 8 s). Progress goes to stderr.
#[derive(Parser)]
#[command(name = "ruda-bench")]
struct Options {
    /// Print the benchmarks (op, shape, tag) and exit; needs no device.
    #[arg(long)]
    list: bool,
    /// Tiny shapes, for a smoke run on the interpreter (RUDA_DEVICE=cpu); the full-size
    /// benchmarks refuse the CPU device.
    #[arg(long)]
    quick: bool,
    /// Milliseconds of launches per sample.
    #[arg(long, value_name = "MS", default_value = "15", value_parser = positive)]
    sample_ms: f64,
    /// Samples per benchmark (rounded to a whole number, at least 1).
    #[arg(long, value_name = "N", default_value = "5", value_parser = sample_count)]
    samples: usize,
    /// Seconds for all benchmarks; those left when it is spent are skipped, and said so.
    #[arg(long, value_name = "S", default_value = "240", value_parser = positive)]
    budget_s: f64,
    /// Leave out the benchmarks whose `op shape tag` line contains WORD (repeatable; after the
    /// filters).
    #[arg(long, value_name = "WORD")]
    exclude: Vec<String>,
    /// Run only benchmarks whose `op shape tag` line contains one of the words.
    #[arg(value_name = "FILTER")]
    filters: Vec<String>,
}

/// A finite number above zero.
fn positive(v: &str) -> Result<f64, String> {
    v.parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && *x > 0.0)
        .ok_or_else(|| format!("needs a positive number, got `{v}`"))
}

fn sample_count(v: &str) -> Result<usize, String> {
    positive(v).map(|x| x.round().max(1.0) as usize)
}

fn main() -> ExitCode {
    // `--help` on stdout with status 0; a usage error on stderr with status 2.
    let opts = Options::parse();
    let benches: Vec<Bench> = catalog(opts.quick)
        .into_iter()
        .filter(|b| opts.filters.is_empty() || opts.filters.iter().any(|f| b.line().contains(f.as_str())))
        .filter(|b| !opts.exclude.iter().any(|x| b.line().contains(x.as_str())))
        .collect();
    if benches.is_empty() {
        eprintln!("ruda-bench: no benchmark matches {:?} less --exclude {:?} (see --list)", opts.filters, opts.exclude);
        return ExitCode::from(2);
    }
    if opts.list {
        for b in &benches {
            println!("{}", b.line());
        }
        return ExitCode::SUCCESS;
    }
    match run(&opts, &benches) {
        Ok(0) => ExitCode::SUCCESS,
        Ok(failed) => {
            eprintln!("ruda-bench: {failed} benchmark(s) failed");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("ruda-bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// A launch this slow (ms) or slower makes a slow row (the gated delta rule's long prefill).
const SLOW_LAUNCH_MS: f64 = 500.0;
/// The measured time (ms) a slow row's samples may fill, so that it fits the GPU rung's time.
const SLOW_ROW_MS: f64 = 8000.0;

/// Median milliseconds per launch and the launches per sample. A slow row warms up once, its
/// second launch is the first sample and it takes only the samples that fit [`SLOW_ROW_MS`]
/// (at least one), one launch each.
fn time(stream: &Stream, run: &Launch, sample_ms: f64, samples: usize) -> Result<(f64, usize), BoxError> {
    let timed = |n: usize| -> Result<f64, BoxError> {
        let started = Instant::now();
        for _ in 0..n {
            run(stream)?;
        }
        stream.synchronize()?;
        Ok(started.elapsed().as_secs_f64() * 1e3 / n as f64)
    };
    // The first launch loads the module; the second tells a slow row.
    run(stream)?;
    stream.synchronize()?;
    let second = timed(1)?;
    let mut times = Vec::with_capacity(samples);
    let iters = if second >= SLOW_LAUNCH_MS {
        times.push(second);
        let n = samples.min((SLOW_ROW_MS / second) as usize).max(1);
        for _ in 1..n {
            times.push(timed(1)?);
        }
        1
    } else {
        // Three warm-up launches in all, then one to size the samples.
        run(stream)?;
        stream.synchronize()?;
        let once = timed(1)?;
        let iters = ((sample_ms / once.max(1e-4)).ceil() as usize).clamp(1, 10_000);
        for _ in 0..samples {
            times.push(timed(iters)?);
        }
        iters
    };
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], iters))
}

/// Run the benchmarks; the number that failed (each failure is reported and skipped).
fn run(opts: &Options, benches: &[Bench]) -> Result<usize, BoxError> {
    let device = Device::from_env()?;
    if device.is_cpu() && !opts.quick {
        return Err("the full-size benchmarks need a CUDA device, and RUDA_DEVICE selects the CPU interpreter \
                    (run with --quick for a smoke run of tiny shapes there)"
            .into());
    }
    let stream = device.default_stream();
    eprintln!(
        "ruda-bench: {}, {} benchmark(s), {} samples of ~{} ms",
        device.description(),
        benches.len(),
        opts.samples,
        opts.sample_ms
    );
    let started = Instant::now();
    let mut failed = 0;
    for (i, b) in benches.iter().enumerate() {
        if started.elapsed().as_secs_f64() > opts.budget_s {
            eprintln!(
                "  [{}/{}] {}: SKIPPED (the {} s budget is spent)",
                i + 1,
                benches.len(),
                b.line(),
                opts.budget_s
            );
            continue;
        }
        let t0 = Instant::now();
        let result = (b.make)(&device)
            .and_then(|(run, splits)| Ok((time(&stream, &run, opts.sample_ms, opts.samples)?, splits)));
        match result {
            Ok(((ms, iters), splits)) => {
                let shape: Vec<String> = b.shape.iter().map(|d| d.to_string()).collect();
                let mut line = format!(
                    "{{\"op\":\"{}\",\"shape\":[{}],\"tag\":\"{}\",\"ruda_ms\":{ms:.6},\"iters\":{iters},\"flops\":{},\"bytes\":{}",
                    b.op,
                    shape.join(","),
                    b.tag,
                    b.flops,
                    b.bytes
                );
                if let Some(base) = b.base {
                    line.push_str(&format!(",\"base\":\"{base}\""));
                }
                if let Some(s) = splits {
                    line.push_str(&format!(",\"splits\":{s}"));
                }
                line.push('}');
                println!("{line}");
                eprintln!(
                    "  [{}/{}] {}: {ms:.4} ms ({:.1} s)",
                    i + 1,
                    benches.len(),
                    b.line(),
                    t0.elapsed().as_secs_f64()
                );
            }
            Err(e) => {
                failed += 1;
                eprintln!("  [{}/{}] {}: FAILED: {e}", i + 1, benches.len(), b.line());
            }
        }
    }
    Ok(failed)
}

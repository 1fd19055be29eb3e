//! `ruda-llm profile`: one decode step of a model on paper. The launches come from the model's
//! own specs ([`crate::DecoderSpec::decode_launches`]); each is bounded by the roofline of a
//! named GPU (`ruda_ops::perf::roofline`), and the step by the ideal a decode step cannot beat:
//! its weights and KV cache read once at peak DRAM bandwidth. Nothing runs and no weight is
//! read: the config alone gives the shapes. Every figure is an estimate (see `docs/profiling.md`).

use std::fmt::Write as _;
use std::path::Path;

use ruda_ops::perf::gpu::Gpu;
use ruda_ops::perf::roofline::{roofline, Bound, Units};
use ruda_runtime::DType;
use serde_json::{json, Value};

use crate::error::LlmError;
use crate::layers::PlannedLaunch;
use crate::models::architecture;
use crate::pipeline::check_model_dir;

/// The context `ruda-llm profile` assumes without `--context`: a pipeline's (capped at the
/// model's `max_position_embeddings`).
pub const DEFAULT_PROFILE_CONTEXT: usize = crate::pipeline::DEFAULT_CONTEXT;

/// How many launches [`DecodeProfile::worst`] lists.
pub const WORST: usize = 5;

/// What every report says about its numbers.
pub const NOTE: &str = "ESTIMATE from shapes and dtypes (no kernel ran): each launch at max(DRAM bytes / peak \
     bandwidth, flops / peak FP32 rate) of the named GPU, at least once through DRAM per operand, without launch \
     overhead, caches, latency or tails; decode GEMVs and argmax unsplit and decode attention at its heuristic split \
     count (a GPU tunes them)";

/// One planned launch with its bound.
#[derive(Clone, Debug)]
pub struct LaunchEstimate {
    pub launch: PlannedLaunch,
    pub roofline_us: f64,
    pub bound: Bound,
    /// Flops per DRAM byte.
    pub intensity: f64,
    /// Its own weights and KV bytes at peak bandwidth: its share of the ideal.
    pub ideal_us: f64,
    /// `roofline_us - ideal_us`: what the launch costs beyond its share of the ideal (all of
    /// its time for launches without weights or KV, such as norms and RoPE).
    pub excess_us: f64,
}

/// One decode step's estimate.
#[derive(Clone, Debug)]
pub struct DecodeProfile {
    /// The model folder as given.
    pub model: String,
    pub model_type: String,
    pub gpu: &'static Gpu,
    pub context: usize,
    pub dtype: DType,
    pub launches: Vec<LaunchEstimate>,
    /// Every weight of the model on the device in `dtype` (norm gammas in f32).
    pub weight_bytes: u64,
    /// The KV cache the step's attention reads: `2 · layers · kv_heads · head_dim · context`
    /// elements.
    pub kv_bytes: u64,
    /// What the step must read at least: every weight it reads (all of them, except that an
    /// untied embedding table gives only the row a step gathers) and the KV cache.
    pub ideal_bytes: u64,
    /// The sum of the launches' bounds.
    pub total_us: f64,
    /// `ideal_bytes` at peak DRAM bandwidth.
    pub ideal_us: f64,
}

impl DecodeProfile {
    /// `ideal_us / total_us`: the fraction of the roofline a decode step can reach at best.
    pub fn fraction_of_roofline(&self) -> f64 {
        if self.total_us > 0.0 {
            self.ideal_us / self.total_us
        } else {
            1.0
        }
    }

    /// The indices of the [`WORST`] launches with the largest excess over their share of the
    /// ideal, largest first (ties in plan order).
    pub fn worst(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.launches.len()).collect();
        order.sort_by(|&a, &b| self.launches[b].excess_us.total_cmp(&self.launches[a].excess_us).then(a.cmp(&b)));
        order.truncate(WORST);
        order
    }

    /// The `--json` object (keys in `docs/profiling.md`).
    pub fn to_json(&self) -> Value {
        let num = |x: f64| if x.is_finite() { json!(x) } else { Value::Null };
        let launches: Vec<Value> = self
            .launches
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let l = &e.launch;
                json!({
                    "index": i, "op": l.op, "kernel": l.kernel, "shape": l.shape,
                    "bytes": l.bytes(), "bytes_read": l.bytes_read, "bytes_written": l.bytes_written,
                    "weight_bytes": l.weight_bytes, "kv_bytes": l.kv_bytes, "flops": l.flops,
                    "intensity": num(e.intensity), "roofline_us": e.roofline_us, "bound": e.bound.to_string(),
                    "ideal_us": e.ideal_us, "excess_us": e.excess_us,
                })
            })
            .collect();
        let worst: Vec<Value> = self
            .worst()
            .into_iter()
            .map(|i| {
                let e = &self.launches[i];
                json!({
                    "index": i, "op": e.launch.op, "kernel": e.launch.kernel,
                    "roofline_us": e.roofline_us, "ideal_us": e.ideal_us, "excess_us": e.excess_us,
                })
            })
            .collect();
        json!({
            "estimate": true,
            "note": NOTE,
            "model": self.model,
            "model_type": self.model_type,
            "gpu": self.gpu.name,
            "gpu_label": self.gpu.label,
            "dram_bytes_per_s": self.gpu.dram_bytes_per_s,
            "fp32_flops": self.gpu.fp32_flops,
            "context": self.context,
            "dtype": self.dtype.to_string(),
            "launch_count": self.launches.len(),
            "launches": launches,
            "bytes": self.launches.iter().map(|e| e.launch.bytes()).sum::<u64>(),
            "flops": self.launches.iter().map(|e| e.launch.flops).sum::<u64>(),
            "weight_bytes": self.weight_bytes,
            "kv_bytes": self.kv_bytes,
            "ideal_bytes": self.ideal_bytes,
            "total_us": self.total_us,
            "ideal_us": self.ideal_us,
            "fraction_of_roofline": self.fraction_of_roofline(),
            "worst": worst,
        })
    }

    /// The readable report: one row per launch, the sums, the launches furthest short.
    pub fn table(&self) -> String {
        let g = self.gpu;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "ESTIMATE: one decode step of {} ({}, {}) at context {} on {} ({:.2} TB/s, {:.1} TFLOPS fp32); no kernel ran",
            self.model,
            self.model_type,
            self.dtype,
            self.context,
            g.label,
            g.dram_bytes_per_s / 1e12,
            g.fp32_flops / 1e12
        );
        let width = self.launches.iter().map(|e| e.launch.op.len()).max().unwrap_or(2).max(2);
        let kwidth = self.launches.iter().map(|e| e.launch.kernel.len()).max().unwrap_or(6).max(6);
        let _ = writeln!(
            s,
            "{:>4}  {:<width$}  {:<kwidth$}  {:>12}  {:>12}  {:>9}  {:>7}  {:>12}  {:>10}",
            "#", "op", "kernel", "bytes", "flops", "flops/B", "bound", "roofline_us", "excess_us"
        );
        for (i, e) in self.launches.iter().enumerate() {
            let l = &e.launch;
            let _ = writeln!(
                s,
                "{i:>4}  {:<width$}  {:<kwidth$}  {:>12}  {:>12}  {:>9.2}  {:>7}  {:>12.4}  {:>10.4}",
                l.op,
                l.kernel,
                l.bytes(),
                l.flops,
                e.intensity,
                e.bound.to_string(),
                e.roofline_us,
                e.excess_us
            );
        }
        let _ = writeln!(s, "sum of {} launches (ESTIMATE): {:.3} us", self.launches.len(), self.total_us);
        let _ = writeln!(
            s,
            "ideal (ESTIMATE: {} weight and {} KV bytes read once at peak DRAM bandwidth): {:.3} us",
            self.ideal_bytes - self.kv_bytes,
            self.kv_bytes,
            self.ideal_us
        );
        let _ =
            writeln!(s, "fraction of roofline a decode step can reach (ESTIMATE): {:.3}", self.fraction_of_roofline());
        let _ = writeln!(s, "furthest short (ESTIMATE: time above their own weights and KV at peak bandwidth):");
        for i in self.worst() {
            let e = &self.launches[i];
            let _ = writeln!(
                s,
                "  #{i} {} ({}): {:.4} us above its {:.4} us",
                e.launch.op, e.launch.kernel, e.excess_us, e.ideal_us
            );
        }
        let _ = writeln!(s, "note: {NOTE}");
        s
    }
}

/// The estimate of one decode step of the model in `dir` at `context` keys (`None`:
/// [`DEFAULT_PROFILE_CONTEXT`], at most `max_position_embeddings`) in `dtype` on `gpu`.
pub fn profile_decode(
    dir: &Path,
    context: Option<usize>,
    dtype: DType,
    gpu: &'static Gpu,
) -> Result<DecodeProfile, LlmError> {
    check_model_dir(dir)?;
    let config = crate::load_config(dir)?;
    let context = context.unwrap_or(DEFAULT_PROFILE_CONTEXT.min(config.max_position_embeddings));
    let spec = architecture(config.model_type).spec(&config);
    let planned = spec.decode_launches(context, dtype)?;
    let bandwidth = gpu.dram_bytes_per_s;
    let launches: Vec<LaunchEstimate> = planned
        .into_iter()
        .map(|launch| {
            // Every decode kernel computes on the CUDA cores (the GEMVs and attention accumulate
            // in f32 with FMAs); the tensor cores serve only prefill's GEMMs.
            let r = roofline(gpu, launch.bytes(), launch.flops, Units::Fp32);
            let ideal_us = (launch.weight_bytes + launch.kv_bytes) as f64 / bandwidth * 1e6;
            LaunchEstimate {
                roofline_us: r.roofline_us,
                bound: r.bound,
                intensity: r.intensity,
                ideal_us,
                excess_us: (r.roofline_us - ideal_us).max(0.0),
                launch,
            }
        })
        .collect();
    let kv_bytes = launches.iter().map(|e| e.launch.kv_bytes).sum();
    let ideal_bytes = launches.iter().map(|e| e.launch.weight_bytes + e.launch.kv_bytes).sum::<u64>();
    Ok(DecodeProfile {
        model: dir.display().to_string(),
        model_type: config.model_type.name().to_string(),
        gpu,
        context,
        dtype,
        total_us: launches.iter().map(|e| e.roofline_us).sum(),
        ideal_us: ideal_bytes as f64 / bandwidth * 1e6,
        weight_bytes: spec.weight_bytes(dtype),
        kv_bytes,
        ideal_bytes,
        launches,
    })
}

//! Causal self-attention with grouped-query heads over a contiguous KV cache. Its variants are
//! values of the spec (a bias on q/k/v or on o, per-head q/k norms, Qwen3.5's output gate), not
//! flags of a decoder.

use ruda_ops::api::paged_attention::{DevicePlan, SplitWorkspace};
use ruda_ops::api::{self, DecodeWorkspace};
use ruda_runtime::{DType, Device, Stream, Tensor};

use super::plan::{launch, DecodeStep, PlannedLaunch};
use super::{ExpectedTensor, Linear, LinearPlan, LinearShape, LinearSpec, Loader, RmsNorm, RmsNormSpec, Rope};
use crate::cache::KvCache;
use crate::error::LlmError;

/// The heads of one attention layer, which decode attention is tuned for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

/// `{prefix}.{q,k,v,o}_proj` and, with q/k norms, `{prefix}.{q,k}_norm`.
#[derive(Clone, Debug)]
pub struct AttentionSpec {
    pub shape: AttentionShape,
    pub q: LinearSpec,
    pub k: LinearSpec,
    pub v: LinearSpec,
    pub o: LinearSpec,
    /// RMS norms of each head of q and of k before RoPE (Qwen3).
    pub qk_norm: Option<(RmsNormSpec, RmsNormSpec)>,
    /// Qwen3.5's gated attention: `q_proj` makes `[T, Hq, 2·head_dim]`, per head the query then
    /// a gate, and the attention output is multiplied by `sigmoid(gate)` before `o_proj`.
    pub output_gate: bool,
}

impl AttentionSpec {
    /// Without biases or q/k norms (add them with [`AttentionSpec::with_bias`] and
    /// [`AttentionSpec::with_qk_norm`]).
    pub fn new(prefix: &str, hidden: usize, shape: AttentionShape) -> AttentionSpec {
        let (q, kv) = (shape.q_heads * shape.head_dim, shape.kv_heads * shape.head_dim);
        AttentionSpec {
            shape,
            q: LinearSpec::new("q_proj", &format!("{prefix}.q_proj"), q, hidden, false),
            k: LinearSpec::new("k_proj", &format!("{prefix}.k_proj"), kv, hidden, false),
            v: LinearSpec::new("v_proj", &format!("{prefix}.v_proj"), kv, hidden, false),
            o: LinearSpec::new("o_proj", &format!("{prefix}.o_proj"), hidden, q, false),
            qk_norm: None,
            output_gate: false,
        }
    }

    /// Qwen3.5's output gate: `q_proj` doubles to `[2·Hq·head_dim, hidden]` (call before
    /// [`AttentionSpec::with_bias`], which sizes the bias by the weight).
    pub fn with_output_gate(mut self) -> AttentionSpec {
        self.q.weights[0].shape[0] *= 2;
        self.output_gate = true;
        self
    }

    /// Biases (`{name}.bias [out]` beside each `{name}.weight`) on q, k and v, and with `o` on the
    /// output projection too.
    pub fn with_bias(mut self, qkv: bool, o: bool) -> AttentionSpec {
        for (lin, on) in [(&mut self.q, qkv), (&mut self.k, qkv), (&mut self.v, qkv), (&mut self.o, o)] {
            let weight = &lin.weights[0];
            let prefix = weight.name.strip_suffix(".weight").unwrap_or(&weight.name);
            lin.bias = on.then(|| ExpectedTensor::compute(format!("{prefix}.bias"), vec![weight.shape[0]]));
        }
        self
    }

    /// Per-head RMS norms of q and k (`{prefix}.q_norm.weight`, `{prefix}.k_norm.weight`).
    pub fn with_qk_norm(mut self, prefix: &str, eps: f64) -> AttentionSpec {
        let d = self.shape.head_dim;
        self.qk_norm = Some((
            RmsNormSpec::new(&format!("{prefix}.q_norm"), d, eps),
            RmsNormSpec::new(&format!("{prefix}.k_norm"), d, eps),
        ));
        self
    }

    /// The projections' weights, then their biases, then the norms (the order of a checkpoint).
    pub fn declare(&self, out: &mut Vec<ExpectedTensor>) {
        let linears = [&self.q, &self.k, &self.v, &self.o];
        out.extend(linears.iter().flat_map(|l| l.weights.iter().cloned()));
        out.extend(linears.iter().filter_map(|l| l.bias.clone()));
        if let Some((q, k)) = &self.qk_norm {
            out.extend([q.weight.clone(), k.weight.clone()]);
        }
    }

    pub fn linear_shapes(&self, tokens: usize) -> [LinearShape; 4] {
        [&self.q, &self.k, &self.v, &self.o].map(|l| l.linear_shape(tokens))
    }

    /// The launches of [`Attention::forward`] for one token at `step.context - 1`: q (and the
    /// split of query and gate), k and v, the per-head norms, RoPE of q, RoPE of k with the cache
    /// append, split-KV decode attention over `step.context` keys and its combine, the output
    /// gate, the output projection.
    pub fn decode_launches(&self, step: &DecodeStep, out: &mut Vec<PlannedLaunch>) {
        let AttentionShape { q_heads: hq, kv_heads: hkv, head_dim: d } = self.shape;
        let (e, dt) = (step.elem(), step.dt());
        let q_elems = (hq * d) as u64;
        let gate = |what: &str, kernel: &str, read: u64, written: u64, flops: u64| {
            let label = self.q.label();
            let p = label.rsplit_once('.').map_or("self_attn", |(p, _)| p).to_string();
            launch(format!("{p}.{what}"), format!("{kernel}.{dt}"), format!("[1, {hq}, {d}]"), read, written, flops)
        };
        self.q.decode_launches(step, out);
        if self.output_gate && self.qk_norm.is_none() {
            out.push(gate("query / gate split", "split_heads_halves", 2 * q_elems * e, 2 * q_elems * e, 0));
        }
        for lin in [&self.k, &self.v] {
            lin.decode_launches(step, out);
        }
        if let Some((qn, kn)) = &self.qk_norm {
            qn.decode_launches(step, hq, false, out);
            kn.decode_launches(step, hkv, false, out);
        }
        let label = self.q.label();
        let p = label.rsplit_once('.').map_or("self_attn", |(p, _)| p);
        let (q, kv) = ((hq * d) as u64, (hkv * d) as u64);
        // The rotary table is f32 `cos` and `sin`, `rotary_dim / 2` of each per position.
        let r = step.rotary_dim;
        let table = 4 * r as u64;
        let partial = if r == d { String::new() } else { format!(".r{r}") };
        out.push(launch(
            format!("{p}.rope (q)"),
            format!("rope.{dt}.d{d}{partial}"),
            format!("[1, {hq}, {d}]"),
            q * e + 4 + table,
            q * e,
            3 * q,
        ));
        out.push(launch(
            format!("{p}.rope (k) + cache append"),
            format!("rope_kv_cache.{dt}.d{d}{partial}"),
            format!("k, v [1, {hkv}, {d}]"),
            2 * kv * e + 8 + table,
            2 * kv * e,
            3 * kv,
        ));
        // Keys and values of every cached position and the new one.
        let keys = (step.context * hkv * d) as u64;
        let splits = step.attention_splits as u64;
        // Per (query head, split): an f32 accumulator of `d` and a (max, sum) pair.
        let partials = splits * hq as u64 * (d as u64 + 2) * 4;
        out.push(PlannedLaunch {
            kv_bytes: 2 * keys * e,
            ..launch(
                format!("{p}.attention"),
                format!("attention_decode.{dt}.d{d}"),
                format!("q[1, {hq}, {d}] · kv[{hkv}, {}, {d}], {splits} splits", step.context),
                q * e + 2 * keys * e + 4,
                partials,
                // q·k and p·v for each query head over every key.
                4 * (step.context * hq * d) as u64,
            )
        });
        out.push(launch(
            format!("{p}.attention (combine splits)"),
            format!("attention_decode_combine.{dt}.d{d}"),
            format!("{splits} × [{hq}, {d}] f32"),
            partials,
            q * e,
            2 * splits * q,
        ));
        if self.output_gate {
            out.push(gate("output gate", "sigmoid_gate", 2 * q_elems * e, q_elems * e, 4 * q_elems));
        }
        self.o.decode_launches(step, out);
    }

    pub fn load(&self, ld: &Loader) -> Result<Attention, LlmError> {
        let qk_norm = match &self.qk_norm {
            Some((q, k)) => Some((q.load(ld)?, k.load(ld)?)),
            None => None,
        };
        Ok(Attention {
            shape: self.shape,
            output_gate: self.output_gate,
            q: self.q.load(ld)?,
            k: self.k.load(ld)?,
            v: self.v.load(ld)?,
            o: self.o.load(ld)?,
            qk_norm,
        })
    }
}

pub struct Attention {
    shape: AttentionShape,
    output_gate: bool,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    qk_norm: Option<(RmsNorm, RmsNorm)>,
}

/// What one attention layer needs per chunk of `tokens` rows; shared by every layer of a shape.
pub struct AttentionScratch {
    q: Tensor,
    k: Tensor,
    v: Tensor,
    /// The per-head norms of the query and key projections.
    q_normed: Tensor,
    k_normed: Tensor,
    q_rot: Tensor,
    /// Rotated keys before a paged append.
    k_rot: Tensor,
    attn: Tensor,
    /// With an output gate: `q_proj`'s output `[tokens, 2·Hq·head_dim]` and the gated
    /// attention output `[tokens, Hq·head_dim]`.
    gated: Option<(Tensor, Tensor)>,
}

impl AttentionScratch {
    pub fn new(
        device: &Device,
        dtype: DType,
        tokens: usize,
        shape: AttentionShape,
        output_gate: bool,
    ) -> Result<AttentionScratch, LlmError> {
        let AttentionShape { q_heads, kv_heads, head_dim } = shape;
        let empty = |shape: &[usize]| -> Result<Tensor, LlmError> { Ok(Tensor::empty(device, dtype, shape)?) };
        let (q, kv) = ([tokens, q_heads * head_dim], [tokens, kv_heads * head_dim]);
        Ok(AttentionScratch {
            q: empty(&q)?,
            k: empty(&kv)?,
            v: empty(&kv)?,
            q_normed: empty(&q)?,
            k_normed: empty(&kv)?,
            q_rot: empty(&[tokens, q_heads, head_dim])?,
            k_rot: empty(&[tokens, kv_heads, head_dim])?,
            attn: empty(&q)?,
            gated: match output_gate {
                true => Some((empty(&[tokens, 2 * q_heads * head_dim])?, empty(&q)?)),
                false => None,
            },
        })
    }
}

/// The device copies of a forward's token positions and sequence bookkeeping, written once per
/// forward and read by every layer: one sequence's chunk ([`StepInputs::write`]) or the packed
/// rows of a batch ([`StepInputs::write_batch`]).
pub struct StepInputs {
    tokens: usize,
    sequences: usize,
    positions: Tensor,
    /// The contiguous cache slot of each token's sequence (all 0: one sequence).
    token_slots: Tensor,
    /// Positions filled after the forward, per sequence `[sequences]`.
    seq_lens: Tensor,
    /// `[sequences + 1]`: sequence `b` owns rows `cu_seqlens[b]..cu_seqlens[b + 1]`.
    cu_seqlens: Tensor,
    /// Each sequence's slot of the linear-attention state pools `[sequences]`.
    sequence_slots: Tensor,
    /// Each sequence's last row `[sequences]` (whose logits a batch returns).
    last_rows: Tensor,
}

/// One sequence's rows of a batched forward: `count` tokens from position `start`, its state
/// in `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchRow {
    pub start: usize,
    pub count: usize,
    pub slot: usize,
}

impl StepInputs {
    /// Room for `tokens` rows of `sequences` sequences.
    pub fn new(device: &Device, tokens: usize, sequences: usize) -> Result<StepInputs, LlmError> {
        let u32s = |n: usize| -> Result<Tensor, LlmError> { Ok(Tensor::zeros(device, DType::U32, &[n])?) };
        Ok(StepInputs {
            tokens,
            sequences,
            positions: u32s(tokens)?,
            token_slots: u32s(tokens)?,
            seq_lens: u32s(sequences)?,
            cu_seqlens: u32s(sequences + 1)?,
            sequence_slots: u32s(sequences)?,
            last_rows: u32s(sequences)?,
        })
    }

    /// `[sequences + 1]` row offsets.
    pub(crate) fn cu_seqlens(&self) -> &Tensor {
        &self.cu_seqlens
    }

    /// `[sequences]` linear-attention pool slots.
    pub(crate) fn sequence_slots(&self) -> &Tensor {
        &self.sequence_slots
    }

    /// `[sequences]` each sequence's last row.
    pub(crate) fn last_rows(&self) -> &Tensor {
        &self.last_rows
    }

    /// The chunk of `tokens` rows at positions `start..start + tokens` of one sequence (in
    /// slot 0).
    pub fn write(&self, start: usize, tokens: usize) -> Result<(), LlmError> {
        self.write_batch(&[BatchRow { start, count: tokens, slot: 0 }])
    }

    /// The packed rows of `rows`, in order (they must fill this step's tokens and sequences).
    pub fn write_batch(&self, rows: &[BatchRow]) -> Result<(), LlmError> {
        let tokens: usize = rows.iter().map(|r| r.count).sum();
        if tokens != self.tokens || rows.len() != self.sequences || rows.iter().any(|r| r.count == 0) {
            return Err(LlmError::InvalidArgument(format!(
                "step inputs for {} rows of {} sequences, given {tokens} rows of {} sequences (none may be empty)",
                self.tokens,
                self.sequences,
                rows.len()
            )));
        }
        let mut positions = Vec::with_capacity(tokens);
        let (mut cu, mut last) = (vec![0u32], Vec::with_capacity(rows.len()));
        for r in rows {
            positions.extend((r.start..r.start + r.count).map(|p| p as u32));
            cu.push(positions.len() as u32);
            last.push(positions.len() as u32 - 1);
        }
        let u32s = |f: fn(&BatchRow) -> usize| rows.iter().map(|r| f(r) as u32).collect::<Vec<u32>>();
        self.positions.copy_from_slice(&positions)?;
        self.seq_lens.copy_from_slice(&u32s(|r| r.start + r.count))?;
        self.cu_seqlens.copy_from_slice(&cu)?;
        self.sequence_slots.copy_from_slice(&u32s(|r| r.slot))?;
        self.last_rows.copy_from_slice(&last)?;
        Ok(())
    }
}

/// Where an attention forward appends its keys and values, and what its queries attend.
pub enum KvTarget<'a> {
    /// One sequence's contiguous cache (and split-KV decode's workspace for one-row steps).
    Contiguous { cache: &'a KvCache, decode: &'a DecodeWorkspace },
    /// A batch's rows over a paged KV arena.
    Paged(PagedKv<'a>),
}

/// A paged forward: the plan of this step (block tables, lengths, each row's sequence and
/// position), the layer's arena `[pages, page_size, Hkv, D]`, and how attention reads it.
pub struct PagedKv<'a> {
    pub plan: &'a DevicePlan,
    pub k_cache: &'a Tensor,
    pub v_cache: &'a Tensor,
    pub read: PagedRead<'a>,
}

/// How attention reads the paged arena (`RUDA_PAGED_ATTENTION`).
pub enum PagedRead<'a> {
    /// The fused paged kernel reads the pages in place (over key splits merged in f32, with a
    /// workspace).
    Fused { split: Option<&'a SplitWorkspace> },
    /// Legacy: gather each sequence's pages into the contiguous `[B, Hkv, S, D]` buffers `k` and
    /// `v` (at least the batch's sequences and its longest length), then the contiguous kernels:
    /// split-KV decode with `decode` for a decode batch, else flash prefill over the cache.
    Gather { k: &'a Tensor, v: &'a Tensor, decode: Option<&'a DecodeWorkspace>, max_q: usize },
}

impl Attention {
    pub fn shape(&self) -> AttentionShape {
        self.shape
    }

    pub fn linears(&self) -> [&Linear; 4] {
        [&self.q, &self.k, &self.v, &self.o]
    }

    /// `out = attention(x)·Woᵀ (+ b)` for the `tokens` rows of `x` at `step`'s positions,
    /// appending their keys and values to `kv`: one sequence's contiguous cache (prefill
    /// continues it; one row is a decode step through the split-KV kernel) or a batch's paged
    /// arena.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        s: &Stream,
        plan: &LinearPlan,
        rope: &Rope,
        step: &StepInputs,
        x: &Tensor,
        kv: KvTarget<'_>,
        a: &AttentionScratch,
        out: &Tensor,
    ) -> Result<(), LlmError> {
        let t = x.shape()[0];
        let AttentionShape { q_heads: hq, kv_heads: hkv, head_dim: d } = self.shape;
        let op = |what: &'static str| move |e| LlmError::op(what, e);
        // With the output gate, q_proj's output `[T, Hq, 2·D]` holds per head the query, then
        // the gate: the q norm and the gate read those halves in place (views); without a q norm
        // (RoPE takes a dense query) they are split into two tensors.
        let (q_raw, gate) = match (self.output_gate, &a.gated) {
            (false, _) => {
                self.q.forward(s, plan, x, &a.q).map_err(op("projection"))?;
                (a.q.reshape(&[t, hq, d])?, None)
            }
            (true, Some((proj, _))) => {
                self.q.forward(s, plan, x, proj).map_err(op("projection"))?;
                let heads = proj.reshape(&[t, hq, 2 * d])?;
                match self.qk_norm {
                    Some(_) => (heads.narrow(2, 0, d)?, Some(heads.narrow(2, d, d)?)),
                    None => {
                        let (q, gate) = api::split_heads_halves(&heads).map_err(op("query / gate split"))?;
                        (q, Some(gate))
                    }
                }
            }
            (true, None) => {
                return Err(LlmError::InvalidArgument("gated attention needs a gated attention scratch".into()))
            }
        };
        self.k.forward(s, plan, x, &a.k).map_err(op("projection"))?;
        self.v.forward(s, plan, x, &a.v).map_err(op("projection"))?;
        let (q, k) = match &self.qk_norm {
            Some((qn, kn)) => {
                // Rows of `D` (a view of the query halves stays `[T, Hq, D]`).
                let q_in = if q_raw.is_contiguous() { q_raw.reshape(&[t * hq, d])? } else { q_raw.clone() };
                qn.forward(s, &q_in, &a.q_normed.reshape(q_in.shape())?).map_err(op("q norm"))?;
                kn.forward(s, &a.k.reshape(&[t * hkv, d])?, &a.k_normed.reshape(&[t * hkv, d])?)
                    .map_err(op("k norm"))?;
                (&a.q_normed, &a.k_normed)
            }
            None => (&q_raw, &a.k),
        };
        let (q3, k3, v3) = (q.reshape(&[t, hq, d])?, k.reshape(&[t, hkv, d])?, a.v.reshape(&[t, hkv, d])?);
        rope.forward(s, &q3, &step.positions, &a.q_rot).map_err(op("rope"))?;
        let attn = a.attn.reshape(&[t, hq, d])?;
        match kv {
            KvTarget::Contiguous { cache, decode } => {
                rope.forward_into_cache(s, &k3, &v3, &step.positions, &step.token_slots, cache.k(), cache.v())
                    .map_err(op("rope + cache append"))?;
                match t {
                    1 => api::attention_decode_into(
                        s,
                        &a.q_rot.reshape(&[1, hq, d])?,
                        cache.k(),
                        cache.v(),
                        &step.seq_lens,
                        None,
                        decode,
                        &attn.reshape(&[1, hq, d])?,
                    )
                    .map_err(op("decode attention"))?,
                    _ => api::attention_prefill_cache_into(
                        s,
                        &a.q_rot,
                        &step.cu_seqlens,
                        t,
                        cache.k(),
                        cache.v(),
                        &step.seq_lens,
                        None,
                        true,
                        &attn,
                    )
                    .map_err(op("prefill attention"))?,
                }
            }
            KvTarget::Paged(paged) => self.paged_attention(s, rope, step, &k3, &v3, &paged, a, &attn)?,
        }
        match (gate, &a.gated) {
            (Some(gate), Some((_, gated))) => {
                api::sigmoid_gate_into(s, &attn, &gate, &gated.reshape(&[t, hq, d])?)
                    .map_err(op("attention output gate"))?;
                self.o.forward(s, plan, gated, out).map_err(op("projection"))
            }
            _ => self.o.forward(s, plan, &a.attn, out).map_err(op("projection")),
        }
    }

    /// The paged half of [`Attention::forward`]: rotated keys and the values appended at each
    /// row's (page, slot), then attention over the pages (`attn` `[T, Hq, D]`).
    #[allow(clippy::too_many_arguments)]
    fn paged_attention(
        &self,
        s: &Stream,
        rope: &Rope,
        step: &StepInputs,
        k3: &Tensor,
        v3: &Tensor,
        paged: &PagedKv<'_>,
        a: &AttentionScratch,
        attn: &Tensor,
    ) -> Result<(), LlmError> {
        let op = |what: &'static str| move |e| LlmError::op(what, e);
        let (t, b) = (step.tokens, step.sequences);
        rope.forward(s, k3, &step.positions, &a.k_rot).map_err(op("rope (k)"))?;
        paged.plan.append_into(s, &a.k_rot, v3, paged.k_cache, paged.v_cache).map_err(op("paged KV append"))?;
        let AttentionShape { head_dim: d, .. } = self.shape;
        let scale = 1.0 / (d as f32).sqrt();
        let (k_cache, v_cache) = (paged.k_cache, paged.v_cache);
        match &paged.read {
            PagedRead::Fused { split: Some(ws) } => paged
                .plan
                .attention_with_workspace_into(s, &a.q_rot, k_cache, v_cache, scale, true, ws, attn)
                .map_err(op("paged attention (split)")),
            PagedRead::Fused { split: None } => paged
                .plan
                .attention_into(s, &a.q_rot, k_cache, v_cache, scale, true, None, attn)
                .map_err(op("paged attention")),
            PagedRead::Gather { k, v, decode, max_q } => {
                paged.plan.gather_into(s, paged.k_cache, k).map_err(op("paged KV gather"))?;
                paged.plan.gather_into(s, paged.v_cache, v).map_err(op("paged KV gather"))?;
                let (k, v) = (k.narrow(0, 0, b)?, v.narrow(0, 0, b)?);
                let lengths = paged.plan.lengths().narrow(0, 0, b)?;
                match decode {
                    Some(ws) if t == b => api::attention_decode_into(s, &a.q_rot, &k, &v, &lengths, None, ws, attn)
                        .map_err(op("decode attention (gathered pages)")),
                    _ => api::attention_prefill_cache_into(
                        s,
                        &a.q_rot,
                        &step.cu_seqlens,
                        *max_q,
                        &k,
                        &v,
                        &lengths,
                        None,
                        true,
                        attn,
                    )
                    .map_err(op("prefill attention (gathered pages)")),
                }
            }
        }?;
        Ok(())
    }
}

//! Causal depthwise conv1d over `[tokens, channels]` (no bias, optional SiLU), as Qwen3.5's
//! gated DeltaNet runs it on the whole `in_proj_qkv` output:
//!
//! ```text
//! u[s, c] = x[s, c] for s ≥ 0; state[c, W - 1 + s] for -(W - 1) ≤ s < 0 (zero without one)
//! y[t, c] = act(Σ_k weight[c, k] · u[t - (W - 1) + k, c])
//! final_state[c, i] = u[T - (W - 1) + i, c]           (the last W - 1 inputs, oldest first)
//! ```
//!
//! One thread per channel (consecutive threads on consecutive channels, so every access is
//! coalesced) and per chunk of [`CONV_CHUNK`] tokens; the window of the last W - 1 inputs rides
//! in registers, so each input is read once (plus W - 1 per chunk). Products and sums in `f32`
//! with `fma`, in the order of `k`; rounded once to the dtype. Decode rolls the state in place
//! ([`causal_conv1d_update`], [`causal_conv1d_update_slots`]); [`causal_conv1d_varlen`] packs.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use crate::blocks::{load_f32, row_ptr, silu, store_from_f32};

/// Threads per block (channels).
pub const CONV_THREADS: u32 = 128;
/// Tokens per thread in prefill.
pub const CONV_CHUNK: u32 = 32;
/// Most blocks along the token chunks; more chunks loop.
pub const CONV_MAX_CHUNK_BLOCKS: u32 = 65535;
/// The kernel widths registered (Qwen3.5 uses 4).
pub const CONV_WIDTHS: [u32; 3] = [2, 3, 4];

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv1dConfig {
    pub dtype: ScalarType,
    /// The kernel width W (the state holds W - 1 inputs).
    pub width: u32,
    /// SiLU after the convolution.
    pub silu: bool,
    /// Prefill only: whether an initial state precedes the tokens (else zeros).
    pub initial_state: bool,
}

impl Conv1dConfig {
    fn suffix(&self) -> &'static str {
        if self.silu {
            ".silu"
        } else {
            ""
        }
    }

    /// `causal_conv1d.bf16.w4.silu.init`.
    pub fn prefill_id(&self) -> String {
        let init = if self.initial_state { ".init" } else { "" };
        format!("causal_conv1d.{}.w{}{}{init}", self.dtype, self.width, self.suffix())
    }

    /// `causal_conv1d_update.bf16.w4.silu`.
    pub fn update_id(&self) -> String {
        format!("causal_conv1d_update.{}.w{}{}", self.dtype, self.width, self.suffix())
    }
}

crate::kernel_params! {
    /// The parameters of [`causal_conv1d`], in order (`initial_state` only when
    /// `cfg.initial_state`).
    pub struct Conv1dParams, Conv1dValues for Conv1dConfig as cfg {
        x: tensor(cfg.dtype),
        weight: tensor(cfg.dtype),
        initial_state: opt_tensor(cfg.dtype, cfg.initial_state),
        y: tensor(cfg.dtype),
        final_state: tensor(cfg.dtype),
        tokens: scalar(u32),
        channels: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`causal_conv1d_update`], in order.
    pub struct Conv1dUpdateParams, Conv1dUpdateValues for Conv1dConfig as cfg {
        x: tensor(cfg.dtype),
        weight: tensor(cfg.dtype),
        state: tensor(cfg.dtype),
        y: tensor(cfg.dtype),
        channels: scalar(u32),
    }
}

/// The `W` weights of channel `c`, widened.
fn load_weights(b: &mut KernelBuilder, weight: Value, c: Value, width: u32) -> Vec<Value> {
    let w = b.const_u32(width);
    let row = row_ptr(b, weight, c, w);
    (0..width)
        .map(|k| {
            let k = b.const_u32(k);
            load_f32(b, row, k)
        })
        .collect()
}

/// `act(Σ_k w[k] · u[k])` over the W - 1 older inputs (`window`) and the newest, `x`, summed
/// in the order of `k`.
fn convolve(b: &mut KernelBuilder, cfg: &Conv1dConfig, w: &[Value], window: &[Value], x: Value) -> Value {
    let mut acc = b.mul(w[0], window[0]);
    for (wk, u) in w[1..].iter().zip(window[1..].iter().chain([&x])) {
        acc = b.fma(*wk, *u, acc);
    }
    if cfg.silu {
        silu(b, acc)
    } else {
        acc
    }
}

/// One decode step of a channel: its state `row` (the `W - 1` older inputs) and the newest
/// input `x[at]` give `y[at]`, then the state rolls by one in place.
fn decode_step(b: &mut KernelBuilder, cfg: &Conv1dConfig, w: &[Value], row: Value, (x, y, at): (Value, Value, Value)) {
    let window: Vec<Value> = (0..cfg.width - 1)
        .map(|i| {
            let i = b.const_u32(i);
            load_f32(b, row, i)
        })
        .collect();
    let xt = load_f32(b, x, at);
    let out = convolve(b, cfg, w, &window, xt);
    store_from_f32(b, y, at, out);
    let mut next = window[1..].to_vec();
    next.push(xt);
    for (i, v) in next.into_iter().enumerate() {
        let i = b.const_u32(i as u32);
        store_from_f32(b, row, i, v);
    }
}

/// Parameters: x `[T, C]`, weight `[C, W]`, initial_state `[C, W - 1]` (when
/// `cfg.initial_state`), y `[T, C]`, final_state `[C, W - 1]`, tokens, channels (`u32`). Grid:
/// `(ceil(C / 128), min(ceil(T / 32), 65535))`, block [`CONV_THREADS`]; block row `y` handles
/// chunks `y, y + gridDim.y, ...`; block row 0 also writes the final state. `final_state` must
/// not alias `initial_state` or `x` (other blocks still read them).
pub fn causal_conv1d(cfg: &Conv1dConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.prefill_id().replace('.', "_"));
    let Conv1dValues { x, weight, initial_state, y, final_state, tokens, channels } =
        Conv1dParams::declare(&mut b, cfg);
    b.launch_bounds(CONV_THREADS, None);
    let keep = cfg.width - 1;

    let c = b.global_thread_id_x();
    let in_range = b.lt(c, channels);
    b.if_then(in_range, |b| {
        let w = load_weights(b, weight, c, cfg.width);
        let keep_v = b.const_u32(keep);
        let state_row = initial_state.map(|s| row_ptr(b, s, c, keep_v));
        let chunk_len = b.const_u32(CONV_CHUNK);
        let chunks = {
            let last = b.add(tokens, chunk_len);
            let one = b.const_u32(1);
            let last = b.sub(last, one);
            b.div(last, chunk_len)
        };
        let first_chunk = b.block_id_y();
        let chunk_step = b.special(SpecialReg::NctaidY);
        // `u[s, c]` for `s = t - keep + i`, with `t + i < keep` reading the initial state.
        let older = |b: &mut KernelBuilder, t: Value, i: u32| -> Value {
            let i_v = b.const_u32(i);
            let ti = b.add(t, i_v);
            let before = b.lt(ti, keep_v);
            b.if_else(
                before,
                |b| {
                    vec![match state_row {
                        Some(row) => load_f32(b, row, ti),
                        None => b.const_f32(0.0),
                    }]
                },
                |b| {
                    let s = b.sub(ti, keep_v);
                    let s64 = b.cvt(s, ScalarType::U64);
                    let c64 = b.cvt(channels, ScalarType::U64);
                    let cc64 = b.cvt(c, ScalarType::U64);
                    let at = b.fma(s64, c64, cc64);
                    vec![load_f32(b, x, at)]
                },
            )[0]
        };
        b.for_each(first_chunk, chunks, chunk_step, |b, chunk| {
            let t0 = b.mul(chunk, chunk_len);
            let window: Vec<Value> = (0..keep).map(|i| older(b, t0, i)).collect();
            let end = b.add(t0, chunk_len);
            let end = b.min(end, tokens);
            let one = b.const_u32(1);
            b.for_range(t0, end, one, &window, |b, t, window| {
                let t64 = b.cvt(t, ScalarType::U64);
                let c64 = b.cvt(channels, ScalarType::U64);
                let cc64 = b.cvt(c, ScalarType::U64);
                let at = b.fma(t64, c64, cc64);
                let xt = load_f32(b, x, at);
                let out = convolve(b, cfg, &w, window, xt);
                store_from_f32(b, y, at, out);
                let mut next = window[1..].to_vec();
                next.push(xt);
                next
            });
        });
        let zero = b.const_u32(0);
        let row0 = b.eq(first_chunk, zero);
        b.if_then(row0, |b| {
            let out_row = row_ptr(b, final_state, c, keep_v);
            for i in 0..keep {
                let v = older(b, tokens, i);
                let i_v = b.const_u32(i);
                store_from_f32(b, out_row, i_v, v);
            }
        });
    });
    b.finish()
}

/// Parameters: x `[1, C]`, weight `[C, W]`, state `[C, W - 1]` (read, then overwritten with the
/// last W - 1 inputs), y `[1, C]`, channels (`u32`). Grid: `ceil(C / 128)` blocks of
/// [`CONV_THREADS`]; each thread reads and writes only its channel's state.
pub fn causal_conv1d_update(cfg: &Conv1dConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.update_id().replace('.', "_"));
    let Conv1dUpdateValues { x, weight, state, y, channels } = Conv1dUpdateParams::declare(&mut b, cfg);
    b.launch_bounds(CONV_THREADS, None);
    let keep = cfg.width - 1;

    let c = b.global_thread_id_x();
    let in_range = b.lt(c, channels);
    b.if_then(in_range, |b| {
        let w = load_weights(b, weight, c, cfg.width);
        let keep_v = b.const_u32(keep);
        let row = row_ptr(b, state, c, keep_v);
        decode_step(b, cfg, &w, row, (x, y, c));
    });
    b.finish()
}

impl Conv1dConfig {
    /// `causal_conv1d_update_slots.bf16.w4.silu`.
    pub fn slots_id(&self) -> String {
        format!("causal_conv1d_update_slots.{}.w{}{}", self.dtype, self.width, self.suffix())
    }
}

crate::kernel_params! {
    /// The parameters of [`causal_conv1d_update_slots`], in order.
    pub struct Conv1dSlotsParams, Conv1dSlotsValues for Conv1dConfig as cfg {
        x: tensor(cfg.dtype),
        weight: tensor(cfg.dtype),
        states: tensor(cfg.dtype),
        state_slots: tensor(ScalarType::U32),
        y: tensor(cfg.dtype),
        channels: scalar(u32),
        slots: scalar(u32),
    }
}

/// The decode step of `N` sequences at once, each rolling its own state in a pool. Parameters:
/// x `[N, C]`, weight `[C, W]`, states `[slots, C, W - 1]`, state_slots (`u32 [N]`: sequence
/// `n`'s state is `states[state_slots[n]]`), y `[N, C]`, channels, slots (`u32`). Grid:
/// `(ceil(C / 128), N)`, block [`CONV_THREADS`]. A slot out of range touches no state and
/// makes its row of `y` NaN; two sequences must not share a slot.
pub fn causal_conv1d_update_slots(cfg: &Conv1dConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.slots_id().replace('.', "_"));
    let Conv1dSlotsValues { x, weight, states, state_slots, y, channels, slots } =
        Conv1dSlotsParams::declare(&mut b, cfg);
    b.launch_bounds(CONV_THREADS, None);
    let keep = cfg.width - 1;

    let c = b.global_thread_id_x();
    let in_range = b.lt(c, channels);
    b.if_then(in_range, |b| {
        let seq = b.block_id_y();
        let p = b.ptr_add(state_slots, seq);
        let slot = b.load(p);
        let seq64 = b.cvt(seq, ScalarType::U64);
        let c64 = b.cvt(channels, ScalarType::U64);
        let cc64 = b.cvt(c, ScalarType::U64);
        let at = b.fma(seq64, c64, cc64);
        let valid = b.lt(slot, slots);
        b.if_else(
            valid,
            |b| {
                let w = load_weights(b, weight, c, cfg.width);
                let slot64 = b.cvt(slot, ScalarType::U64);
                let state_at = b.fma(slot64, c64, cc64);
                let keep64 = b.const_u64(keep as u64);
                let offset = b.mul(state_at, keep64);
                let row = b.ptr_add(states, offset);
                decode_step(b, cfg, &w, row, (x, y, at));
                vec![]
            },
            |b| {
                let nan = b.const_f32(f32::NAN);
                store_from_f32(b, y, at, nan);
                vec![]
            },
        );
    });
    b.finish()
}

impl Conv1dConfig {
    /// `causal_conv1d_varlen.bf16.w4.silu`.
    pub fn varlen_id(&self) -> String {
        format!("causal_conv1d_varlen.{}.w{}{}", self.dtype, self.width, self.suffix())
    }

    /// `causal_conv1d_varlen_state.bf16.w4` (SiLU does not touch the state).
    pub fn varlen_state_id(&self) -> String {
        format!("causal_conv1d_varlen_state.{}.w{}", self.dtype, self.width)
    }
}

crate::kernel_params! {
    /// The parameters of [`causal_conv1d_varlen`], in order.
    pub struct Conv1dVarlenParams, Conv1dVarlenValues for Conv1dConfig as cfg {
        x: tensor(cfg.dtype),
        weight: tensor(cfg.dtype),
        cu_seqlens: tensor(ScalarType::U32),
        states: tensor(cfg.dtype),
        state_slots: tensor(ScalarType::U32),
        y: tensor(cfg.dtype),
        tokens: scalar(u32),
        channels: scalar(u32),
        sequences: scalar(u32),
        slots: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`causal_conv1d_varlen_state`], in order.
    pub struct Conv1dVarlenStateParams, Conv1dVarlenStateValues for Conv1dConfig as cfg {
        x: tensor(cfg.dtype),
        cu_seqlens: tensor(ScalarType::U32),
        states: tensor(cfg.dtype),
        state_slots: tensor(ScalarType::U32),
        tokens: scalar(u32),
        channels: scalar(u32),
        slots: scalar(u32),
    }
}

/// The sequence of packed token `t`: the last `m < sequences` with `cu_seqlens[m] ≤ t` (0 when
/// none), so empty sequences are skipped.
fn sequence_of(b: &mut KernelBuilder, cu_seqlens: Value, sequences: Value, t: Value) -> Value {
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    b.for_range(one, sequences, one, &[zero], |b, m, acc| {
        let p = b.ptr_add(cu_seqlens, m);
        let start = b.load(p);
        let inside = b.le(start, t);
        vec![b.select(inside, m, acc[0])]
    })[0]
}

/// Sequence `n`'s state row `states[state_slots[n], c]` and whether its slot is in range.
fn state_row(
    b: &mut KernelBuilder,
    (states, state_slots, slots): (Value, Value, Value),
    n: Value,
    c: Value,
    channels: Value,
    keep: u32,
) -> (Value, Value) {
    let p = b.ptr_add(state_slots, n);
    let slot = b.load(p);
    let valid = b.lt(slot, slots);
    let slot64 = b.cvt(slot, ScalarType::U64);
    let c64 = b.cvt(channels, ScalarType::U64);
    let cc64 = b.cvt(c, ScalarType::U64);
    let at = b.fma(slot64, c64, cc64);
    let keep64 = b.const_u64(keep as u64);
    let offset = b.mul(at, keep64);
    (b.ptr_add(states, offset), valid)
}

/// The causal conv1d of packed sequences (`cu_seqlens`), each continuing from its state in a
/// pool (read only here; [`causal_conv1d_varlen_state`] then writes the final states).
/// Parameters: x `[tokens, C]`, weight `[C, W]`, cu_seqlens (`u32 [N + 1]`), states
/// `[slots, C, W - 1]`, state_slots (`u32 [N]`), y `[tokens, C]`, tokens, channels, sequences
/// (`N`), slots. Grid: `(ceil(C / 128), min(ceil(tokens / 32), 65535))`, block
/// [`CONV_THREADS`]; block row `y` handles chunks `y, y + gridDim.y, ...` of the packed tokens,
/// finding each chunk's sequence by a scan of `cu_seqlens` and restarting the window at every
/// sequence start. A slot out of range reads as zeros; malformed `cu_seqlens` give wrong
/// values but never an access out of bounds.
pub fn causal_conv1d_varlen(cfg: &Conv1dConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.varlen_id().replace('.', "_"));
    let Conv1dVarlenValues { x, weight, cu_seqlens, states, state_slots, y, tokens, channels, sequences, slots } =
        Conv1dVarlenParams::declare(&mut b, cfg);
    b.launch_bounds(CONV_THREADS, None);
    let keep = cfg.width - 1;
    let pool = (states, state_slots, slots);

    let c = b.global_thread_id_x();
    let in_range = b.lt(c, channels);
    b.if_then(in_range, |b| {
        let w = load_weights(b, weight, c, cfg.width);
        let keep_v = b.const_u32(keep);
        let chunk_len = b.const_u32(CONV_CHUNK);
        let chunks = {
            let last = b.add(tokens, chunk_len);
            let one = b.const_u32(1);
            let last = b.sub(last, one);
            b.div(last, chunk_len)
        };
        // `u[t - keep + i]` within token `t`'s sequence `n`: the state's entries before the
        // sequence's first token. `start` is clamped to `t`, so indices stay in range.
        let older = |b: &mut KernelBuilder, t: Value, n: Value, i: u32| -> Value {
            let p = b.ptr_add(cu_seqlens, n);
            let start = b.load(p);
            let start = b.min(start, t);
            let i_v = b.const_u32(i);
            let ti = b.add(t, i_v);
            let ti = b.sub(ti, start);
            let before = b.lt(ti, keep_v);
            b.if_else(
                before,
                |b| {
                    let (row, valid) = state_row(b, pool, n, c, channels, keep);
                    let v = b.if_else(valid, |b| vec![load_f32(b, row, ti)], |b| vec![b.const_f32(0.0)]);
                    vec![v[0]]
                },
                |b| {
                    let s = b.add(t, i_v);
                    let s = b.sub(s, keep_v);
                    let s64 = b.cvt(s, ScalarType::U64);
                    let c64 = b.cvt(channels, ScalarType::U64);
                    let cc64 = b.cvt(c, ScalarType::U64);
                    let at = b.fma(s64, c64, cc64);
                    vec![load_f32(b, x, at)]
                },
            )[0]
        };
        // The first token of sequence `n + 1` (where the window restarts).
        let next_start = |b: &mut KernelBuilder, n: Value| -> Value {
            let one = b.const_u32(1);
            let n1 = b.add(n, one);
            let p = b.ptr_add(cu_seqlens, n1);
            b.load(p)
        };
        let first_chunk = b.block_id_y();
        let chunk_step = b.special(SpecialReg::NctaidY);
        b.for_each(first_chunk, chunks, chunk_step, |b, chunk| {
            let t0 = b.mul(chunk, chunk_len);
            let n0 = sequence_of(b, cu_seqlens, sequences, t0);
            let next0 = next_start(b, n0);
            let mut carried = vec![n0, next0];
            carried.extend((0..keep).map(|i| older(b, t0, n0, i)));
            let end = b.add(t0, chunk_len);
            let end = b.min(end, tokens);
            let one = b.const_u32(1);
            b.for_range(t0, end, one, &carried, |b, t, carried| {
                let entered = b.ge(t, carried[1]);
                let restarted = b.if_else(
                    entered,
                    |b| {
                        let n = sequence_of(b, cu_seqlens, sequences, t);
                        let mut v = vec![n, next_start(b, n)];
                        v.extend((0..keep).map(|i| older(b, t, n, i)));
                        v
                    },
                    |_| carried.to_vec(),
                );
                let window = &restarted[2..];
                let t64 = b.cvt(t, ScalarType::U64);
                let c64 = b.cvt(channels, ScalarType::U64);
                let cc64 = b.cvt(c, ScalarType::U64);
                let at = b.fma(t64, c64, cc64);
                let xt = load_f32(b, x, at);
                let out = convolve(b, cfg, &w, window, xt);
                store_from_f32(b, y, at, out);
                let mut next = restarted[..2].to_vec();
                next.extend_from_slice(&window[1..]);
                next.push(xt);
                next
            });
        });
    });
    b.finish()
}

/// The final states of [`causal_conv1d_varlen`], launched after it on the same stream:
/// `states[state_slots[n], c, i] = u[end - (W - 1) + i]` for sequence `n` ending at `end`, the
/// state's own entries where the sequence is shorter than W - 1. Parameters: x `[tokens, C]`,
/// cu_seqlens, states, state_slots, tokens, channels, slots. Grid: `(ceil(C / 128), N)`,
/// block [`CONV_THREADS`]; each thread reads its state row whole before it writes it. A slot
/// out of range is skipped.
pub fn causal_conv1d_varlen_state(cfg: &Conv1dConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.varlen_state_id().replace('.', "_"));
    let Conv1dVarlenStateValues { x, cu_seqlens, states, state_slots, tokens, channels, slots } =
        Conv1dVarlenStateParams::declare(&mut b, cfg);
    b.launch_bounds(CONV_THREADS, None);
    let keep = cfg.width - 1;

    let c = b.global_thread_id_x();
    let in_range = b.lt(c, channels);
    b.if_then(in_range, |b| {
        let n = b.block_id_y();
        let (row, valid) = state_row(b, (states, state_slots, slots), n, c, channels, keep);
        b.if_then(valid, |b| {
            let p = b.ptr_add(cu_seqlens, n);
            let start = b.load(p);
            let one = b.const_u32(1);
            let n1 = b.add(n, one);
            let p = b.ptr_add(cu_seqlens, n1);
            let end = b.load(p);
            // Malformed ranges are clamped to the tokens (and count as empty when reversed).
            let end = b.min(end, tokens);
            let start = b.min(start, end);
            let len = b.sub(end, start);
            let keep_v = b.const_u32(keep);
            let values: Vec<Value> = (0..keep)
                .map(|i| {
                    let i_v = b.const_u32(i);
                    let li = b.add(len, i_v);
                    let from_x = b.ge(li, keep_v);
                    b.if_else(
                        from_x,
                        |b| {
                            let s = b.add(end, i_v);
                            let s = b.sub(s, keep_v);
                            let s64 = b.cvt(s, ScalarType::U64);
                            let c64 = b.cvt(channels, ScalarType::U64);
                            let cc64 = b.cvt(c, ScalarType::U64);
                            let at = b.fma(s64, c64, cc64);
                            let p = b.ptr_add(x, at);
                            vec![b.load(p)]
                        },
                        |b| {
                            let p = b.ptr_add(row, li);
                            vec![b.load(p)]
                        },
                    )[0]
                })
                .collect();
            for (i, v) in values.into_iter().enumerate() {
                let i = b.const_u32(i as u32);
                let p = b.ptr_add(row, i);
                b.store(p, v);
            }
        });
    });
    b.finish()
}

//! Argmax over the last axis → `u32` indices, and the `u64` helpers it shares with sampling.
//!
//! Semantics (those of `torch.argmax`): the largest value wins, ties go to the lowest index, NaN
//! counts as larger than everything (so the first NaN wins), `-0.0` equals `+0.0`.
//!
//! Each candidate is packed into one `u64`, `(key << 32) | (0xffff_ffff - index)`, where `key` is
//! the value's bits mapped to an unsigned integer of the same order (NaN to `u32::MAX`); the
//! maximum of the packed words is the answer, so the reduction is an integer `max` whose result
//! does not depend on the order of combination. One block per (row, split); with more than one
//! split, [`argmax_reduce`] combines the per-split words.

use ruda_ir::{Constant, Kernel, KernelBuilder, ScalarType, VerifyError};

use crate::blocks::{argmax_key, block_reduce_with, load_f32, low32, pack, row_ptr, warp_max_u64};

/// Threads per argmax block.
pub const ARGMAX_THREADS: u32 = 256;
/// Threads per block of the split reduction (one warp per row).
pub const ARGMAX_REDUCE_THREADS: u32 = 32;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArgmaxConfig {
    pub dtype: ScalarType,
    /// Write one packed `u64` per (row, split) for [`argmax_reduce`] instead of the index.
    pub partial: bool,
}

impl ArgmaxConfig {
    /// `argmax.f32`, `argmax.bf16.partial`.
    pub fn id(&self) -> String {
        let partial = if self.partial { ".partial" } else { "" };
        format!("argmax.{}{partial}", self.dtype)
    }

    /// The id of the split reduction.
    pub fn reduce_id() -> String {
        "argmax.u64.reduce".into()
    }
}

crate::kernel_params! {
    /// The parameters of [`argmax`], in order: `out` (`u32` indices) in one pass, `partials`
    /// (`u64` words) when split.
    pub struct ArgmaxParams, ArgmaxValues for ArgmaxConfig as cfg {
        x: tensor(cfg.dtype),
        out: opt_tensor(ScalarType::U32, !cfg.partial),
        partials: opt_tensor(ScalarType::U64, cfg.partial),
        cols: scalar(u32),
        cols_per_split: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`argmax_reduce`], in order.
    pub struct ArgmaxReduceParams, ArgmaxReduceValues for () as _cfg {
        partials: tensor(ScalarType::U64),
        out: tensor(ScalarType::U32),
        splits: scalar(u32),
    }
}

/// Parameters: x `[rows, cols]`, out (`u32 [rows]`, or `u64 [rows, splits]` partials), cols,
/// cols_per_split (`u32`). Grid: `(rows, splits)`, block [`ARGMAX_THREADS`].
pub fn argmax(cfg: &ArgmaxConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let ArgmaxValues { x, out, partials, cols, cols_per_split } = ArgmaxParams::declare(&mut b, cfg);
    let out = out.or(partials).expect("one of out and partials is declared");
    b.launch_bounds(ARGMAX_THREADS, None);
    let scratch = b.shared_array("partials", ScalarType::U64, ARGMAX_THREADS / 32);

    let row = b.block_id_x();
    let split = b.block_id_y();
    let row_in = row_ptr(&mut b, x, row, cols);
    let start = b.mul(split, cols_per_split);
    let end = b.add(start, cols_per_split);
    let end = b.min(end, cols);
    let tid = b.thread_id_x();
    let first = b.add(start, tid);
    let step = b.const_u32(ARGMAX_THREADS);
    let none = b.constant(Constant::u64(0));
    let best = b.for_range(first, end, step, &[none], |b, j, acc| {
        let v = load_f32(b, row_in, j);
        let key = argmax_key(b, v);
        let inv = b.not(j);
        let packed = pack(b, key, inv);
        vec![b.max(acc[0], packed)]
    })[0];
    // A closure, not the fn item: through `Fn::call` the builder would record a location
    // inside the standard library.
    let best = block_reduce_with(
        &mut b,
        best,
        ARGMAX_THREADS,
        scratch,
        |b| b.constant(Constant::u64(0)),
        |b, v| warp_max_u64(b, v),
    );
    let zero = b.const_u32(0);
    let first_thread = b.eq(tid, zero);
    b.if_then(first_thread, |b| {
        if cfg.partial {
            let splits = b.special(ruda_ir::SpecialReg::NctaidY);
            let idx = b.fma(row, splits, split);
            let p = b.ptr_add(out, idx);
            b.store(p, best);
        } else {
            let inv = low32(b, best);
            let index = b.not(inv);
            let p = b.ptr_add(out, row);
            b.store(p, index);
        }
    });
    b.finish()
}

/// Combine the per-split words of [`argmax`] into indices. Parameters: partials (`u64 [rows,
/// splits]`), out (`u32 [rows]`), splits (`u32`). Grid: `rows` blocks of one warp.
pub fn argmax_reduce() -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(ArgmaxConfig::reduce_id().replace('.', "_"));
    let ArgmaxReduceValues { partials, out, splits } = ArgmaxReduceParams::declare(&mut b, &());
    b.launch_bounds(ARGMAX_REDUCE_THREADS, None);

    let row = b.block_id_x();
    let row_in = row_ptr(&mut b, partials, row, splits);
    let lane = b.thread_id_x();
    let step = b.const_u32(32);
    let none = b.constant(Constant::u64(0));
    let best = b.for_range(lane, splits, step, &[none], |b, s, acc| {
        let p = b.ptr_add(row_in, s);
        let v = b.load(p);
        vec![b.max(acc[0], v)]
    })[0];
    let best = warp_max_u64(&mut b, best);
    let zero = b.const_u32(0);
    let lane0 = b.eq(lane, zero);
    b.if_then(lane0, |b| {
        let inv = low32(b, best);
        let index = b.not(inv);
        let p = b.ptr_add(out, row);
        b.store(p, index);
    });
    b.finish()
}

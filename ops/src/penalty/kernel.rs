//! Repetition penalty (Hugging Face's `RepetitionPenaltyLogitsProcessor`), in place: for each
//! row `r` and each distinct id `t < V` in `token_ids[r, ..]`, `logits[r, t]` becomes
//! `logit · penalty` if `logit < 0`, else `logit / penalty` (computed in `f32`, rounded once).
//! An id `≥ V` is skipped, so callers may pad lists.
//!
//! Hugging Face gathers all selected logits before scattering, so a repeated id is penalised
//! once. Here the first occurrence of an id in the list applies the penalty and later ones do
//! nothing: no two threads touch the same logit, whatever the order. Whether position `i` is a
//! first occurrence is found by comparing with every earlier position, the list streamed
//! through shared memory in tiles of [`PENALTY_THREADS`] ids: `n²/2` shared-memory compares per
//! row, spread over the block's threads; meant for the few thousand ids of a generation history
//! (a caller with longer lists can pass each distinct id once, the result is the same).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, VerifyError};

use crate::blocks::{load_f32, row_ptr, store_from_f32};

/// Threads per block (one block per row); also the tile of ids staged in shared memory.
pub const PENALTY_THREADS: u32 = 256;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PenaltyConfig {
    pub dtype: ScalarType,
}

impl PenaltyConfig {
    /// `repetition_penalty.bf16`.
    pub fn id(&self) -> String {
        format!("repetition_penalty.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`repetition_penalty`], in order.
    pub struct RepetitionPenaltyParams, RepetitionPenaltyValues for PenaltyConfig as cfg {
        logits: tensor(cfg.dtype),
        token_ids: tensor(ScalarType::U32),
        vocab: scalar(u32),
        n: scalar(u32),
        penalty: scalar(f32),
    }
}

/// Parameters: logits `[rows, V]` (read and written), token_ids (`u32 [rows, n]`), vocab (`V`),
/// n (`u32`), penalty (`f32`, finite and > 0). Grid: `rows` blocks of [`PENALTY_THREADS`].
pub fn repetition_penalty(cfg: &PenaltyConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let RepetitionPenaltyValues { logits, token_ids, vocab, n, penalty } =
        RepetitionPenaltyParams::declare(&mut b, cfg);
    b.launch_bounds(PENALTY_THREADS, None);
    let tile_id = b.shared_array("ids_tile", ScalarType::U32, PENALTY_THREADS);

    let row = b.block_id_x();
    let logits_row = row_ptr(&mut b, logits, row, vocab);
    let ids_row = row_ptr(&mut b, token_ids, row, n);
    let tid = b.thread_id_x();
    let step = b.const_u32(PENALTY_THREADS);
    let zero = b.const_u32(0);
    let tile = b.shared_ptr(tile_id);
    // Tile `a` holds positions a .. a + 256; this thread owns position a + tid of each.
    b.for_each(zero, n, step, |b, a| {
        let i = b.add(a, tid);
        let mine = b.lt(i, n);
        let id = b.if_else(
            mine,
            |b| {
                let p = b.ptr_add(ids_row, i);
                vec![b.load(p)]
            },
            |b| vec![b.const_u32(u32::MAX)],
        )[0];
        // Earlier tiles `c ≤ a` (all threads take part: barriers); count matches before `i`.
        let one = b.const_u32(1);
        let a_end = b.add(a, one);
        let seen = b.for_range(zero, a_end, step, &[zero], |b, c, seen| {
            let j = b.add(c, tid);
            let in_list = b.lt(j, n);
            b.if_then(in_list, |b| {
                let p = b.ptr_add(ids_row, j);
                let v = b.load(p);
                let q = b.ptr_add(tile, tid);
                b.store(q, v);
            });
            b.barrier();
            // Whole earlier tiles, or the part of this one before position `i`.
            let same_tile = b.eq(c, a);
            let full = b.sub(n, c);
            let full = b.min(full, step);
            let before_i = b.min(tid, full);
            let limit = b.select(same_tile, before_i, full);
            let one = b.const_u32(1);
            let zero = b.const_u32(0);
            let seen = b.for_range(zero, limit, one, &[seen[0]], |b, k, seen| {
                let q = b.ptr_add(tile, k);
                let other = b.load(q);
                let hit = b.eq(other, id);
                let one = b.const_u32(1);
                vec![b.select(hit, one, seen[0])]
            })[0];
            // The tile is overwritten next iteration only after every thread has read it.
            b.barrier();
            vec![seen]
        })[0];
        let first = b.eq(seen, zero);
        let known = b.lt(id, vocab);
        let apply = b.and(first, known);
        let apply = b.and(apply, mine);
        b.if_then(apply, |b| {
            let z = load_f32(b, logits_row, id);
            let zero_f = b.const_f32(0.0);
            let negative = b.lt(z, zero_f);
            let scaled = b.mul(z, penalty);
            let divided = b.div(z, penalty);
            let v = b.select(negative, scaled, divided);
            store_from_f32(b, logits_row, id, v);
        });
    });
    b.finish()
}

//! The paged KV cache's data movement kernels: `append` scatters each query's key and value rows
//! to its (page, slot), `gather` copies pages into the contiguous `[B, Hkv, S_max, D]` layout of
//! the legacy attention path. Both copy bits (any float dtype), one block per row and head.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

/// Threads per block of the paged copy kernels.
pub const PAGED_COPY_THREADS: u32 = 128;

/// The configuration of [`paged_append`] and [`paged_gather`]: the element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PagedCopyConfig {
    pub dtype: ScalarType,
}

impl PagedCopyConfig {
    /// `paged_append.bf16`.
    pub fn append_id(&self) -> String {
        format!("paged_append.{}", self.dtype)
    }

    /// `paged_gather.bf16`.
    pub fn gather_id(&self) -> String {
        format!("paged_gather.{}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`paged_append`], in order.
    pub struct PagedAppendParams, PagedAppendValues for PagedCopyConfig as cfg {
        slots: tensor(ScalarType::U32),
        k: tensor(cfg.dtype),
        v: tensor(cfg.dtype),
        key_cache: tensor(cfg.dtype),
        value_cache: tensor(cfg.dtype),
        heads: scalar(u32),
        dim: scalar(u32),
        value_dim: scalar(u32),
    }
}

crate::kernel_params! {
    /// The parameters of [`paged_gather`], in order.
    pub struct PagedGatherParams, PagedGatherValues for PagedCopyConfig as cfg {
        tables: tensor(ScalarType::U32),
        lengths: tensor(ScalarType::U32),
        cache: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        page_size: scalar(u32),
        table_width: scalar(u32),
        heads: scalar(u32),
        dim: scalar(u32),
        max_length: scalar(u32),
    }
}

/// `base + row * len` as a pointer, the product in 64 bits.
pub(crate) fn row(b: &mut KernelBuilder, base: Value, index: Value, len: Value) -> Value {
    let i = b.cvt(index, ScalarType::U64);
    let n = b.cvt(len, ScalarType::U64);
    let off = b.mul(i, n);
    b.ptr_add(base, off)
}

/// `dst[j] = src[j]` for `j < len`, strided over the block's threads.
pub(crate) fn copy_row(b: &mut KernelBuilder, src: Value, dst: Value, len: Value) {
    let tid = b.thread_id_x();
    let step = b.const_u32(PAGED_COPY_THREADS);
    b.for_each(tid, len, step, |b, j| {
        let s = b.ptr_add(src, j);
        let x = b.load(s);
        let d = b.ptr_add(dst, j);
        b.store(d, x);
    });
}

/// Parameters: slots (`u32 [Q]`, the cache row `page * page_size + offset` of each query), k
/// `[Q, Hkv, D]`, v `[Q, Hkv, Dv]`, key_cache `[pages, page_size, Hkv, D]`, value_cache
/// `[pages, page_size, Hkv, Dv]`, heads (`Hkv`), dim (`D`), value_dim (`Dv`). Grid: `Q × Hkv`
/// blocks of [`PAGED_COPY_THREADS`]. The host checks the slots (in range, no two equal).
pub fn paged_append(cfg: &PagedCopyConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.append_id().replace('.', "_"));
    let PagedAppendValues { slots, k, v, key_cache, value_cache, heads, dim, value_dim } =
        PagedAppendParams::declare(&mut b, cfg);
    b.launch_bounds(PAGED_COPY_THREADS, None);
    let query = b.block_id_x();
    let head = b.block_id_y();
    let p = b.ptr_add(slots, query);
    let slot = b.load(p);
    let qh = b.mul(query, heads);
    let src_row = b.add(qh, head);
    let sh = b.mul(slot, heads);
    let dst_row = b.add(sh, head);
    for (src, dst, len) in [(k, key_cache, dim), (v, value_cache, value_dim)] {
        let s = row(&mut b, src, src_row, len);
        let d = row(&mut b, dst, dst_row, len);
        copy_row(&mut b, s, d, len);
    }
    b.finish()
}

/// Parameters: tables (`u32 [B_cap, table_width]`), lengths (`u32 [B_cap]`), cache
/// `[pages, page_size, Hkv, D]`, out `[B_out, Hkv, max_length, D]`, page_size, table_width,
/// heads (`Hkv`), dim (`D`), max_length (`S_max`, out's third dim). Grid: `L × (B · Hkv)`
/// blocks of [`PAGED_COPY_THREADS`] for `L` the longest length; block `(t, s · Hkv + h)` copies
/// position `t` of head `h` of sequence `s` when `t < lengths[s]` and leaves `out` alone past it.
pub fn paged_gather(cfg: &PagedCopyConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.gather_id().replace('.', "_"));
    let PagedGatherValues { tables, lengths, cache, out, page_size, table_width, heads, dim, max_length } =
        PagedGatherParams::declare(&mut b, cfg);
    b.launch_bounds(PAGED_COPY_THREADS, None);
    let t = b.block_id_x();
    let sh = b.block_id_y();
    let seq = b.div(sh, heads);
    let head = b.rem(sh, heads);
    let lp = b.ptr_add(lengths, seq);
    let len = b.load(lp);
    let live = b.lt(t, len);
    b.if_then(live, |b| {
        let page_index = b.div(t, page_size);
        let offset = b.rem(t, page_size);
        let tr = b.mul(seq, table_width);
        let ti = b.add(tr, page_index);
        let pp = b.ptr_add(tables, ti);
        let page = b.load(pp);
        let pr = b.mul(page, page_size);
        let cache_row = b.add(pr, offset);
        let ch = b.mul(cache_row, heads);
        let src_row = b.add(ch, head);
        let s = row(b, cache, src_row, dim);
        let or = b.mul(sh, max_length);
        let out_row = b.add(or, t);
        let d = row(b, out, out_row, dim);
        copy_row(b, s, d, dim);
    });
    b.finish()
}

//! Embedding gather: `out[t, :] = table[ids[t], :]` for `u32` ids, bits copied unchanged. An
//! id `≥ V` (the host cannot see device ids without a sync) yields a row of zeros, never a read
//! outside the table. One block per token.

use ruda_ir::{Constant, Kernel, KernelBuilder, ScalarType, Value, VerifyError};

/// Threads per embedding block.
pub const EMBEDDING_THREADS: u32 = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EmbeddingConfig {
    pub dtype: ScalarType,
    /// Copy 16 bytes per access: rows must be whole 16-byte units, 16-byte aligned.
    pub vector: bool,
}

impl EmbeddingConfig {
    /// `embedding.bf16`, `embedding.bf16.scalar`.
    pub fn id(&self) -> String {
        let scalar = if self.vector { "" } else { ".scalar" };
        format!("embedding.{}{scalar}", self.dtype)
    }
}

crate::kernel_params! {
    /// The parameters of [`embedding`], in order.
    pub struct EmbeddingParams, EmbeddingValues for EmbeddingConfig as cfg {
        ids: tensor(ScalarType::U32),
        table: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        vocab: scalar(u32),
        hidden: scalar(u32),
    }
}

/// Parameters: ids (`u32 [T]`), table `[V, H]`, out `[T, H]`, vocab (`V`), hidden (`H`)
/// (`u32`). Grid: `T` blocks of [`EMBEDDING_THREADS`].
pub fn embedding(cfg: &EmbeddingConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let EmbeddingValues { ids, table, out, vocab, hidden } = EmbeddingParams::declare(&mut b, cfg);
    b.launch_bounds(EMBEDDING_THREADS, None);

    let token = b.block_id_x();
    let p = b.ptr_add(ids, token);
    let id = b.load(p);
    let valid = b.lt(id, vocab);
    let zero = b.const_u32(0);
    let row = b.select(valid, id, zero);
    let row_ptr = |b: &mut KernelBuilder, base: Value, r: Value| {
        let r = b.cvt(r, ScalarType::U64);
        let h = b.cvt(hidden, ScalarType::U64);
        let off = b.mul(r, h);
        b.ptr_add(base, off)
    };
    let src = row_ptr(&mut b, table, row);
    let dst = row_ptr(&mut b, out, token);
    let (src, dst, unit, len) = if cfg.vector {
        let per = 16 / cfg.dtype.bytes();
        let shift = b.const_u32(per.trailing_zeros());
        let units = b.shr(hidden, shift);
        (b.ptr_cast(src, ScalarType::U32), b.ptr_cast(dst, ScalarType::U32), ScalarType::U32, units)
    } else {
        (src, dst, cfg.dtype, hidden)
    };
    let tid = b.thread_id_x();
    let step = b.const_u32(EMBEDDING_THREADS);
    b.for_each(tid, len, step, |b, j| {
        let (index, lanes) = if cfg.vector {
            let four = b.const_u32(4);
            (b.mul(j, four), 4)
        } else {
            (j, 1)
        };
        let q = b.ptr_add(src, index);
        let value = b.if_else(
            valid,
            |b| vec![if lanes == 4 { b.load_vec(q, 4) } else { b.load(q) }],
            |b| {
                let z = b.constant(Constant::new(unit, 0));
                vec![if lanes == 4 { b.make_vector(&[z, z, z, z]) } else { z }]
            },
        )[0];
        let d = b.ptr_add(dst, index);
        b.store(d, value);
    });
    b.finish()
}

//! Embedding gather.

use ruda_runtime::{DType, LaunchConfig, Stream, Tensor};

use super::kernel::{EmbeddingConfig, EmbeddingParams, EMBEDDING_THREADS};
use crate::error::{OpError, Result};
use crate::host::*;
use crate::params;

/// `out[t, :] = table[ids[t], :]` for `ids` `u32 [T]` and `table [V, H]` (any float dtype; the
/// bits are copied). An id `≥ V` gives a row of zeros: the host cannot check device-resident ids
/// without a sync, and the kernel never reads outside the table.
pub fn embedding_into(stream: &Stream, ids: &Tensor, table: &Tensor, out: &Tensor) -> Result<()> {
    let name = "embedding";
    let dtype = float_dtype(name, table)?;
    contiguous_nonempty(name, "ids", ids)?;
    expect_dtype(name, "ids", ids, DType::U32)?;
    if ids.rank() != 1 {
        return Err(OpError::Shape { op: name, message: format!("`ids` must be 1-D, is {:?}", ids.shape()) });
    }
    contiguous_nonempty(name, "table", table)?;
    if table.rank() != 2 {
        return Err(OpError::Shape {
            op: name,
            message: format!("`table` must be [vocab, hidden], is {:?}", table.shape()),
        });
    }
    let (tokens, (vocab, hidden)) = (ids.shape()[0], (table.shape()[0], table.shape()[1]));
    expect_tensor(name, "out", out, table.dtype(), &[tokens, hidden])?;
    same_device(name, stream, &[("ids", ids), ("table", table), ("out", out)])?;
    let size = table.dtype().size();
    let aligned = |t: &Tensor| (t.offset() * size).is_multiple_of(16);
    let vector = (hidden * size).is_multiple_of(16) && aligned(table) && aligned(out);
    let cfg = EmbeddingConfig { dtype, vector };
    let k = kernel(cfg.id(), || crate::kernels::embedding::embedding(&cfg))?;
    let args = EmbeddingParams {
        ids,
        table,
        out,
        vocab: to_u32(name, "vocab", vocab)?,
        hidden: to_u32(name, "hidden", hidden)?,
    };
    params::launch(stream, &k, LaunchConfig::linear(to_u32(name, "tokens", tokens)?, EMBEDDING_THREADS), &args.args())?;
    Ok(())
}

/// The rows of `table` at `ids` (see [`embedding_into`]).
pub fn embedding(ids: &Tensor, table: &Tensor) -> Result<Tensor> {
    let hidden = table.shape().get(1).copied().unwrap_or(0);
    let out = Tensor::empty(table.device(), table.dtype(), &[ids.numel(), hidden])?;
    embedding_into(&table.device().default_stream(), ids, table, &out)?;
    Ok(out)
}

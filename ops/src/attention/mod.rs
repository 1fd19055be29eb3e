//! Attention, by level:
//!
//! - [`geometry`]: the flash kernels' tile shape for a pair of head dims, and the registered dims;
//! - [`prefill`]: the flash prefill kernel (packed variable-length batches or a KV cache);
//! - [`decode`]: split-KV decode over a KV cache and the combine of its splits;
//! - [`fallback`]: the masked softmax of the multi-kernel fallback;
//! - [`api`]: the entry points (validate, pick a kernel and a split count, launch);
//! - [`tune`]: decode's split count tuned per GPU and shape;
//! - `flash` (private): the helpers and online-softmax core prefill and decode share;
//! - `family`: the families `attention_prefill`, `attention_decode` and `attention_fallback`.
//!
//! # The contract
//!
//! Semantics are those of Hugging Face Qwen2 attention (`eager_attention_forward`, SDPA):
//! `softmax(q · kᵀ · scale + bias) · v` per query head, the key/value head of query head `h`
//! being `h / (Hq / Hkv)` (GQA), `scale` defaulting to `1 / sqrt(D)`. A causal mask is aligned
//! to the end: query `i` of a sequence of `q_len` queries and `kv_len` keys attends keys
//! `j <= i + kv_len - q_len` (the new tokens follow the cached ones). A query row that may
//! attend no key at all gives zeros (flash-attn's convention; SDPA would give NaN).
//! Statistics and accumulation are `f32`; the output has the input dtype.
//!
//! The kernels: a SIMT flash-attention forward for prefill (packed variable-length batches, GQA,
//! causal or not, optional mask and bias), split-KV decode over a contiguous KV cache with its
//! combine kernel, and the masked softmax of the multi-kernel fallback.
//!
//! # The flash kernels
//!
//! One block of [`THREADS`](geometry::THREADS) threads handles a tile of `BR` query rows of one head of one
//! sequence (decode: the query heads of one GQA group, for one split of the keys). Queries and
//! keys have head dim `D`, values and the output `Dv` (each 1 to 1024; see [`Geometry`](geometry::Geometry)). Each
//! pair of query rows (one row for large head dims) belongs to a group of `G` consecutive
//! lanes (`G = D / 16` at D = Dv = 64, 128, 256); each lane keeps its runs of 4 dimensions,
//! strided by `4 G`, of `q` (pre-scaled by `scale · log2 e`) and of the output accumulator in
//! registers (so a group reads 16-byte runs side by side and the other groups of the warp read
//! the same addresses, a broadcast). Keys and values are staged through shared memory as `f32`
//! in tiles of `BC` rows (`BC · D = 2048` at those dims: 16 KiB for both); every element a lane
//! reads from there feeds both of its rows, which halves the shared-memory traffic that bounds
//! a SIMT attention. A tile is consumed in chunks of
//! [`CHUNK`](geometry::CHUNK) keys: partial dot products, a butterfly sum over the group's lanes (so every lane
//! holds the same scores bit for bit), masking, then the online softmax update in the log2
//! domain (running max `m`, running sum `l`, accumulator rescaled by `ex2(m_old - m_new)`) and
//! `acc += p · v`. With a mask or bias, `bias · log2 e` (or `-inf` where the mask forbids) is
//! staged per tile too, as a `BR × BC` f32 tile. Statistics and accumulation are `f32`
//! whatever the input dtype; `ex2` is PTX's approximate one, so results are compared with
//! tolerances.
//!
//! Tiles and chunks are sized so that every configuration stays within 128 registers without
//! spills (`rudac check`), i.e. four blocks of 128 threads per SM (three for some; see
//! [`Geometry::min_blocks`](geometry::Geometry::min_blocks)).
//!
//! A row without any key to attend (all masked, an empty sequence, a decode split past the
//! sequence's end) has `l = 0` and produces zeros.

pub mod api;
pub mod decode;
pub mod fallback;
mod family;
mod flash;
pub mod geometry;
pub mod prefill;
pub mod tune;

pub use family::Attention;

/// Every attention kernel builder and its configuration in one namespace, which
/// `crate::kernels::attention` names.
pub mod kernels {
    pub use super::decode::*;
    pub use super::fallback::*;
    pub use super::geometry::*;
    pub use super::prefill::*;
}

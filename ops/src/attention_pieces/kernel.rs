//! One strided batched dot-product kernel behind every composable attention piece: output
//! `(batch, row, col)` is `scale · (Σ_k a[..]·b[..] + Σ_k a2[..]·b2[..])`, each operand indexed
//! by its own strides, the batch index divided by a group size first (a GQA group shares its
//! key/value head, so KV heads are never repeated). The pieces' operands are per-head slices of
//! token-major tensors, which the contiguous GEMMs cannot take without copies.

use ruda_ir::{Kernel, KernelBuilder, ScalarType, SpecialReg, Value, VerifyError};

use crate::blocks::{load_f32, store_from_f32};

/// Threads per block (along the output's columns).
pub const PIECES_THREADS: u32 = 128;

/// The element types of `a` (and `a2`), `b` (and `b2`) and `out`, and whether a second product
/// is added (MLA's positional scores). Parameters: `a, b, [a2, b2,] out`, then `n, k, [k2,] ga,
/// gb: u32`, `scale: f32`, and the `u32` strides `a_batch, a_row, a_k, b_batch, b_col, b_k,
/// [a2_batch, a2_row, a2_k, b2_batch, b2_col, b2_k,] o_batch, o_row, o_col`. Operand `a` of
/// batch `z` starts at `(z / ga) · a_batch`, `b` at `(z / gb) · b_batch`. Launch: grid
/// `(ceil(n / PIECES_THREADS), rows, batches)`, [`PIECES_THREADS`] threads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PiecesDotConfig {
    pub a: ScalarType,
    pub b: ScalarType,
    pub out: ScalarType,
    pub second: bool,
}

impl PiecesDotConfig {
    /// `attention_pieces_dot.f32.bf16.bf16` (`.two` with a second product).
    pub fn id(&self) -> String {
        let two = if self.second { ".two" } else { "" };
        format!("attention_pieces_dot.{}.{}.{}{two}", self.a, self.b, self.out)
    }
}

crate::kernel_params! {
    /// The parameters of [`attention_pieces_dot`] (see [`PiecesDotConfig`]).
    pub struct PiecesDotParams, PiecesDotValues for PiecesDotConfig as cfg {
        a: tensor(cfg.a),
        b: tensor(cfg.b),
        a2: opt_tensor(cfg.a, cfg.second),
        b2: opt_tensor(cfg.b, cfg.second),
        out: tensor(cfg.out),
        n: scalar(u32),
        k: scalar(u32),
        k2: opt_scalar(u32, cfg.second),
        ga: scalar(u32),
        gb: scalar(u32),
        scale: scalar(f32),
        a_batch: scalar(u32),
        a_row: scalar(u32),
        a_k: scalar(u32),
        b_batch: scalar(u32),
        b_col: scalar(u32),
        b_k: scalar(u32),
        a2_batch: opt_scalar(u32, cfg.second),
        a2_row: opt_scalar(u32, cfg.second),
        a2_k: opt_scalar(u32, cfg.second),
        b2_batch: opt_scalar(u32, cfg.second),
        b2_col: opt_scalar(u32, cfg.second),
        b2_k: opt_scalar(u32, cfg.second),
        o_batch: scalar(u32),
        o_row: scalar(u32),
        o_col: scalar(u32),
    }
}

/// One operand pair of the sum: pointers, reduction length and strides.
struct Product {
    a: Value,
    b: Value,
    k: Value,
    a_strides: [Value; 3],
    b_strides: [Value; 3],
}

/// `acc + Σ_i a[a_base + i · a_k] · b[b_base + i · b_k]` for this thread's (batch, row, col).
fn dot(b: &mut KernelBuilder, p: &Product, ia: Value, ib: Value, row: Value, col: Value, acc: Value) -> Value {
    let [a_batch, a_row, a_k] = p.a_strides;
    let [b_batch, b_col, b_k] = p.b_strides;
    let a_base = b.mul(ia, a_batch);
    let a_base = b.fma(row, a_row, a_base);
    let b_base = b.mul(ib, b_batch);
    let b_base = b.fma(col, b_col, b_base);
    let zero = b.const_u32(0);
    let one = b.const_u32(1);
    let (pa, pb) = (p.a, p.b);
    b.for_range(zero, p.k, one, &[acc], |b, i, acc| {
        let ai = b.fma(i, a_k, a_base);
        let bi = b.fma(i, b_k, b_base);
        let x = load_f32(b, pa, ai);
        let y = load_f32(b, pb, bi);
        vec![b.fma(x, y, acc[0])]
    })[0]
}

/// Build the strided batched dot-product kernel (see [`PiecesDotConfig`]).
pub fn attention_pieces_dot(cfg: &PiecesDotConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let p = PiecesDotParams::declare(&mut b, cfg);
    b.launch_bounds(PIECES_THREADS, None);
    let col = b.global_thread_id_x();
    let row = b.block_id_y();
    let z = b.special(SpecialReg::CtaidZ);
    let first = Product {
        a: p.a,
        b: p.b,
        k: p.k,
        a_strides: [p.a_batch, p.a_row, p.a_k],
        b_strides: [p.b_batch, p.b_col, p.b_k],
    };
    let second = match (p.a2, p.b2, p.k2, p.a2_batch, p.a2_row, p.a2_k, p.b2_batch, p.b2_col, p.b2_k) {
        (Some(a), Some(b2), Some(k), Some(ab), Some(ar), Some(ak), Some(bb), Some(bc), Some(bk)) => {
            Some(Product { a, b: b2, k, a_strides: [ab, ar, ak], b_strides: [bb, bc, bk] })
        }
        _ => None,
    };
    let in_range = b.lt(col, p.n);
    b.if_then(in_range, |b| {
        let ia = b.div(z, p.ga);
        let ib = b.div(z, p.gb);
        let zf = b.const_f32(0.0);
        let mut acc = dot(b, &first, ia, ib, row, col, zf);
        if let Some(s) = &second {
            acc = dot(b, s, ia, ib, row, col, acc);
        }
        let y = b.mul(acc, p.scale);
        let o = b.mul(z, p.o_batch);
        let o = b.fma(row, p.o_row, o);
        let o = b.fma(col, p.o_col, o);
        store_from_f32(b, p.out, o, y);
    });
    b.finish()
}

//! Elementwise kernels: binary arithmetic, SiLU and dtype casts. One thread per element, all
//! arithmetic in `f32`, the result rounded to the output dtype (nearest even).

use ruda_ir::{Kernel, KernelBuilder, ScalarType, Value, VerifyError};

use crate::blocks::{load_f32, silu, store_from_f32};

/// Threads per block of every elementwise kernel.
pub const ELEMENTWISE_BLOCK: u32 = 256;

/// Which elementwise operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElementwiseOp {
    /// `out = a + b`
    Add,
    /// `out = a * b`
    Mul,
    /// `out = x * sigmoid(x)`
    Silu,
    /// `out = x` converted to the output dtype
    Cast,
}

impl ElementwiseOp {
    pub fn name(self) -> &'static str {
        match self {
            ElementwiseOp::Add => "add",
            ElementwiseOp::Mul => "mul",
            ElementwiseOp::Silu => "silu",
            ElementwiseOp::Cast => "cast",
        }
    }

    pub fn arity(self) -> usize {
        match self {
            ElementwiseOp::Add | ElementwiseOp::Mul => 2,
            ElementwiseOp::Silu | ElementwiseOp::Cast => 1,
        }
    }
}

/// One elementwise kernel configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ElementwiseConfig {
    pub op: ElementwiseOp,
    pub input: ScalarType,
    pub output: ScalarType,
}

impl ElementwiseConfig {
    /// `add.bf16`, `cast.f32.bf16` (from, to).
    pub fn id(&self) -> String {
        match self.op {
            ElementwiseOp::Cast => format!("cast.{}.{}", self.input, self.output),
            op => format!("{}.{}", op.name(), self.input),
        }
    }
}

crate::kernel_params! {
    /// The parameters of [`elementwise`], in order: `b` only for binary ops.
    pub struct ElementwiseParams, ElementwiseValues for ElementwiseConfig as cfg {
        a: tensor(cfg.input),
        b: opt_tensor(cfg.input, cfg.op.arity() == 2),
        out: tensor(cfg.output),
        n: scalar(u32),
    }
}

/// Build the kernel. Parameters: the inputs (one or two), the output, then `n: u32`.
pub fn elementwise(cfg: &ElementwiseConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let ElementwiseValues { a, b: b_in, out, n } = ElementwiseParams::declare(&mut b, cfg);
    let inputs: Vec<_> = std::iter::once(a).chain(b_in).collect();
    b.launch_bounds(ELEMENTWISE_BLOCK, None);

    let i = b.global_thread_id_x();
    let in_range = b.lt(i, n);
    b.if_then(in_range, |b| {
        let x = load_f32(b, inputs[0], i);
        let y = match cfg.op {
            ElementwiseOp::Add => {
                let other = load_f32(b, inputs[1], i);
                b.add(x, other)
            }
            ElementwiseOp::Mul => {
                let other = load_f32(b, inputs[1], i);
                b.mul(x, other)
            }
            ElementwiseOp::Silu => silu(b, x),
            ElementwiseOp::Cast => x,
        };
        store_from_f32(b, out, i, y);
    });
    b.finish()
}

/// Threads per bias-add block (along the row).
pub const BIAS_THREADS: u32 = 256;
/// Most blocks along the rows; more rows loop.
pub const BIAS_MAX_ROW_BLOCKS: u32 = 65535;

/// Row-broadcast bias add: `out[r, c] = x[r, c] + bias[c]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BiasConfig {
    pub dtype: ScalarType,
    /// Each thread handles 16 bytes (4 `f32` or 8 halves): rows must be whole 16-byte units and
    /// every tensor 16-byte aligned.
    pub vector: bool,
}

impl BiasConfig {
    /// `add_bias.bf16`, `add_bias.bf16.scalar`.
    pub fn id(&self) -> String {
        let scalar = if self.vector { "" } else { ".scalar" };
        format!("add_bias.{}{scalar}", self.dtype)
    }

    /// Elements per thread.
    pub fn per_thread(&self) -> u32 {
        if self.vector {
            16 / self.dtype.bytes()
        } else {
            1
        }
    }
}

/// The `f32`s of one unit (see [`BiasConfig::per_thread`]) at `ptr[unit]` (`ptr` already cast:
/// `f32`, or `u32` words for halves, or the element type when scalar).
#[track_caller]
fn load_unit(b: &mut KernelBuilder, cfg: &BiasConfig, ptr: Value, unit: Value) -> Vec<Value> {
    if !cfg.vector {
        return vec![load_f32(b, ptr, unit)];
    }
    let four = b.const_u32(4);
    let i = b.mul(unit, four);
    let p = b.ptr_add(ptr, i);
    let v = b.load_vec(p, 4);
    let mut out = Vec::with_capacity(8);
    for j in 0..4 {
        let w = b.extract(v, j);
        if cfg.dtype == ScalarType::F32 {
            out.push(w);
        } else {
            let (lo, hi) = crate::blocks::unpack_halves(b, cfg.dtype, w);
            out.extend([lo, hi]);
        }
    }
    out
}

/// Round `values` to the dtype and store them as one unit at `ptr[unit]` (see [`load_unit`]).
#[track_caller]
fn store_unit(b: &mut KernelBuilder, cfg: &BiasConfig, ptr: Value, unit: Value, values: &[Value]) {
    if !cfg.vector {
        return store_from_f32(b, ptr, unit, values[0]);
    }
    let words: Vec<Value> = if cfg.dtype == ScalarType::F32 {
        values.to_vec()
    } else {
        let mut pack = |v: Value| {
            let h = b.cvt(v, cfg.dtype);
            let bits = b.bitcast(h, ScalarType::U16);
            b.cvt(bits, ScalarType::U32)
        };
        let halves: Vec<Value> = values.iter().map(|v| pack(*v)).collect();
        let sixteen = b.const_u32(16);
        (0..halves.len() / 2)
            .map(|k| {
                // Element 2k is the low half of word k (little-endian).
                let hi = b.shl(halves[2 * k + 1], sixteen);
                b.or(halves[2 * k], hi)
            })
            .collect()
    };
    let four = b.const_u32(4);
    let i = b.mul(unit, four);
    let p = b.ptr_add(ptr, i);
    let v = b.make_vector(&words);
    b.store(p, v);
}

crate::kernel_params! {
    /// The parameters of [`add_bias`], in order.
    pub struct AddBiasParams, AddBiasValues for BiasConfig as cfg {
        x: tensor(cfg.dtype),
        bias: tensor(cfg.dtype),
        out: tensor(cfg.dtype),
        units: scalar(u32),
        rows: scalar(u32),
    }
}

/// Parameters: x `[rows, N]`, bias `[N]`, out `[rows, N]`, units (`N / per_thread`), rows
/// (`u32`). Grid: `(ceil(units / 256), min(rows, 65535))`, block [`BIAS_THREADS`]; block row `y`
/// handles rows `y, y + gridDim.y, ...`, loading its bias unit once.
pub fn add_bias(cfg: &BiasConfig) -> Result<Kernel, VerifyError> {
    let mut b = KernelBuilder::new(cfg.id().replace('.', "_"));
    let AddBiasValues { x, bias, out, units, rows } = AddBiasParams::declare(&mut b, cfg);
    b.launch_bounds(BIAS_THREADS, None);

    // Halves travel as u32 words (two per word), f32 as themselves.
    let cast = |b: &mut KernelBuilder, p: Value| {
        if cfg.vector && cfg.dtype != ScalarType::F32 {
            b.ptr_cast(p, ScalarType::U32)
        } else {
            p
        }
    };
    let (x, bias, out) = (cast(&mut b, x), cast(&mut b, bias), cast(&mut b, out));
    let j = b.global_thread_id_x();
    let in_range = b.lt(j, units);
    b.if_then(in_range, |b| {
        let bias_unit = load_unit(b, cfg, bias, j);
        let first = b.block_id_y();
        let step = b.special(ruda_ir::SpecialReg::NctaidY);
        b.for_each(first, rows, step, |b, r| {
            // Row offsets in units of the (possibly cast) pointee.
            let words_per_unit = if cfg.vector { 4 } else { 1 };
            let r64 = b.cvt(r, ScalarType::U64);
            let units64 = b.cvt(units, ScalarType::U64);
            let len = b.mul(r64, units64);
            let w = b.constant(ruda_ir::Constant::u64(words_per_unit));
            let off = b.mul(len, w);
            let x_row = b.ptr_add(x, off);
            let out_row = b.ptr_add(out, off);
            let xs = load_unit(b, cfg, x_row, j);
            let sums: Vec<Value> = xs.iter().zip(&bias_unit).map(|(a, c)| b.add(*a, *c)).collect();
            store_unit(b, cfg, out_row, j, &sums);
        });
    });
    b.finish()
}

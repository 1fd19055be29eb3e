//! Sample problems: a small, valid launch of every registered kernel configuration, with
//! inputs drawn from a seed. `rudac run` runs them on each engine, and the registry's
//! differential test (ops/tests/differential.rs) compares the engines on them.
//!
//! - Every buffer parameter gets [`BUFFER_BYTES`]: floats uniform in [-2, 2) rounded to the
//!   element type (for `elementwise` and `cast`, every 7th element is a special value:
//!   infinities, zeros, subnormals, extremes); `u32` buffers hold 0, 1, 2, ... unless the family
//!   names their contents (sequence offsets, lengths); `u8`/`i8` buffers 0 or 1 (masks); other
//!   integers random bits.
//! - Scalars by parameter name, per family ([`Family::sample`](crate::family::Family::sample)),
//!   so every access stays in bounds; the
//!   rest take [`default_scalar`] (16 for integers, 0.125 for floats, 1e-5 for `eps`).
//! - The grid is a few blocks per family; the block is the kernel's launch bound (256 without
//!   one), one-dimensional; no dynamic shared memory.
//!
//! The seed changes the random values (floats, masks, random integers), never the indices or
//! the scalars, so every seed gives a valid problem. Seed 0 gives the inputs the differential
//! test has always used. A kernel from a text-IR file (no family) gets the default scalars and
//! one block.

use std::collections::BTreeMap;

use half::{bf16, f16};
use ruda_ir::interp::{KernelArg, LaunchConfig};
use ruda_ir::{Constant, Kernel, ScalarType, Type};

/// Bytes of every buffer argument.
pub const BUFFER_BYTES: usize = 256 << 10;

/// One kernel argument of a sample problem, in parameter order.
#[derive(Clone, Debug, PartialEq)]
pub enum SampleArg {
    /// A global buffer: its element type and little-endian contents.
    Buffer {
        name: String,
        elem: ScalarType,
        bytes: Vec<u8>,
    },
    Scalar {
        name: String,
        value: Constant,
    },
}

impl SampleArg {
    /// The parameter's name.
    pub fn name(&self) -> &str {
        match self {
            SampleArg::Buffer { name, .. } | SampleArg::Scalar { name, .. } => name,
        }
    }
}

/// A launch and its arguments, one per kernel parameter in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Problem {
    pub launch: LaunchConfig,
    pub args: Vec<SampleArg>,
}

impl Problem {
    /// Copies of the buffer arguments' contents, in parameter order.
    pub fn buffers(&self) -> Vec<Vec<u8>> {
        self.args
            .iter()
            .filter_map(|a| match a {
                SampleArg::Buffer { bytes, .. } => Some(bytes.clone()),
                SampleArg::Scalar { .. } => None,
            })
            .collect()
    }

    /// Run `launch` over fresh copies of the buffers (as the interpreter's arguments); the
    /// buffers afterwards, in parameter order.
    pub fn run_with<E>(&self, launch: impl FnOnce(&mut [KernelArg<'_>]) -> Result<(), E>) -> Result<Vec<Vec<u8>>, E> {
        let mut bufs = self.buffers();
        {
            let mut it = bufs.iter_mut();
            let mut args: Vec<KernelArg<'_>> = self
                .args
                .iter()
                .filter_map(|a| match a {
                    SampleArg::Buffer { .. } => it.next().map(|b| KernelArg::Buffer(b.as_mut_slice())),
                    SampleArg::Scalar { value, .. } => Some(KernelArg::Scalar(*value)),
                })
                .collect();
            launch(&mut args)?;
        }
        Ok(bufs)
    }
}

/// FNV-1a 64 over the output buffers (all buffers after the run) concatenated in parameter
/// order: what `rudac run` prints.
pub fn checksum(buffers: &[Vec<u8>]) -> u64 {
    ruda_ir::fnv1a64(&buffers.concat())
}

/// The sample problem of registered configuration `id` of `family` (built as `kernel`),
/// with inputs drawn from `seed`. An error names a family that has no sample problem.
pub fn sample_problem(family: &str, id: &str, kernel: &Kernel, seed: u64) -> Result<Problem, String> {
    Sampler::default().problem(Some((family, id)), kernel, seed)
}

/// The sample problem of a kernel that belongs to no family (a text-IR file): default
/// scalars, one block of the kernel's launch bound.
pub fn file_problem(kernel: &Kernel, seed: u64) -> Result<Problem, String> {
    Sampler::default().problem(None, kernel, seed)
}

/// Makes sample problems, reusing random buffers across configurations (most take the same
/// kinds of buffers, and 256 KiB of random numbers is not free).
#[derive(Default)]
pub struct Sampler {
    /// By element type, parameter position, specials and seed.
    cache: BTreeMap<(ScalarType, usize, bool, u64), Vec<u8>>,
}

impl Sampler {
    /// The problem of registered configuration `(family, id)`, or of a file kernel (`None`).
    pub fn problem(&mut self, registered: Option<(&str, &str)>, kernel: &Kernel, seed: u64) -> Result<Problem, String> {
        let c = match registered {
            Some((family, id)) => {
                crate::registry::family(family).and_then(|f| f.sample(family, id)).ok_or_else(|| {
                    format!("no sample problem for `{id}` of family `{family}`: its family's `Family::sample` has none")
                })?
            }
            None => Case::new([1, 1, 1]),
        };
        let mut args = Vec::with_capacity(kernel.params.len());
        for (i, p) in kernel.params.iter().enumerate() {
            let name = p.name.clone();
            args.push(match kernel.ty(p.value) {
                Type::Ptr(_, elem) => {
                    let rng = || Rng((i as u64).wrapping_add(seed.wrapping_mul(0xd1b5_4a32_d192_ed03)));
                    let bytes = if elem == ScalarType::U32 && c.indices.contains_key(p.name.as_str()) {
                        buffer(elem, &p.name, &c, &mut rng())
                    } else {
                        let key = (elem, i, c.specials, seed);
                        self.cache.entry(key).or_insert_with(|| buffer(elem, &p.name, &c, &mut rng())).clone()
                    };
                    SampleArg::Buffer { name, elem, bytes }
                }
                Type::Scalar(t) => {
                    let value = c
                        .scalars
                        .get(p.name.as_str())
                        .map_or_else(|| default_scalar(&p.name, t), |b| Constant::new(t, *b));
                    SampleArg::Scalar { name, value }
                }
                other => {
                    return Err(format!(
                        "`{}`: parameter `{}` of type {other} has no sample value",
                        kernel.name, p.name
                    ))
                }
            });
        }
        let threads = kernel.launch_bounds.map_or(256, |lb| lb.max_threads);
        Ok(Problem { launch: LaunchConfig { grid: c.grid, block: [threads, 1, 1], dynamic_shared_bytes: 0 }, args })
    }
}

/// SplitMix64: deterministic inputs without `rand`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
    }
}

/// How one configuration is launched: each family's [`Family::sample`](crate::family::Family::sample).
pub struct Case {
    pub grid: [u32; 3],
    /// Scalars by parameter name (bit patterns); others take their defaults (16 for integers,
    /// 0.125 for floats, 1e-5 for `eps`).
    pub scalars: BTreeMap<&'static str, u64>,
    /// Contents of `u32` buffers by parameter name; others hold 0, 1, 2, ...
    pub indices: BTreeMap<&'static str, Vec<u32>>,
    /// Put infinities, zeros, subnormals and extremes among the float inputs.
    pub specials: bool,
}

impl Case {
    /// A launch on `grid` with every scalar at its default.
    pub fn new(grid: [u32; 3]) -> Case {
        Case { grid, scalars: BTreeMap::new(), indices: BTreeMap::new(), specials: false }
    }
}

/// The bit pattern of an `f32` scalar, for [`Case::scalars`].
pub fn f32_bits(x: f32) -> u64 {
    x.to_bits() as u64
}

/// The number after `prefix` in a dotted id (`d128` in `attention_decode.f16.d128`).
pub fn id_number(id: &str, prefix: char) -> Option<u32> {
    id.split('.').find_map(|p| p.strip_prefix(prefix).and_then(|n| n.parse().ok()))
}

/// Scalars no case names: small dimensions, a small positive float.
fn default_scalar(name: &str, ty: ScalarType) -> Constant {
    match ty {
        ScalarType::F32 if name == "eps" => Constant::f32(1e-5),
        ScalarType::F32 => Constant::f32(0.125),
        ScalarType::F64 => Constant::f64(0.125),
        ScalarType::F16 => Constant::new(ty, f16::from_f32(0.125).to_bits() as u64),
        ScalarType::BF16 => Constant::new(ty, bf16::from_f32(0.125).to_bits() as u64),
        ScalarType::Pred => Constant::pred(true),
        other => Constant::new(other, 16),
    }
}

const SPECIALS: [f32; 12] =
    [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-45, 65504.0, 65520.0, 3.0e38, -1e-8, 6.0e-8, 1.0e-5];

/// A buffer of `elem` values.
fn buffer(elem: ScalarType, name: &str, c: &Case, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(BUFFER_BYTES);
    let n = BUFFER_BYTES / elem.bytes().max(1) as usize;
    for i in 0..n {
        let x = if c.specials && i % 7 == 3 { SPECIALS[(i / 7) % SPECIALS.len()] } else { rng.uniform() };
        match elem {
            ScalarType::F32 => out.extend(x.to_le_bytes()),
            ScalarType::F16 => out.extend(f16::from_f32(x).to_le_bytes()),
            ScalarType::BF16 => out.extend(bf16::from_f32(x).to_le_bytes()),
            ScalarType::F64 => out.extend((x as f64).to_le_bytes()),
            ScalarType::U32 => {
                let v = c.indices.get(name).map_or(i as u32, |v| v.get(i).copied().unwrap_or(0));
                out.extend(v.to_le_bytes());
            }
            ScalarType::U8 | ScalarType::I8 => out.push((rng.next() & 1) as u8),
            other => out.extend(&rng.next().to_le_bytes()[..other.bytes() as usize]),
        }
    }
    out
}

//! Helpers of the emulator's tests: run a kernel in the interpreter and its PTX in the
//! emulator on the same inputs, and compare every output buffer bit for bit.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::PathBuf;

use ruda_codegen_ptx::{emit_ptx, Arch, Target};
use ruda_ir::interp::{self, KernelArg, LaunchConfig};
use ruda_ir::{Constant, Kernel, ScalarType, Type};
use ruda_ptx_emu::{run_ptx_with, Arg, Module, Options};

/// A kernel argument's initial value.
#[derive(Clone, Debug)]
pub enum Input {
    Buffer(Vec<u8>),
    Scalar(Constant),
}

fn with_args<T>(inputs: &[Input], f: impl FnOnce(&mut [KernelArg<'_>]) -> T) -> (T, Vec<Vec<u8>>) {
    let mut bufs: Vec<Vec<u8>> = inputs
        .iter()
        .filter_map(|i| match i {
            Input::Buffer(b) => Some(b.clone()),
            Input::Scalar(_) => None,
        })
        .collect();
    let r = {
        let mut it = bufs.iter_mut();
        let mut args: Vec<KernelArg<'_>> = inputs
            .iter()
            .map(|i| match i {
                Input::Buffer(_) => KernelArg::Buffer(it.next().expect("a buffer per input").as_mut_slice()),
                Input::Scalar(c) => KernelArg::Scalar(*c),
            })
            .collect();
        f(&mut args)
    };
    (r, bufs)
}

pub fn interp_outputs(k: &Kernel, launch: &LaunchConfig, inputs: &[Input]) -> Vec<Vec<u8>> {
    let (r, bufs) = with_args(inputs, |args| interp::run_with_threads(k, launch, args, 2));
    r.unwrap_or_else(|e| panic!("interpreter: {e}"));
    bufs
}

pub fn emu_outputs(ptx: &str, entry: &str, launch: &LaunchConfig, inputs: &[Input]) -> Result<Vec<Vec<u8>>, String> {
    let opts = Options { threads: 2, max_loops: 1 << 20 };
    let (r, bufs) = with_args(inputs, |args| run_ptx_with(ptx, entry, launch, args, &opts));
    r.map_err(|e| e.to_string())?;
    Ok(bufs)
}

/// [`emu_outputs`] for an entry of a parsed module.
pub fn emu_module_outputs(
    m: &Module,
    entry: &str,
    launch: &LaunchConfig,
    inputs: &[Input],
) -> Result<Vec<Vec<u8>>, String> {
    let opts = Options { threads: 1, max_loops: 1 << 20 };
    let mut bufs: Vec<Vec<u8>> = inputs
        .iter()
        .filter_map(|i| match i {
            Input::Buffer(b) => Some(b.clone()),
            Input::Scalar(_) => None,
        })
        .collect();
    {
        let mut it = bufs.iter_mut();
        let mut args: Vec<Arg<'_>> = inputs
            .iter()
            .map(|i| match i {
                Input::Buffer(_) => Arg::Buffer(it.next().expect("a buffer per input").as_mut_slice()),
                Input::Scalar(c) => Arg::Scalar(*c),
            })
            .collect();
        m.launch(entry, launch, &mut args, &opts).map_err(|e| e.to_string())?;
    }
    Ok(bufs)
}

/// The element type of each buffer parameter of `k`, in order.
pub fn buffer_elems(k: &Kernel) -> Vec<ScalarType> {
    k.params
        .iter()
        .filter_map(|p| match k.ty(p.value) {
            Type::Ptr(_, e) => Some(e),
            _ => None,
        })
        .collect()
}

/// Where PTX of failing comparisons is written.
pub fn dump_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ptx-emu-mismatch");
    let _ = std::fs::create_dir_all(&d);
    d
}

/// The first element (of `elem` bytes) where `a` and `b` differ.
pub fn first_difference(a: &[u8], b: &[u8], elem: usize) -> Option<usize> {
    if a.len() != b.len() {
        return Some(a.len().min(b.len()) / elem);
    }
    a.chunks(elem).zip(b.chunks(elem)).position(|(x, y)| x != y)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().rev().map(|b| format!("{b:02x}")).collect()
}

/// Emit `k` for each of `arches`, run the PTX in the emulator and `k` in the interpreter, and
/// panic on the first differing output element (naming it and dumping the PTX).
pub fn check(k: &Kernel, launch: &LaunchConfig, inputs: &[Input], arches: &[Arch]) {
    let want = interp_outputs(k, launch, inputs);
    let elems = buffer_elems(k);
    let mut seen = vec![];
    for &arch in arches {
        let ptx = emit_ptx(k, &Target::new(arch)).unwrap_or_else(|e| panic!("emitting `{}` for {arch}: {e}", k.name));
        if seen.contains(&ptx) {
            continue;
        }
        let path = dump_dir().join(format!("{}.{arch}.ptx", k.name));
        let got = emu_outputs(&ptx, &k.name, launch, inputs).unwrap_or_else(|e| {
            let _ = std::fs::write(&path, &ptx);
            panic!("`{}` on {arch}: the emulator failed: {e}\nPTX: {}", k.name, path.display())
        });
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let size = elems[i].bytes().max(1) as usize;
            if let Some(e) = first_difference(g, w, size) {
                let _ = std::fs::write(&path, &ptx);
                let at = e * size;
                panic!(
                    "`{}` on {arch}: buffer {i} ({}) differs first at element {e}: emulator 0x{}, interpreter 0x{}\nPTX: {}",
                    k.name,
                    elems[i],
                    hex(&g[at..(at + size).min(g.len())]),
                    hex(&w[at..(at + size).min(w.len())]),
                    path.display()
                );
            }
        }
        seen.push(ptx);
    }
}

/// SplitMix64.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// `n` values of type `t` (bit patterns): edge cases first, then random ones.
pub fn values(t: ScalarType, n: usize, rng: &mut Rng) -> Vec<u64> {
    use ScalarType::*;
    let mut v: Vec<u64> = match t {
        F32 => [
            0.0f32,
            -0.0,
            1.0,
            -1.0,
            0.5,
            1.5,
            2.5,
            -2.5,
            3.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            f32::MIN,
            f32::MIN_POSITIVE,
            1e-40,
            -1e-45,
            2147483648.0,
            4294967296.0,
            -2147483904.0,
            9.223_372e18,
            1.8446744e19,
            65504.0,
            65520.0,
            -65536.0,
            3.3895314e38,
            1.0e-8,
            255.5,
            127.5,
            -128.5,
            32767.5,
            0.1,
            16777217.0,
        ]
        .iter()
        .map(|x| x.to_bits() as u64)
        .chain([0x7fc0_0000, 0xffc0_0001, 0x7f80_0001, 0x0000_0001, 0x807f_ffff, 0x3f80_0001, 0x4b00_0001])
        .collect(),
        F64 => [
            0.0f64,
            -0.0,
            1.0,
            -1.0,
            0.5,
            2.5,
            -2.5,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::MAX,
            f64::MIN_POSITIVE,
            5e-324,
            2147483648.0,
            -2147483649.0,
            4294967295.5,
            9.223_372_036_854_776e18,
            -9.3e18,
            1.8446744073709552e19,
            65519.99,
            3.4028235677973366e38,
            3.4028236e38,
            1e-46,
            1.401298464324817e-45,
            0.1,
            1e300,
        ]
        .iter()
        .map(|x| x.to_bits())
        .chain([0x7ff8_0000_0000_0000, 0xfff0_0000_0000_0001, 0x3ff0_0000_0000_0001])
        .collect(),
        F16 => vec![
            0, 0x8000, 0x3c00, 0xbc00, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7bff, 0x0001, 0x03ff, 0x0400, 0x3800, 0x4100,
            0x5bff,
        ],
        BF16 => vec![
            0, 0x8000, 0x3f80, 0xbf80, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f7f, 0x0001, 0x007f, 0x0080, 0x4f00, 0xcf00,
            0x4780,
        ],
        Pred => vec![0, 1],
        _ => {
            let bits = t.bits();
            let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
            let min = if t.is_signed_int() { 1u64 << (bits - 1) } else { 0 };
            let max = if t.is_signed_int() { (1u64 << (bits - 1)) - 1 } else { mask };
            [0u64, 1, 2, 3, 7, 31, 32, 33, 63, 64, 65, mask, mask - 1, min, min + 1, max, max - 1, 100, 1000 & mask]
                .iter()
                .map(|x| x & mask)
                .collect()
        }
    };
    v.truncate(n);
    while v.len() < n {
        let r = rng.next();
        let x = match t {
            F32 => {
                if r & 1 == 0 {
                    r >> 32
                } else {
                    (((r >> 8) as i32 % 2000) as f32 / 8.0).to_bits() as u64
                }
            }
            F64 => {
                if r & 1 == 0 {
                    r
                } else {
                    (((r >> 8) as i64 % 4000) as f64 / 16.0).to_bits()
                }
            }
            F16 | BF16 => r & 0xffff,
            Pred => r & 1,
            _ => {
                let bits = t.bits();
                let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
                // Half small numbers, half full-width ones.
                if r & 1 == 0 {
                    ((r >> 1) % 70).wrapping_sub(35) & mask
                } else {
                    (r >> 1) & mask
                }
            }
        };
        v.push(x);
    }
    v
}

/// Little-endian bytes of values of type `t`.
pub fn bytes_of(t: ScalarType, vals: &[u64]) -> Vec<u8> {
    let size = t.bytes() as usize;
    vals.iter().flat_map(|v| v.to_le_bytes()[..size].to_vec()).collect()
}

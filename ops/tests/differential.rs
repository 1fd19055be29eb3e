//! Differential test of the op library: every registered kernel configuration, as the op
//! entry points launch it (after the default pass pipeline), runs in the interpreter and as
//! the PTX backend's PTX in the PTX emulator (for each distinct lowering among its targets);
//! when NVRTC is present, NVRTC's PTX runs in the emulator too. Every output buffer must agree
//! bit for bit.
//!
//! NVRTC takes seconds per attention kernel, so the NVRTC engine covers the first
//! configuration of each family on sm_80 and the last on sm_90, as one module per target,
//! compiled on other CPU threads while the rest runs; `RUDA_DIFF_NVRTC=all` covers every
//! configuration (minutes).
//!
//! Inputs are synthesised from the kernel's parameters: 256 KiB per buffer (random floats in
//! [-2, 2) rounded to the element type, small increasing `u32` indices, random bytes), scalars
//! by parameter name with per-family overrides ([`case`]), grids of a few blocks and the
//! kernel's launch bound as block size. The values need only keep every access in bounds:
//! the point is that all engines compute the same bits. A family without a case fails the
//! test: add one to [`case`].
//!
//! On a mismatch the message names the configuration, the engine, the parameter and the first
//! differing element, and both PTX files are written to `target/tmp/differential/`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use half::{bf16, f16};
use ruda_codegen_ptx::{emit_ptx, Arch, Target};
use ruda_ir::interp::{self, KernelArg, LaunchConfig};
use ruda_ir::{Constant, Kernel, ScalarType, Type};
use ruda_ops::registry::{registry, Registered};
use ruda_ptx_emu::{Arg, Module, Options};

/// Bytes of every buffer argument.
const BUFFER_BYTES: usize = 256 << 10;

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

/// How one configuration is launched.
struct Case {
    grid: [u32; 3],
    /// Scalars by parameter name (bit patterns); others take [`default_scalar`].
    scalars: BTreeMap<&'static str, u64>,
    /// Contents of `u32` buffers by parameter name; others hold 0, 1, 2, ...
    indices: BTreeMap<&'static str, Vec<u32>>,
    /// Put infinities, zeros, subnormals and extremes among the float inputs.
    specials: bool,
}

fn f32_bits(x: f32) -> u64 {
    x.to_bits() as u64
}

/// The number after `prefix` in a dotted id (`d128` in `attention_decode.f16.d128`).
fn id_number(id: &str, prefix: char) -> Option<u32> {
    id.split('.').find_map(|p| p.strip_prefix(prefix).and_then(|n| n.parse().ok()))
}

/// The launch of each family: grids of a few blocks, scalars that keep accesses in bounds.
fn case(r: &Registered) -> Option<Case> {
    let mut c = Case { grid: [3, 1, 1], scalars: BTreeMap::new(), indices: BTreeMap::new(), specials: false };
    let s = &mut c.scalars;
    match r.family {
        "elementwise" | "cast" => {
            s.insert("n", 700);
            c.specials = true;
        }
        "reduce" | "softmax" => {
            s.insert("cols", 300);
        }
        "rms_norm" | "layer_norm" | "rms_norm_residual" => {}
        "gemm_simt" => {
            s.extend([("m", 70), ("n", 65), ("k", 33)]);
            c.grid = [2, 2, 1];
        }
        "attention_prefill" => {
            // Two sequences of 5 and 12 queries over 9 and 21 keys, two heads, group 1,
            // token-major `[tokens, heads, d]` layouts.
            let d = id_number(&r.id, 'd')? as u64;
            c.indices.insert("cu_q", vec![0, 5, 17]);
            c.indices.insert("cu_k", vec![0, 9, 30]);
            // The KV-cache variant's key counts.
            c.indices.insert("seq_lens", vec![9, 21]);
            s.extend([("total_q", 17), ("total_k", 30), ("group", 1)]);
            s.extend([("q_token", 2 * d), ("q_head", d), ("q_batch", 0), ("k_token", 2 * d), ("k_head", d), ("k_batch", 0)]);
            s.extend([("mask_batch", 0), ("mask_head", 0), ("mask_query", 32), ("mask_key", 1)]);
            s.extend([("bias_batch", 0), ("bias_head", 0), ("bias_query", 32), ("bias_key", 1)]);
            c.grid = [1, 2, 2];
        }
        "attention_decode" => {
            if r.id.contains("combine") {
                s.insert("splits", 2);
                c.grid = [4, 1, 1];
            } else {
                c.indices.insert("seq_lens", vec![37, 64]);
                s.extend([("s_max", 64), ("kv_heads", 2), ("group", 2), ("split_len", 32)]);
                c.grid = [2, 2, 2];
            }
        }
        "attention_fallback" => {
            s.extend([("q_len", 5), ("kv_len", 37), ("batch", 1), ("head", 1)]);
            s.extend([("mask_batch", 64), ("mask_head", 0), ("mask_query", 40), ("mask_key", 1)]);
            s.extend([("bias_batch", 64), ("bias_head", 0), ("bias_query", 40), ("bias_key", 1)]);
            c.grid = [5, 1, 1];
        }
        "gemv" => {
            let m_tile = id_number(&r.id, 'm')? as u64;
            let split = r.id.contains("splitk");
            let (k, per_split) = if r.id.contains("scalar") { (77, 96) } else if split { (512, 32) } else { (512, 256) };
            s.extend([("m", m_tile.saturating_sub(1).max(1)), ("n", 10), ("k", k), ("chunks_per_split", per_split)]);
            c.grid = [3, if split { 2 } else { 1 }, 1];
        }
        "gemv_reduce" => {
            s.extend([("len", 300), ("splits", 3)]);
            c.grid = [2, 1, 1];
        }
        "rope" | "rope_kv_cache" => {
            s.extend([("heads", 2), ("n_positions", 64), ("batch", 2), ("max_seq", 64)]);
        }
        "swiglu" => {
            s.extend([("inter", 300), ("rows", 3)]);
            c.grid = [2, 3, 1];
        }
        "embedding" => {
            s.extend([("vocab", 50), ("hidden", 96)]);
        }
        "argmax" => {
            let partial = r.id.contains("partial");
            s.extend([("cols", 700), ("cols_per_split", if partial { 256 } else { 700 })]);
            c.grid = [3, if partial { 3 } else { 1 }, 1];
        }
        "argmax_reduce" => {
            s.insert("splits", 3);
        }
        "sampling" => {
            s.extend([("cols", 700), ("scale", f32_bits(1.4)), ("top_k", 50), ("top_p", f32_bits(0.9)), ("seed", 1234)]);
        }
        _ => return None,
    }
    Some(c)
}

/// Scalars no case names: small dimensions, a small positive float.
fn default_scalar(name: &str, ty: ScalarType) -> Constant {
    match ty {
        ScalarType::F32 if name == "eps" => Constant::f32(1e-5),
        ScalarType::F32 => Constant::f32(0.125),
        ScalarType::F64 => Constant::f64(0.125),
        other => Constant::new(other, 16),
    }
}

const SPECIALS: [f32; 12] = [0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, 1e-40, -1e-45, 65504.0, 65520.0, 3.0e38, -1e-8, 6.0e-8, 1.0e-5];

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

enum Input {
    Buffer { name: String, elem: ScalarType, bytes: Vec<u8> },
    Scalar(Constant),
}

/// Buffers already made, by element type, parameter position and whether they hold specials
/// (most configurations take the same kinds of buffers; making 256 KiB of random numbers is
/// not free).
type BufferCache = BTreeMap<(ScalarType, usize, bool), Vec<u8>>;

fn inputs(k: &Kernel, c: &Case, cache: &mut BufferCache) -> Vec<Input> {
    k.params
        .iter()
        .enumerate()
        .map(|(i, p)| match k.ty(p.value) {
            Type::Ptr(_, elem) => {
                let bytes = if elem == ScalarType::U32 && c.indices.contains_key(p.name.as_str()) {
                    buffer(elem, &p.name, c, &mut Rng(i as u64))
                } else {
                    let key = (elem, i, c.specials);
                    cache.entry(key).or_insert_with(|| buffer(elem, &p.name, c, &mut Rng(i as u64))).clone()
                };
                Input::Buffer { name: p.name.clone(), elem, bytes }
            }
            Type::Scalar(t) => Input::Scalar(match c.scalars.get(p.name.as_str()) {
                Some(bits) => Constant::new(t, *bits),
                None => default_scalar(&p.name, t),
            }),
            other => panic!("`{}`: parameter `{}` of type {other}", k.name, p.name),
        })
        .collect()
}

fn launch_of(k: &Kernel, c: &Case) -> LaunchConfig {
    let threads = k.launch_bounds.map_or(256, |lb| lb.max_threads);
    LaunchConfig { grid: c.grid, block: [threads, 1, 1], dynamic_shared_bytes: 0 }
}

fn buffers(inputs: &[Input]) -> Vec<Vec<u8>> {
    inputs
        .iter()
        .filter_map(|i| match i {
            Input::Buffer { bytes, .. } => Some(bytes.clone()),
            Input::Scalar(_) => None,
        })
        .collect()
}

fn run_interp(k: &Kernel, launch: &LaunchConfig, inputs: &[Input]) -> Result<Vec<Vec<u8>>, String> {
    let mut bufs = buffers(inputs);
    {
        let mut it = bufs.iter_mut();
        let mut args: Vec<KernelArg<'_>> = inputs
            .iter()
            .map(|i| match i {
                Input::Buffer { .. } => KernelArg::Buffer(it.next().expect("one buffer per input").as_mut_slice()),
                Input::Scalar(c) => KernelArg::Scalar(*c),
            })
            .collect();
        interp::run_with_threads(k, launch, &mut args, 1).map_err(|e| e.to_string())?;
    }
    Ok(bufs)
}

fn run_emu(module: &Module, entry: &str, launch: &LaunchConfig, inputs: &[Input]) -> Result<Vec<Vec<u8>>, String> {
    let mut bufs = buffers(inputs);
    {
        let mut it = bufs.iter_mut();
        let mut args: Vec<Arg<'_>> = inputs
            .iter()
            .map(|i| match i {
                Input::Buffer { .. } => Arg::Buffer(it.next().expect("one buffer per input").as_mut_slice()),
                Input::Scalar(c) => Arg::Scalar(*c),
            })
            .collect();
        let opts = Options { threads: 1, max_loops: 1 << 24 };
        module.launch(entry, launch, &mut args, &opts).map_err(|e| e.to_string())?;
    }
    Ok(bufs)
}

fn dump_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("differential");
    let _ = std::fs::create_dir_all(&d);
    d
}

/// The PTX without its `.version`/`.target` lines (identical bodies need one run).
fn body(ptx: &str) -> String {
    ptx.lines().filter(|l| !l.starts_with(".version") && !l.starts_with(".target")).collect::<Vec<_>>().join("\n")
}

/// The first element where an engine's buffers differ from the interpreter's, as a message.
fn compare(inputs: &[Input], got: &[Vec<u8>], want: &[Vec<u8>]) -> Option<String> {
    let names = inputs.iter().filter_map(|i| match i {
        Input::Buffer { name, elem, .. } => Some((name, *elem)),
        Input::Scalar(_) => None,
    });
    for ((name, elem), (g, w)) in names.zip(got.iter().zip(want)) {
        let size = elem.bytes().max(1) as usize;
        if let Some(e) = g.chunks(size).zip(w.chunks(size)).position(|(x, y)| x != y) {
            let hex = |b: &[u8]| b.iter().rev().map(|x| format!("{x:02x}")).collect::<String>();
            let at = e * size;
            return Some(format!(
                "`{name}` ({elem}) differs first at element {e}: 0x{} here, 0x{} in the interpreter",
                hex(&g[at..at + size]),
                hex(&w[at..at + size])
            ));
        }
    }
    None
}

struct Config {
    id: String,
    family: &'static str,
    kernel: Kernel,
    launch: LaunchConfig,
    inputs: Vec<Input>,
    targets: Vec<Arch>,
    /// The interpreter's output buffers.
    want: Vec<Vec<u8>>,
}

/// The configurations the NVRTC engine covers on `arch` (see the module's documentation).
fn nvrtc_subset(configs: &[Config], arch: Arch) -> Vec<&Config> {
    let all = std::env::var("RUDA_DIFF_NVRTC").is_ok_and(|v| v == "all");
    let here = configs.iter().filter(|c| c.targets.contains(&arch));
    if all {
        return here.collect();
    }
    let mut chosen: BTreeMap<&str, &Config> = BTreeMap::new();
    for c in here {
        if arch == Arch::Sm80 {
            chosen.entry(c.family).or_insert(c);
        } else {
            chosen.insert(c.family, c);
        }
    }
    chosen.into_values().collect()
}

/// NVRTC's PTX of `configs` for `arch`, compiled as one module.
fn nvrtc_module(configs: &[&Config], arch: Arch) -> Option<(String, Module)> {
    let nvrtc = ruda_codegen_nvrtc::nvrtc_or_skip("the differential test's NVRTC engine").unwrap_or_else(|e| panic!("{e}"))?;
    let kernels: Vec<&Kernel> = configs.iter().map(|c| &c.kernel).collect();
    let ptx = ruda_codegen_nvrtc::compile_module_with(&nvrtc, &kernels, &Target::new(arch))
        .unwrap_or_else(|e| panic!("NVRTC for {arch}: {e}"));
    let module = Module::parse(&ptx).unwrap_or_else(|e| {
        let path = dump_dir().join(format!("registry.nvrtc.{arch}.ptx"));
        let _ = std::fs::write(&path, &ptx);
        panic!("NVRTC's PTX for {arch} ({}): {e}", path.display())
    });
    Some((ptx, module))
}

#[test]
fn every_registered_kernel_agrees_across_engines() {
    let mut missing = vec![];
    let mut cache = BufferCache::new();
    let mut pending = vec![];
    for r in registry() {
        let Some(c) = case(&r) else {
            missing.push(format!("{} ({})", r.id, r.family));
            continue;
        };
        let mut kernel = r.build().unwrap_or_else(|e| panic!("`{}` does not verify: {e}", r.id));
        ruda_ir::passes::optimize(&mut kernel).unwrap_or_else(|e| panic!("`{}`: the pass pipeline fails: {e}", r.id));
        let launch = launch_of(&kernel, &c);
        let inputs = inputs(&kernel, &c, &mut cache);
        pending.push((r, kernel, launch, inputs));
    }
    assert!(missing.is_empty(), "no differential case for {missing:?}: add one to `case` in ops/tests/differential.rs");
    let configs: Vec<Config> = pending
        .into_iter()
        .map(|(r, kernel, launch, inputs)| {
            let want = run_interp(&kernel, &launch, &inputs).unwrap_or_else(|e| panic!("`{}`: the interpreter failed: {e}", r.id));
            Config { id: r.id.clone(), family: r.family, kernel, launch, inputs, targets: r.targets.clone(), want }
        })
        .collect();
    // NVRTC compiles on a second thread while the direct PTX runs.
    let subsets = [Arch::Sm80, Arch::Sm90].map(|arch| (arch, nvrtc_subset(&configs, arch)));
    let nvrtc = std::thread::scope(|s| {
        let h = s.spawn(|| {
            std::thread::scope(|t| {
                let sm90 = t.spawn(|| nvrtc_module(&subsets[1].1, subsets[1].0));
                let sm80 = nvrtc_module(&subsets[0].1, subsets[0].0);
                [sm80, sm90.join().expect("the sm_90 NVRTC thread")]
            })
        });
        let mut failures = vec![];
        let mut runs = 0;
        for c in &configs {
            match check_direct(c) {
                Ok(n) => runs += n,
                Err(f) => failures.push(f),
            }
        }
        println!("{} configurations: interpreter and {runs} direct PTX runs agree", configs.len());
        assert!(failures.is_empty(), "{} configurations disagree:\n{}", failures.len(), failures.join("\n"));
        h.join().expect("the NVRTC thread")
    });
    let mut failures = vec![];
    for ((arch, subset), nvrtc) in subsets.iter().zip(&nvrtc) {
        let arch = *arch;
        let Some((ptx, module)) = nvrtc else { continue };
        let path = dump_dir().join(format!("registry.nvrtc.{arch}.ptx"));
        let before = failures.len();
        for c in subset {
            let verdict = match run_emu(module, &c.kernel.name, &c.launch, &c.inputs) {
                Err(e) => Some(format!("the emulator failed: {e}")),
                Ok(got) => compare(&c.inputs, &got, &c.want),
            };
            if let Some(v) = verdict {
                let _ = std::fs::write(&path, ptx);
                let direct = dump_direct(c, arch);
                failures.push(format!("`{}` through NVRTC for {arch}: {v}\n  PTX: {} and {}", c.id, path.display(), direct));
            }
        }
        println!("NVRTC for {arch}: {} of {} configurations agree", subset.len() - (failures.len() - before), subset.len());
    }
    assert!(failures.is_empty(), "{} configurations disagree:\n{}", failures.len(), failures.join("\n"));
}

/// Write the direct PTX of `c` for `arch`; its path.
fn dump_direct(c: &Config, arch: Arch) -> String {
    let path = dump_dir().join(format!("{}.direct.{arch}.ptx", c.id));
    if let Ok(ptx) = emit_ptx(&c.kernel, &Target::new(arch)) {
        let _ = std::fs::write(&path, ptx);
    }
    path.display().to_string()
}

/// Write NVRTC's PTX of `c` for `arch` when NVRTC is present; its path.
fn dump_nvrtc(c: &Config, arch: Arch) -> String {
    let path = dump_dir().join(format!("{}.nvrtc.{arch}.ptx", c.id));
    match ruda_codegen_nvrtc::compile_to_ptx(&c.kernel, &Target::new(arch)) {
        Ok(ptx) => {
            let _ = std::fs::write(&path, ptx);
            path.display().to_string()
        }
        Err(e) => format!("(no NVRTC PTX: {e})"),
    }
}

/// The interpreter against the direct PTX of every distinct lowering among the targets; how
/// many lowerings ran.
fn check_direct(c: &Config) -> Result<usize, String> {
    let mut seen = vec![];
    for &arch in &c.targets {
        let ptx = emit_ptx(&c.kernel, &Target::new(arch)).map_err(|e| format!("`{}` on {arch}: {e}", c.id))?;
        let b = body(&ptx);
        if seen.contains(&b) {
            continue;
        }
        seen.push(b);
        let module = Module::parse(&ptx).map_err(|e| format!("`{}` on {arch}: {e}", c.id))?;
        let verdict = match run_emu(&module, &c.kernel.name, &c.launch, &c.inputs) {
            Err(e) => Some(format!("the emulator failed: {e}")),
            Ok(got) => compare(&c.inputs, &got, &c.want),
        };
        if let Some(v) = verdict {
            let (direct, nvrtc) = (dump_direct(c, arch), dump_nvrtc(c, arch));
            return Err(format!("`{}` through the PTX backend for {arch}: {v}\n  PTX: {direct} and {nvrtc}", c.id));
        }
    }
    Ok(seen.len())
}

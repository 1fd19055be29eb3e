//! Differential test of the op library: every registered kernel configuration, as the op
//! entry points launch it (after the default pass pipeline), runs in the interpreter and as
//! the PTX backend's PTX in the PTX emulator (for each distinct lowering among its targets);
//! when NVRTC is present, NVRTC's PTX runs in the emulator too. Every output buffer must agree
//! bit for bit.
//!
//! NVRTC takes seconds per attention kernel, so the NVRTC engine covers the first
//! configuration of each family on sm_80 and the last on sm_90, compiled on other CPU threads
//! while the rest runs; `RUDA_DIFF_NVRTC=all` covers every configuration (minutes). Each
//! configuration is its own module, compiled as the runtime compiles it, so that with
//! `RUDA_NVRTC_CACHE` set (`scripts/test.sh` sets it) `rudac check --compiler nvrtc` reuses
//! this test's PTX instead of compiling everything again.
//!
//! Inputs are each configuration's sample problem with seed 0 (`ruda_ops::sample`, the one
//! `rudac run` uses): 256 KiB per buffer, scalars per family that keep every access in bounds,
//! grids of a few blocks. The values need only keep every access in bounds: the point is that
//! all engines compute the same bits. A family without a sample problem fails the test by
//! name: add one to its family's `Family::sample`.
//!
//! Every sample problem must change some buffer, so agreement is never about untouched inputs.
//!
//! On a mismatch the message names the configuration, the engine, the parameter and the first
//! differing element, and both PTX files are written to `target/tmp/differential/`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ruda_codegen_ptx::{emit_ptx, Arch, Target};
use ruda_ir::interp::{self, KernelArg};
use ruda_ir::Kernel;
use ruda_ops::registry::registry;
use ruda_ops::sample::{Problem, SampleArg, Sampler};
use ruda_ptx_emu::{Arg, Module, Options};

/// The seed of every configuration's inputs.
const SEED: u64 = 0;

fn run_interp(k: &Kernel, p: &Problem) -> Result<Vec<Vec<u8>>, String> {
    p.run_with(|args| interp::run_with_threads(k, &p.launch, args, 1).map_err(|e| e.to_string()))
}

fn run_emu(module: &Module, entry: &str, p: &Problem) -> Result<Vec<Vec<u8>>, String> {
    p.run_with(|args| {
        let mut args: Vec<Arg<'_>> = args
            .iter_mut()
            .map(|a| match a {
                KernelArg::Buffer(b) => Arg::Buffer(b),
                KernelArg::Scalar(c) => Arg::Scalar(*c),
            })
            .collect();
        let opts = Options { threads: 1, max_loops: 1 << 24 };
        module.launch(entry, &p.launch, &mut args, &opts).map_err(|e| e.to_string())
    })
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
fn compare(p: &Problem, got: &[Vec<u8>], want: &[Vec<u8>]) -> Option<String> {
    let names = p.args.iter().filter_map(|a| match a {
        SampleArg::Buffer { name, elem, .. } => Some((name, *elem)),
        SampleArg::Scalar { .. } => None,
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
    problem: Problem,
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

/// NVRTC's PTX of each of `configs` for `arch`, parsed; `None` without NVRTC.
fn nvrtc_modules(configs: &[&Config], arch: Arch) -> Option<Vec<Module>> {
    ruda_codegen_nvrtc::nvrtc_or_skip("the differential test's NVRTC engine").unwrap_or_else(|e| panic!("{e}"))?;
    let parsed = configs.iter().map(|c| {
        let ptx = ruda_codegen_nvrtc::compile_to_ptx(&c.kernel, &Target::new(arch))
            .unwrap_or_else(|e| panic!("`{}`: NVRTC for {arch}: {e}", c.id));
        Module::parse(&ptx).unwrap_or_else(|e| {
            let path = dump_dir().join(format!("{}.nvrtc.{arch}.ptx", c.id));
            let _ = std::fs::write(&path, &ptx);
            panic!("`{}`: NVRTC's PTX for {arch} ({}): {e}", c.id, path.display())
        })
    });
    Some(parsed.collect())
}

#[test]
fn every_registered_kernel_agrees_across_engines() {
    let mut missing = vec![];
    let mut sampler = Sampler::default();
    let mut pending = vec![];
    for r in registry() {
        let mut kernel = r.build().unwrap_or_else(|e| panic!("`{}` does not verify: {e}", r.id));
        let problem = match sampler.problem(Some((r.family, &r.id)), &kernel, SEED) {
            Ok(p) => p,
            Err(e) => {
                missing.push(e);
                continue;
            }
        };
        ruda_ir::passes::optimize(&mut kernel).unwrap_or_else(|e| panic!("`{}`: the pass pipeline fails: {e}", r.id));
        pending.push((r, kernel, problem));
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    let configs: Vec<Config> = pending
        .into_iter()
        .map(|(r, kernel, problem)| {
            let want =
                run_interp(&kernel, &problem).unwrap_or_else(|e| panic!("`{}`: the interpreter failed: {e}", r.id));
            Config { id: r.id.clone(), family: r.family, kernel, problem, targets: r.targets.clone(), want }
        })
        .collect();
    // Engines that agree on buffers nobody wrote prove nothing: every sample problem must change
    // some buffer (a kernel that computes nothing, or a problem whose grid or lengths select no
    // work, fails here by name).
    let idle: Vec<&str> = configs.iter().filter(|c| c.want == c.problem.buffers()).map(|c| c.id.as_str()).collect();
    assert!(idle.is_empty(), "{} sample problems change no buffer: {}", idle.len(), idle.join(", "));
    // NVRTC compiles on a second thread while the direct PTX runs.
    let subsets = [Arch::Sm80, Arch::Sm90].map(|arch| (arch, nvrtc_subset(&configs, arch)));
    let nvrtc = std::thread::scope(|s| {
        let h = s.spawn(|| {
            std::thread::scope(|t| {
                let sm90 = t.spawn(|| nvrtc_modules(&subsets[1].1, subsets[1].0));
                let sm80 = nvrtc_modules(&subsets[0].1, subsets[0].0);
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
        let Some(modules) = nvrtc else { continue };
        let before = failures.len();
        for (c, module) in subset.iter().zip(modules) {
            let verdict = match run_emu(module, &c.kernel.name, &c.problem) {
                Err(e) => Some(format!("the emulator failed: {e}")),
                Ok(got) => compare(&c.problem, &got, &c.want),
            };
            if let Some(v) = verdict {
                let (direct, nvrtc) = (dump_direct(c, arch), dump_nvrtc(c, arch));
                failures.push(format!("`{}` through NVRTC for {arch}: {v}\n  PTX: {direct} and {nvrtc}", c.id));
            }
        }
        println!(
            "NVRTC for {arch}: {} of {} configurations agree",
            subset.len() - (failures.len() - before),
            subset.len()
        );
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
        let verdict = match run_emu(&module, &c.kernel.name, &c.problem) {
            Err(e) => Some(format!("the emulator failed: {e}")),
            Ok(got) => compare(&c.problem, &got, &c.want),
        };
        if let Some(v) = verdict {
            let (direct, nvrtc) = (dump_direct(c, arch), dump_nvrtc(c, arch));
            return Err(format!("`{}` through the PTX backend for {arch}: {v}\n  PTX: {direct} and {nvrtc}", c.id));
        }
    }
    Ok(seen.len())
}

//! `rudac bench-compile`: how long each stage of compiling the op library takes, through both
//! backends, in one process. The direct path is IR build + passes + PTX emission; the NVRTC path
//! is the same IR build and passes, C++ emission and NVRTC. `ptxas` (the step both paths share
//! on the way to machine code) is timed on the direct path's PTX.

use std::io::Write;
use std::time::{Duration, Instant};

use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};

use ruda_ops::registry::registry;

/// Stage timings of one configuration.
#[derive(Clone, Copy, Debug, Default)]
struct Stages {
    build: Duration,
    passes: Duration,
    emit_ptx: Duration,
    nvrtc: Duration,
    ptxas: Duration,
}

impl Stages {
    fn direct(&self) -> Duration {
        self.build + self.passes + self.emit_ptx
    }
    fn via_nvrtc(&self) -> Duration {
        self.build + self.passes + self.nvrtc
    }
    fn add(&mut self, o: &Stages) {
        self.build += o.build;
        self.passes += o.passes;
        self.emit_ptx += o.emit_ptx;
        self.nvrtc += o.nvrtc;
        self.ptxas += o.ptxas;
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let t = Instant::now();
    let r = f();
    (r, t.elapsed())
}

/// Compile every registered configuration for `arch` through both backends and print a table
/// per kernel and the totals, with the ratio of the NVRTC path to the direct path. Needs NVRTC
/// and `ptxas`; returns an error naming what is missing.
pub fn bench_compile(arch: Arch, out: &mut dyn Write) -> Result<bool, String> {
    let io = |e: std::io::Error| e.to_string();
    let nvrtc = ruda_codegen_nvrtc::find_nvrtc().map_err(|e| e.to_string())?;
    let ptxas_path = ptxas::find_ptxas()
        .ok_or("ptxas not found: set RUDA_PTXAS or run scripts/install-cuda-tools.sh".to_string())?;
    let (major, minor) = ruda_codegen_nvrtc::nvrtc_version().map_err(|e| e.to_string())?;
    let target = Target::new(arch);
    writeln!(out, "target {arch}; NVRTC {major}.{minor}; ptxas {}", ptxas_path.display()).map_err(io)?;
    writeln!(
        out,
        "{:<30} {:>8} {:>8} {:>8} {:>9} {:>8} {:>8}",
        "id", "build_ms", "pass_ms", "ptx_ms", "nvrtc_ms", "ptxas_ms", "nvrtc/direct"
    )
    .map_err(io)?;
    let mut total = Stages::default();
    let reg = registry();
    for r in reg.iter().filter(|r| r.targets.contains(&arch)) {
        let mut s = Stages::default();
        let (kernel, t) = timed(|| r.build());
        s.build = t;
        let mut kernel = kernel.map_err(|e| e.to_string())?;
        let (optimized, t) = timed(|| ruda_ir::passes::optimize(&mut kernel));
        s.passes = t;
        optimized.map_err(|e| e.to_string())?;
        let (ptx, t) = timed(|| emit_ptx(&kernel, &target));
        s.emit_ptx = t;
        let ptx = ptx.map_err(|e| format!("{}: {e}", r.id))?;
        let (via_nvrtc, t) =
            timed(|| ruda_codegen_nvrtc::compile_module_with(&nvrtc, &[&kernel], &target).map_err(|e| e.to_string()));
        s.nvrtc = t;
        via_nvrtc.map_err(|e| format!("{}: {e}", r.id))?;
        let (assembled, t) = timed(|| ptxas::assemble_with(&ptxas_path, &ptx, arch));
        s.ptxas = t;
        assembled.map_err(|e| format!("{}: {e}", r.id))?;
        writeln!(
            out,
            "{:<30} {:>8.3} {:>8.3} {:>8.3} {:>9.2} {:>8.2} {:>11.1}x",
            r.id,
            ms(s.build),
            ms(s.passes),
            ms(s.emit_ptx),
            ms(s.nvrtc),
            ms(s.ptxas),
            s.via_nvrtc().as_secs_f64() / s.direct().as_secs_f64()
        )
        .map_err(io)?;
        total.add(&s);
    }
    writeln!(
        out,
        "{:<30} {:>8.1} {:>8.1} {:>8.1} {:>9.1} {:>8.1} {:>11.1}x",
        "TOTAL",
        ms(total.build),
        ms(total.passes),
        ms(total.emit_ptx),
        ms(total.nvrtc),
        ms(total.ptxas),
        total.via_nvrtc().as_secs_f64() / total.direct().as_secs_f64()
    )
    .map_err(io)?;
    writeln!(
        out,
        "direct path (build + passes + PTX): {:.1} ms; NVRTC path (build + passes + C++ + NVRTC): {:.1} ms; ratio {:.1}x",
        ms(total.direct()),
        ms(total.via_nvrtc()),
        total.via_nvrtc().as_secs_f64() / total.direct().as_secs_f64()
    )
    .map_err(io)?;
    Ok(true)
}

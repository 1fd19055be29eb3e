//! `rudac profile`: what a GPU profiler would show about one kernel, measured on the CPU.
//!
//! The kernel runs (after the default passes) on its sample problem in the IR interpreter with
//! counters on ([`ruda_ir::interp::run_profiled`]): memory requests, sectors and shared-memory
//! wavefronts as Nsight Compute counts them, the instruction mix and the flops. Its PTX goes
//! through `ptxas -v` (registers, spills, static shared memory), which gives the occupancy for
//! the target ([`ruda_ops::perf::occupancy`]), and through `nvdisasm` (SASS opcode counts).
//! The roofline ([`ruda_ops::perf::roofline`]) of the sample problem on the named GPU closes
//! the report. Every time here is an estimate from counts and peaks, never a measurement.
//!
//! Without `ptxas` or `nvdisasm` the keys that need them are `null` and a notice says why.

use std::collections::BTreeMap;
use std::io::Write;

use ruda_codegen_ptx::{ptxas, sass, Arch};
use ruda_ir::interp::{run_profiled, Counters, LaunchConfig, Profile};
use ruda_ops::perf::gpu::{gpu, Gpu};
use ruda_ops::perf::occupancy::{occupancy, Limit, Occupancy};
use ruda_ops::perf::roofline::{roofline, Bound, Roofline, Units};
use ruda_runtime::Compiler;
use serde_json::{json, Map, Value};

use crate::driver::{compile, prepare, resolve_compiler, Source};

/// The arguments of `rudac profile`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProfileArgs {
    pub source: Source,
    pub seed: u64,
    /// `--input NAME=FILE|VALUE`, as for `rudac run`.
    pub inputs: Vec<(String, std::ffi::OsString)>,
    /// `--gpu` (default h200).
    pub gpu: String,
    /// `--target` (default: the GPU's architecture).
    pub arch: Option<Arch>,
    pub compiler: Option<String>,
    pub json: bool,
}

/// What `ptxas -v` reported for the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resources {
    pub registers: u32,
    pub spill_bytes: u32,
    /// Static shared memory (the launch's dynamic shared memory is apart).
    pub static_shared_bytes: u32,
}

/// One kernel's profile.
pub struct KernelProfile {
    pub kernel: String,
    pub gpu: &'static Gpu,
    pub arch: Arch,
    pub compiler: Compiler,
    pub launch: LaunchConfig,
    pub counts: Profile,
    pub resources: Option<Resources>,
    pub occupancy: Option<Occupancy>,
    pub sass: Option<BTreeMap<String, u64>>,
    pub roofline: Roofline,
    /// Why a part is missing (no ptxas, no nvdisasm, a block that fits no SM).
    pub notices: Vec<String>,
}

/// Profile the kernel `args` names.
pub fn profile(args: &ProfileArgs) -> Result<KernelProfile, String> {
    let gpu = gpu(&args.gpu).map_err(|e| format!("--gpu: {e}"))?;
    let arch = args.arch.unwrap_or(gpu.arch);
    let compiler = resolve_compiler(&args.compiler)?;
    let (kernel, problem) = prepare(&args.source, args.seed, &args.inputs)?;
    let name = match &args.source {
        Source::Id(id) => id.clone(),
        Source::File(_) => kernel.name.clone(),
    };
    let threads = ruda_ir::interp::threads_from_env()?;
    let mut counts = None;
    problem.run_with(|a| {
        counts = Some(run_profiled(&kernel, &problem.launch, a, threads).map_err(|e| format!("the interpreter: {e}"))?);
        Ok::<_, String>(())
    })?;
    let counts = counts.ok_or("the interpreter returned no profile")?;
    let mut notices = Vec::new();
    let ptx = compile(&kernel, arch, compiler)?;
    let (resources, cubin) = match ptxas::assemble_cubin(&ptx, arch) {
        Ok((report, cubin)) => {
            let entry =
                report.entry(&kernel.name).ok_or_else(|| format!("ptxas reported no entry `{}`", kernel.name))?;
            let resources = Resources {
                registers: entry.registers,
                spill_bytes: entry.spill_store_bytes + entry.spill_load_bytes,
                static_shared_bytes: entry.shared_bytes,
            };
            (Some(resources), Some(cubin))
        }
        Err(ptxas::PtxasError::NotFound) => {
            notices.push(format!(
                "{}: registers, spills, shared memory, occupancy and SASS are null",
                ptxas::PtxasError::NotFound
            ));
            (None, None)
        }
        Err(e) => return Err(e.to_string()),
    };
    let block_threads = problem.launch.block.iter().product::<u32>();
    let occupancy = match &resources {
        Some(r) => {
            let shared = r.static_shared_bytes + problem.launch.dynamic_shared_bytes;
            match occupancy(arch, block_threads, r.registers, shared) {
                Ok(o) => Some(o),
                Err(e) => {
                    notices.push(format!("occupancy: {e}"));
                    None
                }
            }
        }
        None => None,
    };
    let sass = match cubin {
        Some(cubin) => match sass::disassemble(&cubin) {
            Ok(text) => Some(sass::opcode_counts(&text)),
            Err(e) => {
                notices.push(format!("SASS is null: {e}"));
                None
            }
        },
        None => None,
    };
    let units = if counts.totals.instructions.mma > 0 { Units::TensorCore } else { Units::Fp32 };
    let roofline = roofline(gpu, counts.dram_bytes_min, counts.totals.flops, units);
    Ok(KernelProfile {
        kernel: name,
        gpu,
        arch,
        compiler,
        launch: problem.launch,
        counts,
        resources,
        occupancy,
        sass,
        roofline,
        notices,
    })
}

fn limit_name(limit: &Limit) -> &'static str {
    match limit {
        Limit::Registers => "registers",
        Limit::Shared => "shared",
        Limit::Warps => "warps",
        Limit::Blocks => "blocks",
    }
}

fn bound_name(bound: &Bound) -> &'static str {
    match bound {
        Bound::Memory => "memory",
        Bound::Compute => "compute",
    }
}

/// The instruction classes of a mix, and its total.
fn mix(c: &Counters) -> Vec<(&'static str, u64)> {
    let mut classes = c.instructions.fields();
    classes.push(("total", c.instructions.total()));
    classes
}

/// Counters as a JSON object: every scalar counter and the instruction mix.
fn counters_json(c: &Counters) -> Map<String, Value> {
    let mut o = Map::new();
    for (name, value) in c.fields() {
        o.insert(name.into(), json!(value));
    }
    let classes: Map<String, Value> = mix(c).into_iter().map(|(k, v)| (k.to_string(), json!(v))).collect();
    o.insert("instructions".into(), Value::Object(classes));
    o
}

/// The JSON form: the contract's top-level keys (counts as integers), then the context.
pub fn to_json(p: &KernelProfile) -> Value {
    let mut o = Map::new();
    o.insert("kernel".into(), json!(p.kernel));
    o.extend(counters_json(&p.counts.totals));
    o.insert("dram_bytes_min".into(), json!(p.counts.dram_bytes_min));
    o.insert("registers".into(), json!(p.resources.as_ref().map(|r| r.registers)));
    o.insert("spill_bytes".into(), json!(p.resources.as_ref().map(|r| r.spill_bytes)));
    o.insert(
        "shared_bytes".into(),
        json!(p.resources.as_ref().map(|r| r.static_shared_bytes + p.launch.dynamic_shared_bytes)),
    );
    o.insert("occupancy_warps".into(), json!(p.occupancy.as_ref().map(|o| o.warps_per_sm)));
    o.insert("occupancy_limit".into(), json!(p.occupancy.as_ref().map(|o| limit_name(&o.limit))));
    o.insert("roofline_us".into(), json!(p.roofline.roofline_us));
    o.insert("arithmetic_intensity".into(), json!(p.roofline.intensity));
    o.insert("bound".into(), json!(bound_name(&p.roofline.bound)));
    o.insert("sass".into(), json!(p.sass));
    let sites: Vec<Value> = p
        .counts
        .sites
        .iter()
        .map(|s| {
            let mut site = Map::new();
            site.insert("inst".into(), json!(s.inst.index()));
            site.insert("op".into(), json!(s.op));
            site.insert("loc".into(), json!(s.loc.as_ref().map(|l| l.to_string())));
            site.extend(counters_json(&s.counters));
            Value::Object(site)
        })
        .collect();
    o.insert("sites".into(), Value::Array(sites));
    o.insert("gpu".into(), json!(p.gpu.name));
    o.insert("target".into(), json!(p.arch.name()));
    o.insert("compiler".into(), json!(p.compiler.name()));
    o.insert(
        "launch".into(),
        json!({"grid": p.launch.grid, "block": p.launch.block, "dynamic_shared_bytes": p.launch.dynamic_shared_bytes}),
    );
    o.insert("occupancy_blocks".into(), json!(p.occupancy.as_ref().map(|o| o.blocks_per_sm)));
    o.insert("estimate".into(), json!(true));
    o.insert("notices".into(), json!(p.notices));
    Value::Object(o)
}

/// The readable report.
pub fn write_table(p: &KernelProfile, out: &mut dyn Write) -> std::io::Result<()> {
    let t = &p.counts.totals;
    let l = &p.launch;
    writeln!(
        out,
        "kernel {}: sample problem grid {:?} block {:?} ({} B dynamic shared) in the interpreter; {} via {} for {}",
        p.kernel,
        l.grid,
        l.block,
        l.dynamic_shared_bytes,
        p.gpu.label,
        p.compiler.name(),
        p.arch.name()
    )?;
    writeln!(out, "\nmemory               requests    sectors  wavefronts  conflicts")?;
    let rows = [
        ("global loads", t.global_load_requests, Some(t.global_load_sectors), None, None),
        ("global stores", t.global_store_requests, Some(t.global_store_sectors), None, None),
        ("global atomics", t.global_atomic_requests, Some(t.global_atomic_sectors), None, None),
        ("local loads", t.local_load_requests, Some(t.local_load_sectors), None, None),
        ("local stores", t.local_store_requests, Some(t.local_store_sectors), None, None),
        (
            "shared loads",
            t.shared_load_requests,
            None,
            Some(t.shared_load_wavefronts),
            Some(t.shared_load_bank_conflicts),
        ),
        (
            "shared stores",
            t.shared_store_requests,
            None,
            Some(t.shared_store_wavefronts),
            Some(t.shared_store_bank_conflicts),
        ),
        ("shared atomics", t.shared_atomic_requests, None, None, None),
    ];
    let cell = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    for (name, requests, sectors, wavefronts, conflicts) in rows {
        writeln!(
            out,
            "{name:<18} {requests:>10} {:>10} {:>11} {:>10}",
            cell(sectors),
            cell(wavefronts),
            cell(conflicts)
        )?;
    }
    writeln!(
        out,
        "bytes requested by global loads {} and stores {} (all spaces {}); moved through L1 {}; DRAM at least {}",
        t.global_load_bytes_requested,
        t.global_store_bytes_requested,
        t.bytes_requested,
        t.bytes_moved,
        p.counts.dram_bytes_min
    )?;
    let classes: Vec<String> = mix(t).iter().filter(|(_, v)| *v > 0).map(|(k, v)| format!("{k} {v}")).collect();
    writeln!(out, "\ninstructions (warp level): {}", classes.join(", "))?;
    writeln!(out, "divergent branches {}, flops {}", t.divergent_branches, t.flops)?;
    match &p.resources {
        Some(r) => writeln!(
            out,
            "\nptxas: {} registers, {} B spilled, {} B static shared",
            r.registers, r.spill_bytes, r.static_shared_bytes
        )?,
        None => writeln!(out, "\nptxas: not run")?,
    }
    if let Some(o) = &p.occupancy {
        writeln!(
            out,
            "occupancy on {}: {} warps per SM ({} blocks), limited by {}",
            p.arch.name(),
            o.warps_per_sm,
            o.blocks_per_sm,
            limit_name(&o.limit)
        )?;
    }
    if let Some(sass) = &p.sass {
        let mut ops: Vec<(&String, &u64)> = sass.iter().collect();
        ops.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let ops: Vec<String> = ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        writeln!(out, "SASS (static): {}", ops.join(", "))?;
    }
    let r = &p.roofline;
    writeln!(
        out,
        "\nroofline on {} (an ESTIMATE): {:.3} us, {} bound, {:.2} flop per DRAM byte",
        p.gpu.label,
        r.roofline_us,
        bound_name(&r.bound),
        r.intensity
    )?;
    // Sites by source line: an unrolled loop repeats one line's instruction many times.
    let mut lines: Vec<(String, String, usize, Counters)> = vec![];
    for site in &p.counts.sites {
        let c = &site.counters;
        let touches = c.global_load_requests
            + c.global_store_requests
            + c.global_atomic_requests
            + c.shared_load_requests
            + c.shared_store_requests
            + c.shared_atomic_requests;
        if touches == 0 {
            continue;
        }
        let loc = site.loc.as_ref().map_or("?".to_string(), |l| l.to_string());
        match lines.iter_mut().find(|(op, l, _, _)| *op == site.op && *l == loc) {
            Some((_, _, n, sum)) => {
                *n += 1;
                sum.add(c);
            }
            None => lines.push((site.op.clone(), loc, 1, c.clone())),
        }
    }
    let weight = |c: &Counters| {
        c.global_load_sectors
            + c.global_store_sectors
            + c.global_atomic_sectors
            + c.shared_load_wavefronts
            + c.shared_store_wavefronts
    };
    lines.sort_by_key(|(_, _, _, c)| std::cmp::Reverse(weight(c)));
    writeln!(out, "\nmemory sites by source line, busiest first (--json lists every instruction):")?;
    for (op, loc, n, c) in lines.iter().take(12) {
        let mut what = vec![];
        let global = c.global_load_sectors + c.global_store_sectors;
        if global > 0 {
            let asked = c.global_load_bytes_requested + c.global_store_bytes_requested;
            what.push(format!("{global} sectors, {:.0}% used", 100.0 * asked as f64 / (32 * global) as f64));
        }
        if c.global_atomic_requests > 0 {
            what.push(format!("{} atomic sectors", c.global_atomic_sectors));
        }
        if c.shared_load_requests + c.shared_store_requests > 0 {
            what.push(format!(
                "{} wavefronts, {} conflicts",
                c.shared_load_wavefronts + c.shared_store_wavefronts,
                c.shared_bank_conflicts()
            ));
        }
        if c.shared_atomic_requests > 0 {
            what.push(format!("{} shared atomics", c.shared_atomic_requests));
        }
        let op = if *n > 1 { format!("{op} x{n}") } else { op.clone() };
        writeln!(out, "  {op:<16} {:<40} {loc}", what.join("; "))?;
    }
    if lines.len() > 12 {
        writeln!(out, "  ... {} more lines", lines.len() - 12)?;
    }
    for n in &p.notices {
        writeln!(out, "notice: {n}")?;
    }
    Ok(())
}

//! The `rudac` command line: parsing and the commands, kept in the library so they are tested.

use std::io::Write;
use std::time::Instant;

use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};

use crate::registry::{find, registry, Registered};

pub const USAGE: &str = "\
usage:
  rudac list [--json]
      one registered kernel configuration per line: ID<TAB>targets
  rudac emit ID [--target sm_90] [--emit ptx|ir|ir-opt] [--compiler ptx|nvrtc] [--passes P]
      print the PTX (default), the IR, or the IR after the pass pipeline of one configuration
  rudac check [--target sm_80,sm_90] [--compiler ptx|nvrtc] [--passes P]
      assemble every configuration with `ptxas -v` and print registers, spills, shared memory;
      exits non-zero when any fails or spills
  rudac passes
      the optimisation passes, in default-pipeline order

P is `default` (the default), `none`, or pass names separated by commas (`fold,cse,dce`).

environment: RUDA_PTX_VERSION (PTX ISA version, e.g. 8.0), RUDA_CUDA_COMPILER (ptx|nvrtc),
RUDA_PTXAS (path to ptxas)";

/// What `rudac emit` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmitKind {
    Ptx,
    /// The IR as built, before any pass.
    Ir,
    /// The IR after the pass pipeline.
    IrOpt,
}

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    List { json: bool },
    Emit { id: String, arch: Arch, kind: EmitKind, compiler: Option<String>, passes: String },
    Check { archs: Vec<Arch>, compiler: Option<String>, passes: String },
    Passes,
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    Arch::from_name(s).ok_or_else(|| {
        let known: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        format!("unknown target `{s}`; known targets: {}", known.join(", "))
    })
}

impl Command {
    pub fn parse(args: &[String]) -> Result<Command, String> {
        let (sub, rest) = args.split_first().ok_or("no command given")?;
        let mut positional = Vec::new();
        let mut flags: Vec<(String, Option<String>)> = Vec::new();
        let mut it = rest.iter();
        while let Some(a) = it.next() {
            if a == "--json" {
                flags.push((a.clone(), None));
            } else if let Some((k, v)) = a.split_once('=').filter(|_| a.starts_with("--")) {
                flags.push((k.to_string(), Some(v.to_string())));
            } else if a.starts_with("--") {
                let v = it.next().ok_or_else(|| format!("{a} needs a value"))?;
                flags.push((a.clone(), Some(v.clone())));
            } else {
                positional.push(a.clone());
            }
        }
        let allowed: &[&str] = match sub.as_str() {
            "list" => &["--json"],
            "emit" => &["--target", "--emit", "--compiler", "--passes"],
            "check" => &["--target", "--compiler", "--passes"],
            "passes" => &[],
            other => return Err(format!("unknown command `{other}`")),
        };
        if let Some((f, _)) = flags.iter().find(|(f, _)| !allowed.contains(&f.as_str())) {
            return Err(format!("`rudac {sub}` does not take {f}"));
        }
        let flag = |name: &str| flags.iter().find(|(f, _)| f == name).and_then(|(_, v)| v.clone());
        let compiler = flag("--compiler");
        let passes = flag("--passes").unwrap_or_else(|| "default".into());
        ruda_ir::passes::parse_pipeline(&passes).map_err(|e| e.to_string())?;
        match sub.as_str() {
            "list" => {
                if !positional.is_empty() {
                    return Err("`rudac list` takes no arguments".into());
                }
                Ok(Command::List { json: flags.iter().any(|(f, _)| f == "--json") })
            }
            "emit" => {
                let [id] = positional.as_slice() else {
                    return Err("`rudac emit` takes exactly one kernel id (see `rudac list`)".into());
                };
                let arch = parse_arch(flag("--target").as_deref().unwrap_or("sm_90"))?;
                let kind = match flag("--emit").as_deref().unwrap_or("ptx") {
                    "ptx" => EmitKind::Ptx,
                    "ir" => EmitKind::Ir,
                    "ir-opt" => EmitKind::IrOpt,
                    other => return Err(format!("unknown --emit `{other}`; expected ptx, ir or ir-opt")),
                };
                Ok(Command::Emit { id: id.clone(), arch, kind, compiler, passes })
            }
            "passes" => {
                if !positional.is_empty() {
                    return Err("`rudac passes` takes no arguments".into());
                }
                Ok(Command::Passes)
            }
            _ => {
                if !positional.is_empty() {
                    return Err("`rudac check` takes no positional arguments".into());
                }
                let archs = match flag("--target") {
                    Some(list) => list.split(',').map(parse_arch).collect::<Result<Vec<_>, _>>()?,
                    None => vec![Arch::Sm80, Arch::Sm90],
                };
                Ok(Command::Check { archs, compiler, passes })
            }
        }
    }
}

/// Resolve the compiler: the flag, else `RUDA_CUDA_COMPILER`, else `ptx`.
fn check_compiler(flag: &Option<String>) -> Result<(), String> {
    let compiler = match flag {
        Some(c) => ruda_runtime::Compiler::parse(Some(c)),
        None => ruda_runtime::Compiler::from_env(),
    }
    .map_err(|e| e.to_string())?;
    match compiler {
        ruda_runtime::Compiler::Ptx => Ok(()),
        other => Err(format!(
            "compiler `{}`: the NVRTC backend is not implemented yet (see the compiler-depth issue); use --compiler ptx",
            other.name()
        )),
    }
}

/// Build a configuration and run the pass pipeline `passes` over it (dumping to `RUDA_DUMP_IR`).
fn build_optimized(reg: &Registered, passes: &str) -> Result<ruda_ir::Kernel, String> {
    let mut kernel = reg.build().map_err(|e| e.to_string())?;
    let pipeline = ruda_ir::passes::parse_pipeline(passes).map_err(|e| e.to_string())?;
    let dump = std::env::var_os("RUDA_DUMP_IR").filter(|d| !d.is_empty()).map(std::path::PathBuf::from);
    ruda_ir::passes::run_pipeline(&mut kernel, &pipeline, dump.as_deref()).map_err(|e| e.to_string())?;
    Ok(kernel)
}

fn lookup(id: &str) -> Result<Registered, String> {
    find(id).ok_or_else(|| format!("no registered kernel `{id}` (see `rudac list`)"))
}

/// Run a command, writing its output to `out`. `Ok(false)` means the command ran and found
/// failures (a non-zero exit without an error message of its own).
pub fn run(command: &Command, out: &mut dyn Write) -> Result<bool, String> {
    let io = |e: std::io::Error| e.to_string();
    match command {
        Command::List { json } => {
            let reg = registry();
            if *json {
                let items: Vec<String> = reg
                    .iter()
                    .map(|r| {
                        let targets: Vec<String> = r.targets.iter().map(|t| format!("\"{t}\"")).collect();
                        format!(
                            "{{\"id\":\"{}\",\"family\":\"{}\",\"targets\":[{}]}}",
                            r.id,
                            r.family,
                            targets.join(",")
                        )
                    })
                    .collect();
                writeln!(out, "[{}]", items.join(",")).map_err(io)?;
            } else {
                for r in &reg {
                    let targets: Vec<&str> = r.targets.iter().map(|t| t.name()).collect();
                    writeln!(out, "{}\t{}", r.id, targets.join(",")).map_err(io)?;
                }
            }
            Ok(true)
        }
        Command::Passes => {
            for pass in ruda_ir::passes::all_passes() {
                writeln!(out, "{:<12} {}", pass.name(), pass.description()).map_err(io)?;
            }
            Ok(true)
        }
        Command::Emit { id, arch, kind, compiler, passes } => {
            check_compiler(compiler)?;
            let reg = lookup(id)?;
            let kernel = match kind {
                EmitKind::Ir => reg.build().map_err(|e| e.to_string())?,
                EmitKind::IrOpt | EmitKind::Ptx => build_optimized(&reg, passes)?,
            };
            match kind {
                EmitKind::Ir | EmitKind::IrOpt => write!(out, "{}", ruda_ir::print_kernel(&kernel)).map_err(io)?,
                EmitKind::Ptx => {
                    let target = Target::from_env(*arch).map_err(|e| e.to_string())?;
                    let ptx = emit_ptx(&kernel, &target).map_err(|e| e.to_string())?;
                    write!(out, "{ptx}").map_err(io)?;
                }
            }
            Ok(true)
        }
        Command::Check { archs, compiler, passes } => {
            check_compiler(compiler)?;
            let ptxas_path = ptxas::find_ptxas().ok_or(
                "ptxas not found: set RUDA_PTXAS or run scripts/install-cuda-tools.sh".to_string(),
            )?;
            writeln!(out, "ptxas: {}", ptxas_path.display()).map_err(io)?;
            writeln!(
                out,
                "{:<28} {:<7} {:>4} {:>6} {:>7} {:>6} {:>6} {:>8}  verdict",
                "id", "target", "regs", "spill", "shared", "stack", "lines", "emit_ms"
            )
            .map_err(io)?;
            let mut all_ok = true;
            let (mut passed, mut total) = (0, 0);
            for reg in registry() {
                for arch in archs.iter().filter(|a| reg.targets.contains(a)) {
                    total += 1;
                    let started = Instant::now();
                    let emitted = build_optimized(&reg, passes)
                        .and_then(|k| Target::from_env(*arch).map(|t| (k, t)).map_err(|e| e.to_string()))
                        .and_then(|(k, t)| emit_ptx(&k, &t).map_err(|e| e.to_string()));
                    let emit_ms = started.elapsed().as_secs_f64() * 1e3;
                    let ptx = match emitted {
                        Ok(p) => p,
                        Err(e) => {
                            all_ok = false;
                            writeln!(out, "{:<28} {:<7} emit failed: {e}", reg.id, arch.name()).map_err(io)?;
                            continue;
                        }
                    };
                    let lines = ptx.lines().count();
                    let name = reg.id.replace('.', "_");
                    let report = ptxas::assemble(&ptx, *arch).map_err(|e| e.to_string()).and_then(|r| {
                        r.entry(&name).cloned().ok_or_else(|| format!("ptxas reported no entry `{name}`"))
                    });
                    match report {
                        Ok(r) => {
                            let spill = r.spill_store_bytes + r.spill_load_bytes;
                            let verdict = if spill == 0 { "ok" } else { "SPILLS" };
                            if spill == 0 {
                                passed += 1;
                            } else {
                                all_ok = false;
                            }
                            writeln!(
                                out,
                                "{:<28} {:<7} {:>4} {:>6} {:>7} {:>6} {:>6} {:>8.2}  {verdict}",
                                reg.id,
                                arch.name(),
                                r.registers,
                                spill,
                                r.shared_bytes,
                                r.stack_frame_bytes,
                                lines,
                                emit_ms
                            )
                            .map_err(io)?;
                        }
                        Err(e) => {
                            all_ok = false;
                            writeln!(out, "{:<28} {:<7} ptxas FAILED: {e}", reg.id, arch.name()).map_err(io)?;
                        }
                    }
                }
            }
            writeln!(out, "{passed} of {total} configurations assembled with zero spills").map_err(io)?;
            Ok(all_ok)
        }
    }
}

//! The `rudac` command line: parsing (through `clap`) and the commands, kept in the library so
//! they are tested.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};
use ruda_codegen_ptx::{emit_ptx, ptxas, Arch, Target};
use ruda_ir::interp::KernelArg;
use ruda_ir::{Constant, Kernel, ScalarType};
use ruda_ops::registry::{find, registry, Registered};
use ruda_ops::sample::{checksum, file_problem, sample_problem, Problem, SampleArg};
use ruda_ops::tune::TuneCommand;

use crate::profile::ProfileArgs;
use ruda_runtime::Compiler;

const ENVIRONMENT: &str = "\
environment: RUDA_PTX_VERSION (PTX ISA version, e.g. 8.0), RUDA_CUDA_COMPILER (ptx|nvrtc),
RUDA_PTXAS (path to ptxas), RUDA_NVDISASM (path to nvdisasm), RUDA_NVRTC (path to libnvrtc),
RUDA_NVRTC_CACHE (folder keeping NVRTC's PTX), RUDA_DUMP_IR (folder for the IR after each pass), RUDA_AUTOTUNE (on|off), RUDA_CACHE_DIR (cache
folder), RUDA_DEVICE (tune), RUDA_INTERP_THREADS (interpreter threads)";

/// What `rudac emit` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EmitKind {
    /// The PTX of --compiler.
    Ptx,
    /// The IR as built, before any pass.
    Ir,
    /// The IR after the pass pipeline.
    IrOpt,
    /// The CUDA C++ of the NVRTC backend.
    Cuda,
}

/// Where the kernel of `rudac emit` comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// A registered configuration.
    Id(String),
    /// A kernel in the text IR.
    File(PathBuf),
}

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    List { json: bool },
    Emit { source: Source, arch: Arch, kind: EmitKind, compiler: Option<String>, passes: String },
    Check { archs: Vec<Arch>, compiler: Option<String>, passes: String },
    Passes,
    BenchCompile { arch: Arch },
    Run(RunArgs),
    Profile(ProfileArgs),
    Tune(TuneCommand),
}

/// Where `rudac run` runs a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Engine {
    /// The IR interpreter.
    Interp,
    /// The PTX emulator, on the PTX of --compiler for --target.
    PtxEmu,
    /// CUDA device 0 through the runtime.
    Cuda,
}

/// The arguments of `rudac run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunArgs {
    pub source: Source,
    pub engine: Engine,
    /// `--compiler` (ptx-emu and cuda only; else `RUDA_CUDA_COMPILER`, else ptx).
    pub compiler: Option<String>,
    /// `--target` (ptx-emu only; default sm_90).
    pub arch: Option<Arch>,
    pub seed: u64,
    /// `--input NAME=FILE|VALUE`, in order; the value stays an `OsString` because a file name
    /// need not be UTF-8.
    pub inputs: Vec<(String, OsString)>,
}

/// A command line that did not parse.
#[derive(Debug)]
pub enum ParseError {
    /// From `clap`: a usage error, or `--help` (which `clap::Error::exit` prints on stdout
    /// with exit status 0).
    Clap(clap::Error),
    /// A rule across flags that `clap` does not express (`--compiler` with `--engine interp`).
    Invalid(String),
}

impl std::fmt::Display for ParseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParseError::Clap(e) => write!(f, "{e}"),
            ParseError::Invalid(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for ParseError {}

/// List, emit, check and run RUDA's registered kernel configurations.
#[derive(Parser)]
#[command(name = "rudac", after_help = ENVIRONMENT, arg_required_else_help = true)]
struct Cli {
    #[command(subcommand)]
    command: Sub,
}

#[derive(Subcommand)]
enum Sub {
    /// One registered kernel configuration per line: ID<TAB>targets.
    List {
        /// Print a JSON array of {"id", "family", "targets"} instead.
        #[arg(long)]
        json: bool,
    },
    /// Print the PTX (default), the IR as built, the IR after the passes, or the CUDA C++ of
    /// one registered configuration or of a kernel written in the text IR.
    Emit {
        #[command(flatten)]
        source: SourceArgs,
        /// The target to emit PTX for.
        #[arg(long, value_name = "ARCH", default_value = "sm_90", value_parser = parse_arch)]
        target: Arch,
        /// What to print.
        #[arg(long, value_enum, default_value_t = EmitKind::Ptx)]
        emit: EmitKind,
        #[command(flatten)]
        compiler: CompilerArg,
        #[command(flatten)]
        passes: PassesArg,
    },
    /// Assemble every configuration with `ptxas -v` and print registers, spills, shared memory.
    ///
    /// Exits non-zero when any configuration fails, or spills through the direct PTX backend
    /// (NVRTC's spills are reported, not enforced).
    Check {
        /// The targets, separated by commas; each configuration is checked on those of its
        /// targets that are listed.
        #[arg(long, value_name = "ARCH,...", value_delimiter = ',', default_value = "sm_80,sm_90", value_parser = parse_arch)]
        target: Vec<Arch>,
        #[command(flatten)]
        compiler: CompilerArg,
        #[command(flatten)]
        passes: PassesArg,
    },
    /// The optimisation passes, and the default pipeline.
    Passes,
    /// Time IR build, passes, PTX emission, NVRTC and ptxas for every configuration.
    BenchCompile {
        /// The target to compile for.
        #[arg(long, value_name = "ARCH", default_value = "sm_90", value_parser = parse_arch)]
        target: Arch,
    },
    /// Run one configuration (after the default passes) on its sample problem and print
    /// `checksum=<16 hex digits> time_ms=<f>`.
    ///
    /// The inputs are drawn from --seed. The checksum is FNV-1a 64 over every buffer argument
    /// after the run, concatenated in parameter order. interp and ptx-emu print the same
    /// checksum; on cuda the runtime picks the target and the checksum is informational
    /// (approximate math may differ in the last bits). A --file kernel runs one block of its
    /// launch bound (256 threads without one) with default scalars (16, 0.125).
    Run {
        #[command(flatten)]
        source: SourceArgs,
        /// Where to run: interp is the IR interpreter, ptx-emu emulates the PTX of --compiler
        /// for --target on the CPU, cuda runs on GPU 0 through the runtime.
        #[arg(long, value_enum)]
        engine: Engine,
        #[command(flatten)]
        compiler: CompilerArg,
        /// The target of --engine ptx-emu [default: sm_90].
        #[arg(long, value_name = "ARCH", value_parser = parse_arch)]
        target: Option<Arch>,
        /// The seed the inputs are drawn from.
        #[arg(long, value_name = "N", default_value_t = 0, value_parser = parse_seed, allow_hyphen_values = true)]
        seed: u64,
        /// Replace buffer parameter NAME with the raw little-endian bytes of FILE (the same
        /// size), or set scalar parameter NAME to VALUE (an integer, a float, 0x<bits>,
        /// true/false). Repeatable.
        #[arg(long, value_name = "NAME=FILE|VALUE")]
        input: Vec<OsString>,
    },
    /// Profile one configuration on its sample problem, as a GPU profiler would show it, on the
    /// CPU: memory requests, sectors, shared-memory wavefronts and bank conflicts, instruction
    /// mix and flops (counted by the interpreter), registers and spills (ptxas), occupancy,
    /// SASS opcodes (nvdisasm) and a roofline estimate for --gpu.
    ///
    /// A --file kernel runs one block of its launch bound, as in `rudac run`. Without ptxas or
    /// nvdisasm the parts that need them are null and a notice says why.
    Profile {
        #[command(flatten)]
        source: SourceArgs,
        /// The seed the inputs are drawn from.
        #[arg(long, value_name = "N", default_value_t = 0, value_parser = parse_seed, allow_hyphen_values = true)]
        seed: u64,
        /// As for `rudac run`. Repeatable.
        #[arg(long, value_name = "NAME=FILE|VALUE")]
        input: Vec<OsString>,
        /// The GPU whose peaks the roofline uses: a100, h100-sxm, h200.
        #[arg(long, value_name = "GPU", default_value = "h200")]
        gpu: String,
        /// The target ptxas assembles for and occupancy is computed on [default: the GPU's].
        #[arg(long, value_name = "ARCH", value_parser = parse_arch)]
        target: Option<Arch>,
        #[command(flatten)]
        compiler: CompilerArg,
        /// Print one JSON object instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Autotune the op shapes of a file on the RUDA_DEVICE GPU, or show the autotune caches.
    ///
    /// --shapes: a progress line per shape on stderr; results cached per GPU under
    /// RUDA_CACHE_DIR. FILE has one op per line, `gemv DTYPE m=M n=N k=K` (M <= 16),
    /// `gemm DTYPE m=M n=N k=K` (M > 16, f16|bf16) or `attention_decode DTYPE batch=B
    /// q_heads=H kv_heads=G head_dim=D s_max=S` (DTYPE f32|f16|bf16), `#` comments;
    /// `ruda-llm tune MODEL_DIR` tunes a model's shapes. On the CPU device autotuning is off:
    /// the file is only checked.
    #[command(group(ArgGroup::new("what").required(true).args(["shapes", "show"])))]
    Tune {
        /// Tune every op shape of FILE.
        #[arg(long, value_name = "FILE")]
        shapes: Option<PathBuf>,
        /// Print the current GPU's cache, or every cache file without a GPU.
        #[arg(long)]
        show: bool,
    },
}

/// One kernel id or `--file`.
#[derive(Args)]
#[group(required = true, multiple = false)]
struct SourceArgs {
    /// A registered configuration (see `rudac list`).
    id: Option<String>,
    /// A kernel in the text IR instead.
    #[arg(long, value_name = "F.rir")]
    file: Option<PathBuf>,
}

impl SourceArgs {
    fn source(self, command: &str) -> Result<Source, String> {
        match (self.id, self.file) {
            (Some(id), None) => Ok(Source::Id(id)),
            (None, Some(file)) => Ok(Source::File(file)),
            _ => Err(format!("`rudac {command}` takes one kernel id (see `rudac list`) or --file F.rir")),
        }
    }
}

#[derive(Args)]
struct CompilerArg {
    /// The compiler: ptx (direct) or nvrtc (through CUDA C++) [default: RUDA_CUDA_COMPILER,
    /// else ptx].
    #[arg(long, value_name = "ptx|nvrtc")]
    compiler: Option<String>,
}

#[derive(Args)]
struct PassesArg {
    /// The pass pipeline: `default`, `none`, or pass names separated by commas
    /// (`fold,cse,dce`; see `rudac passes`).
    #[arg(long, value_name = "P", default_value = "default", value_parser = parse_passes)]
    passes: String,
}

fn parse_arch(s: &str) -> Result<Arch, String> {
    Arch::from_name(s).ok_or_else(|| {
        let known: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        format!("unknown target `{s}`; known targets: {}", known.join(", "))
    })
}

fn parse_passes(s: &str) -> Result<String, String> {
    ruda_ir::passes::parse_pipeline(s).map_err(|e| e.to_string())?;
    Ok(s.to_string())
}

fn parse_seed(s: &str) -> Result<u64, String> {
    s.parse().map_err(|_| format!("`{s}` is not an unsigned 64-bit integer"))
}

/// `--input NAME=VALUE`: the name is text, the value may be a file name in any encoding.
fn parse_input(arg: &OsStr) -> Result<(String, OsString), String> {
    let shown = arg.to_string_lossy();
    let bytes = arg.as_encoded_bytes();
    let eq = bytes
        .iter()
        .position(|&b| b == b'=')
        .filter(|&i| i > 0)
        .ok_or_else(|| format!("--input `{shown}`: expected NAME=FILE or NAME=VALUE"))?;
    let name =
        std::str::from_utf8(&bytes[..eq]).map_err(|_| format!("--input `{shown}`: the parameter name is not UTF-8"))?;
    // SAFETY: the bytes come from `as_encoded_bytes` and are split right after `=`, a
    // non-empty UTF-8 substring, which `from_encoded_bytes_unchecked` allows.
    let value = unsafe { OsStr::from_encoded_bytes_unchecked(&bytes[eq + 1..]) };
    Ok((name.to_string(), value.to_os_string()))
}

impl Command {
    /// Parse a command line (without the program name); errors as text.
    pub fn parse<I, T>(args: I) -> Result<Command, String>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        Command::try_parse(args).map_err(|e| e.to_string())
    }

    /// Parse a command line (without the program name). Arguments are `OsString`s: a path need
    /// not be UTF-8; a non-UTF-8 value where text is required is an error.
    pub fn try_parse<I, T>(args: I) -> Result<Command, ParseError>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let argv = std::iter::once(OsString::from("rudac")).chain(args.into_iter().map(Into::into));
        let cli = Cli::try_parse_from(argv).map_err(ParseError::Clap)?;
        cli.command.into_command().map_err(ParseError::Invalid)
    }
}

impl Sub {
    fn into_command(self) -> Result<Command, String> {
        Ok(match self {
            Sub::List { json } => Command::List { json },
            Sub::Emit { source, target, emit, compiler, passes } => Command::Emit {
                source: source.source("emit")?,
                arch: target,
                kind: emit,
                compiler: compiler.compiler,
                passes: passes.passes,
            },
            Sub::Check { target, compiler, passes } => {
                Command::Check { archs: target, compiler: compiler.compiler, passes: passes.passes }
            }
            Sub::Passes => Command::Passes,
            Sub::BenchCompile { target } => Command::BenchCompile { arch: target },
            Sub::Run { source, engine, compiler, target, seed, input } => {
                Command::Run(run_args(source.source("run")?, engine, compiler.compiler, target, seed, &input)?)
            }
            Sub::Profile { source, seed, input, gpu, target, compiler, json } => Command::Profile(ProfileArgs {
                source: source.source("profile")?,
                seed,
                inputs: parse_inputs(&input)?,
                gpu,
                arch: target,
                compiler: compiler.compiler,
                json,
            }),
            Sub::Tune { shapes, show } => Command::Tune(match (shapes, show) {
                (Some(file), false) => TuneCommand::Shapes(file),
                (None, true) => TuneCommand::Show,
                _ => return Err("`rudac tune` takes either --shapes FILE or --show".into()),
            }),
        })
    }
}

/// `rudac run`'s rules across flags.
fn run_args(
    source: Source,
    engine: Engine,
    compiler: Option<String>,
    arch: Option<Arch>,
    seed: u64,
    input: &[OsString],
) -> Result<RunArgs, String> {
    if compiler.is_some() && engine == Engine::Interp {
        return Err("--compiler does not apply to --engine interp (it runs the IR)".into());
    }
    if arch.is_some() && engine != Engine::PtxEmu {
        return Err(format!(
            "--target applies to --engine ptx-emu only ({})",
            if engine == Engine::Cuda {
                "on CUDA the runtime picks the device's target"
            } else {
                "the interpreter runs the IR"
            }
        ));
    }
    Ok(RunArgs { source, engine, compiler, arch, seed, inputs: parse_inputs(input)? })
}

/// The `--input`s, each name at most once.
fn parse_inputs(input: &[OsString]) -> Result<Vec<(String, OsString)>, String> {
    let mut inputs: Vec<(String, OsString)> = Vec::new();
    for arg in input {
        let (name, value) = parse_input(arg)?;
        if inputs.iter().any(|(n, _)| *n == name) {
            return Err(format!("--input `{name}` given twice"));
        }
        inputs.push((name, value));
    }
    Ok(inputs)
}

/// The compiler: `--compiler`, else `RUDA_CUDA_COMPILER`, else `ptx`. A bad value is blamed on
/// where it came from.
pub(crate) fn resolve_compiler(flag: &Option<String>) -> Result<Compiler, String> {
    match flag {
        Some(c) => Compiler::parse(Some(c))
            .map_err(|_| format!("--compiler `{c}` is not valid; accepted values: ptx (the default), nvrtc")),
        None => Compiler::from_env().map_err(|e| e.to_string()),
    }
}

/// Run the pass pipeline `passes` over a kernel (dumping to `RUDA_DUMP_IR`).
fn optimize(mut kernel: Kernel, passes: &str) -> Result<Kernel, String> {
    let pipeline = ruda_ir::passes::parse_pipeline(passes).map_err(|e| e.to_string())?;
    let dump = std::env::var_os("RUDA_DUMP_IR").filter(|d| !d.is_empty()).map(PathBuf::from);
    ruda_ir::passes::run_pipeline(&mut kernel, &pipeline, dump.as_deref()).map_err(|e| e.to_string())?;
    Ok(kernel)
}

/// The kernel as built (verified), from the registry or a text-IR file.
fn load(source: &Source) -> Result<Kernel, String> {
    match source {
        Source::Id(id) => {
            let reg = find(id).ok_or_else(|| format!("no registered kernel `{id}` (see `rudac list`)"))?;
            reg.build().map_err(|e| e.to_string())
        }
        Source::File(path) => {
            let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
            let kernel = ruda_ir::parse_kernel(&text).map_err(|e| format!("{}:{e}", path.display()))?;
            ruda_ir::verify(&kernel).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(kernel)
        }
    }
}

/// PTX for `kernel` through `compiler`, with `RUDA_PTX_VERSION` applied.
pub(crate) fn compile(kernel: &Kernel, arch: Arch, compiler: Compiler) -> Result<String, String> {
    let target = Target::from_env(arch).map_err(|e| e.to_string())?;
    match compiler {
        Compiler::Ptx => emit_ptx(kernel, &target).map_err(|e| e.to_string()),
        Compiler::Nvrtc => ruda_codegen_nvrtc::compile_to_ptx(kernel, &target).map_err(|e| e.to_string()),
    }
}

/// Map `f` over `jobs` on all cores, keeping the order of the results.
fn parallel_map<J: Sync, R: Send>(jobs: &[J], f: impl Fn(&J) -> R + Sync) -> Vec<R> {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(jobs.len().max(1));
    let next = AtomicUsize::new(0);
    let mut results: Vec<(usize, R)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(job) = jobs.get(i) else { break mine };
                        mine.push((i, f(job)));
                    }
                })
            })
            .collect();
        // A worker only panics on a bug in `f`; propagate it.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))).collect()
    });
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
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
            writeln!(out, "default pipeline: {}", ruda_ir::passes::DEFAULT_PIPELINE.join(",")).map_err(io)?;
            Ok(true)
        }
        Command::Emit { source, arch, kind, compiler, passes } => {
            let compiler = resolve_compiler(compiler)?;
            let kernel = load(source)?;
            let text = match kind {
                EmitKind::Ir => ruda_ir::print_kernel(&kernel),
                EmitKind::IrOpt => ruda_ir::print_kernel(&optimize(kernel, passes)?),
                EmitKind::Cuda => {
                    ruda_codegen_nvrtc::emit_cuda(&optimize(kernel, passes)?).map_err(|e| e.to_string())?
                }
                EmitKind::Ptx => compile(&optimize(kernel, passes)?, *arch, compiler)?,
            };
            write!(out, "{text}").map_err(io)?;
            Ok(true)
        }
        Command::Check { archs, compiler, passes } => check(archs, resolve_compiler(compiler)?, passes, out),
        Command::BenchCompile { arch } => crate::compile_bench::bench_compile(*arch, out),
        Command::Run(args) => {
            let (checksum, ms) = run_sample(args)?;
            writeln!(out, "checksum={checksum:016x} time_ms={ms:.3}").map_err(io)?;
            Ok(true)
        }
        Command::Profile(args) => {
            let p = crate::profile::profile(args)?;
            if args.json {
                writeln!(out, "{}", crate::profile::to_json(&p)).map_err(io)?;
            } else {
                crate::profile::write_table(&p, out).map_err(io)?;
            }
            Ok(true)
        }
        Command::Tune(tune) => ruda_ops::tune::run_tune(tune, out, &mut std::io::stderr()),
    }
}

/// The kernel of `source` after the default passes (as the op library launches it) and its
/// sample problem drawn from `seed`, with `--input`s applied: what `rudac run` and `rudac
/// profile` launch.
pub(crate) fn prepare(source: &Source, seed: u64, inputs: &[(String, OsString)]) -> Result<(Kernel, Problem), String> {
    let kernel = load(source)?;
    let mut problem = match source {
        Source::Id(id) => {
            let reg = find(id).ok_or_else(|| format!("no registered kernel `{id}` (see `rudac list`)"))?;
            sample_problem(reg.family, id, &kernel, seed)?
        }
        Source::File(_) => file_problem(&kernel, seed)?,
    };
    let kernel = optimize(kernel, "default")?;
    for (name, value) in inputs {
        set_input(&mut problem, &kernel.name, name, value)?;
    }
    Ok((kernel, problem))
}

/// `rudac run`: the checksum of the output buffers and the launch's wall time in ms.
pub fn run_sample(args: &RunArgs) -> Result<(u64, f64), String> {
    let (kernel, problem) = prepare(&args.source, args.seed, &args.inputs)?;
    let mut ms = 0.0;
    let buffers = match args.engine {
        Engine::Interp => problem.run_with(|a| {
            let started = Instant::now();
            let r = ruda_ir::interp::run(&kernel, &problem.launch, a);
            ms = started.elapsed().as_secs_f64() * 1e3;
            r.map_err(|e| format!("the interpreter: {e}"))
        })?,
        Engine::PtxEmu => {
            let compiler = resolve_compiler(&args.compiler)?;
            let arch = args.arch.unwrap_or(Arch::Sm90);
            let what = format!("the PTX emulator ({} PTX for {arch})", compiler.name());
            let ptx = compile(&kernel, arch, compiler)?;
            let module = ruda_ptx_emu::Module::parse(&ptx).map_err(|e| format!("{what}: {e}"))?;
            problem.run_with(|a| {
                let mut emu_args: Vec<ruda_ptx_emu::Arg<'_>> = a
                    .iter_mut()
                    .map(|a| match a {
                        KernelArg::Buffer(b) => ruda_ptx_emu::Arg::Buffer(b),
                        KernelArg::Scalar(c) => ruda_ptx_emu::Arg::Scalar(*c),
                    })
                    .collect();
                let started = Instant::now();
                let r = module.launch(&kernel.name, &problem.launch, &mut emu_args, &ruda_ptx_emu::Options::default());
                ms = started.elapsed().as_secs_f64() * 1e3;
                r.map_err(|e| format!("{what}: {e}"))
            })?
        }
        Engine::Cuda => {
            let (buffers, t) = run_cuda(&kernel, &problem, resolve_compiler(&args.compiler)?)?;
            ms = t;
            buffers
        }
    };
    Ok((checksum(&buffers), ms))
}

/// Apply `--input name=value` to `problem`: a buffer's contents from the file `value`, or a
/// scalar's value.
fn set_input(problem: &mut Problem, kernel: &str, name: &str, value: &OsStr) -> Result<(), String> {
    let names: Vec<&str> = problem.args.iter().map(|a| a.name()).collect();
    let known = names.join(", ");
    let arg = problem.args.iter_mut().find(|a| a.name() == name).ok_or_else(|| {
        format!("--input {name}: kernel `{kernel}` has no parameter `{name}` (its parameters: {known})")
    })?;
    match arg {
        SampleArg::Buffer { elem, bytes, .. } => {
            let file = Path::new(value).display();
            let data = std::fs::read(value).map_err(|e| format!("--input {name}: {file}: {e}"))?;
            if data.len() != bytes.len() {
                return Err(format!(
                    "--input {name}: {file} has {} bytes; buffer parameter `{name}` ({elem}) takes exactly {} bytes",
                    data.len(),
                    bytes.len()
                ));
            }
            *bytes = data;
        }
        SampleArg::Scalar { value: c, .. } => {
            let text = value.to_str().ok_or_else(|| {
                format!(
                    "--input {name}={}: not UTF-8 (scalar parameter `{name}` takes a number)",
                    value.to_string_lossy()
                )
            })?;
            *c = parse_scalar(c.ty, text).map_err(|e| format!("--input {name}={text}: {e}"))?;
        }
    }
    Ok(())
}

/// A scalar argument from the command line: an integer (decimal, in the type's range), a
/// float (rounded to nearest), `0x<bits>` for either, or true/false for `pred`.
fn parse_scalar(ty: ScalarType, text: &str) -> Result<Constant, String> {
    let bits = ty.bits();
    let fits = |v: u64| bits >= 64 || v >> bits == 0;
    if let Some(hex) = text.strip_prefix("0x") {
        let v = u64::from_str_radix(hex, 16).map_err(|_| format!("`{text}` is not a hexadecimal number"))?;
        return if fits(v) { Ok(Constant::new(ty, v)) } else { Err(format!("0x{hex} does not fit in {ty}")) };
    }
    match ty {
        ScalarType::Pred => match text {
            "true" | "1" => Ok(Constant::pred(true)),
            "false" | "0" => Ok(Constant::pred(false)),
            _ => Err("expected true or false".into()),
        },
        _ if ty.is_float() => {
            let v: f64 = text.parse().map_err(|_| format!("`{text}` is not a number (for {ty})"))?;
            Ok(match ty {
                ScalarType::F16 => Constant::new(ty, half::f16::from_f64(v).to_bits() as u64),
                ScalarType::BF16 => Constant::new(ty, half::bf16::from_f64(v).to_bits() as u64),
                ScalarType::F32 => Constant::f32(v as f32),
                _ => Constant::f64(v),
            })
        }
        _ => {
            let v: i128 = text.parse().map_err(|_| format!("`{text}` is not an integer (for {ty})"))?;
            let (lo, hi) = if ty.is_signed_int() {
                (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
            } else {
                (0, (1i128 << bits) - 1)
            };
            if v < lo || v > hi {
                return Err(format!("{v} is out of range for {ty} ({lo}..={hi})"));
            }
            Ok(Constant::new(ty, v as u64))
        }
    }
}

/// Run on CUDA device 0: a warm-up launch (compiling and loading the module) on one copy of
/// the inputs, then the timed launch on a fresh copy; its buffers read back.
fn run_cuda(kernel: &Kernel, problem: &Problem, compiler: Compiler) -> Result<(Vec<Vec<u8>>, f64), String> {
    use ruda_runtime::{Arg, DType, Device, RuntimeError, Tensor};
    let cuda = |e: RuntimeError| format!("--engine cuda: {e}");
    let version = std::env::var("RUDA_PTX_VERSION").ok();
    let ptx_version = ruda_runtime::parse_ptx_version(version.as_deref()).map_err(cuda)?;
    let device = Device::cuda_with(0, compiler, ptx_version).map_err(|e| match e {
        RuntimeError::CudaUnavailable { request, source } => {
            format!(
                "--engine cuda needs a CUDA GPU: {request}: {source}; --engine interp and ptx-emu run on any machine"
            )
        }
        other => cuda(other),
    })?;
    // The buffer arguments, in parameter order.
    let upload = || -> Result<Vec<Tensor>, String> {
        let mut tensors = Vec::new();
        for a in &problem.args {
            if let SampleArg::Buffer { name, elem, bytes } = a {
                let dtype = DType::from_scalar_type(*elem)
                    .ok_or_else(|| format!("--engine cuda: buffer parameter `{name}` of {elem} has no memory form"))?;
                tensors.push(Tensor::from_bytes(&device, dtype, &[bytes.len() / dtype.size()], bytes).map_err(cuda)?);
            }
        }
        Ok(tensors)
    };
    let launch = |tensors: &[Tensor]| -> Result<(), String> {
        let mut it = tensors.iter();
        let args: Vec<Arg<'_>> = problem
            .args
            .iter()
            .filter_map(|a| match a {
                SampleArg::Scalar { value, .. } => Some(Arg::Scalar(*value)),
                SampleArg::Buffer { .. } => it.next().map(Arg::Tensor),
            })
            .collect();
        let stream = device.default_stream();
        stream.launch(kernel, problem.launch, &args).map_err(cuda)?;
        stream.synchronize().map_err(cuda)
    };
    launch(&upload()?)?;
    let tensors = upload()?;
    let started = Instant::now();
    launch(&tensors)?;
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let buffers = tensors.iter().map(|t| t.to_bytes().map_err(cuda)).collect::<Result<Vec<_>, _>>()?;
    Ok((buffers, ms))
}

/// One row of `rudac check`.
struct CheckRow {
    id: String,
    arch: Arch,
    emit_ms: f64,
    result: Result<(usize, ptxas::EntryReport), String>,
}

fn check(archs: &[Arch], compiler: Compiler, passes: &str, out: &mut dyn Write) -> Result<bool, String> {
    let io = |e: std::io::Error| e.to_string();
    let ptxas_path = ptxas::find_ptxas()
        .ok_or_else(|| "ptxas not found: set RUDA_PTXAS or run scripts/install-cuda-tools.sh".to_string())?;
    writeln!(out, "ptxas: {}; compiler: {}", ptxas_path.display(), compiler.name()).map_err(io)?;
    let reg = registry();
    let jobs: Vec<(&Registered, Arch)> =
        reg.iter().flat_map(|r| archs.iter().filter(|a| r.targets.contains(a)).map(move |a| (r, *a))).collect();
    let rows = parallel_map(&jobs, |(reg, arch)| {
        let started = Instant::now();
        let ptx = reg
            .build()
            .map_err(|e| e.to_string())
            .and_then(|k| optimize(k, passes))
            .and_then(|k| compile(&k, *arch, compiler));
        let emit_ms = started.elapsed().as_secs_f64() * 1e3;
        let name = reg.id.replace('.', "_");
        let result = ptx.and_then(|ptx| {
            let report = ptxas::assemble_with(&ptxas_path, &ptx, *arch).map_err(|e| format!("ptxas FAILED: {e}"))?;
            let entry = report.entry(&name).cloned().ok_or_else(|| format!("ptxas reported no entry `{name}`"))?;
            Ok((ptx.lines().count(), entry))
        });
        CheckRow { id: reg.id.clone(), arch: *arch, emit_ms, result }
    });
    writeln!(
        out,
        "{:<34} {:<7} {:>4} {:>6} {:>7} {:>6} {:>6} {:>8}  verdict",
        "id", "target", "regs", "spill", "shared", "stack", "lines", "emit_ms"
    )
    .map_err(io)?;
    let (mut clean, mut spilled, mut failed) = (0, 0, 0);
    for row in &rows {
        match &row.result {
            Ok((lines, r)) => {
                let spill = r.spill_store_bytes + r.spill_load_bytes;
                let verdict = match (spill, compiler) {
                    (0, _) => "ok",
                    // The invariant is about what RUDA emits; NVRTC's register allocation is
                    // reported, not enforced (its output only has to assemble).
                    (_, Compiler::Nvrtc) => "spills (NVRTC; reported)",
                    (_, Compiler::Ptx) => "SPILLS",
                };
                if spill == 0 {
                    clean += 1;
                } else {
                    spilled += 1;
                }
                writeln!(
                    out,
                    "{:<34} {:<7} {:>4} {:>6} {:>7} {:>6} {:>6} {:>8.2}  {verdict}",
                    row.id,
                    row.arch.name(),
                    r.registers,
                    spill,
                    r.shared_bytes,
                    r.stack_frame_bytes,
                    lines,
                    row.emit_ms
                )
                .map_err(io)?;
            }
            Err(e) => {
                failed += 1;
                writeln!(out, "{:<34} {:<7} {e}", row.id, row.arch.name()).map_err(io)?;
            }
        }
    }
    writeln!(
        out,
        "{clean} of {} configurations assembled with zero spills; {spilled} spilled; {failed} failed",
        rows.len()
    )
    .map_err(io)?;
    Ok(failed == 0 && (spilled == 0 || compiler == Compiler::Nvrtc))
}

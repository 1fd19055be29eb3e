//! Autotuning shared by the tuned families (GEMV's split-K count in [`crate::gemv::tune`], the
//! tensor-core GEMM's tile in [`crate::gemm::tune`], decode attention's split-KV count in
//! [`crate::attention::tune`]): one tuner per GPU, and the shape files of `rudac tune --shapes`.
//!
//! Tuning measures, so it allocates and synchronises: it happens in allocating wrappers or in
//! warm-up calls before a decode step is captured; `_into` forms never tune.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use ruda_runtime::{Autotuner, Choice, DType, Device, DeviceKind, Stream, Tensor};

use crate::api::Result;
use crate::family::ShapeLine;

pub mod flow;
pub use crate::attention::tune::*;
pub use crate::gemm::tune::*;
pub use crate::gemv::tune::*;
pub use crate::moe::tune::*;

/// Launches per timed sample when tuning on a GPU (a decode GEMV takes microseconds).
pub(crate) const TUNE_ITERS: usize = 20;

/// `splits=N`, the candidate name of a split count.
pub(crate) fn split_name(splits: usize) -> String {
    format!("splits={splits}")
}

/// The process's tuner for a GPU (`None` on the CPU device), opened once per device.
pub(crate) fn tuner_for(device: &Device) -> Result<Option<Arc<Autotuner>>> {
    static TUNERS: OnceLock<Mutex<HashMap<DeviceKind, Option<Arc<Autotuner>>>>> = OnceLock::new();
    if device.is_cpu() {
        return Ok(None);
    }
    let mut map = TUNERS.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    if let Some(t) = map.get(&device.kind()) {
        return Ok(t.clone());
    }
    let t = Autotuner::for_device(device)?.map(Arc::new);
    map.insert(device.kind(), t.clone());
    Ok(t)
}

/// One line of a `rudac tune --shapes` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TuneShape {
    /// `x[m, k] · w[n, k]ᵀ` for `m ≤ 16`: the split-K count.
    Gemv { dtype: DType, m: usize, n: usize, k: usize },
    /// `x[m, k] · w[n, k]ᵀ` for `m > 16` on tensor cores (f16/bf16): the tile.
    Gemm { dtype: DType, m: usize, n: usize, k: usize },
    /// One query per sequence against a KV cache of capacity `s_max`.
    AttentionDecode(DecodeShape),
    /// The routed experts of an MoE block (f16/bf16) on `tokens · top_k` dispatched rows: the
    /// grouped GEMMs' tiles.
    MoeExperts { dtype: DType, tokens: usize, experts: usize, top_k: usize, hidden: usize, inter: usize },
}

impl std::fmt::Display for TuneShape {
    /// `gemv bf16 1x4096x4096`, `gemm bf16 512x4096x4096`, `attention_decode bf16
    /// 1x16x8x128x4096` (batch, query heads, key/value heads, head dim, capacity), `moe_experts
    /// bf16 tokens=512 experts=128 top_k=8 hidden=2048 inter=768` (its line's own form).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TuneShape::Gemv { dtype, m, n, k } => write!(f, "gemv {dtype} {m}x{n}x{k}"),
            TuneShape::Gemm { dtype, m, n, k } => write!(f, "gemm {dtype} {m}x{n}x{k}"),
            TuneShape::AttentionDecode(s) => {
                write!(
                    f,
                    "attention_decode {} {}x{}x{}x{}x{}",
                    s.dtype, s.batch, s.q_heads, s.kv_heads, s.head_dim, s.s_max
                )
            }
            TuneShape::MoeExperts { dtype, tokens, experts, top_k, hidden, inter } => write!(
                f,
                "moe_experts {dtype} tokens={tokens} experts={experts} top_k={top_k} hidden={hidden} inter={inter}"
            ),
        }
    }
}

/// The format of a shapes file, for messages: every tuned family's lines
/// ([`Family::shape_lines`](crate::family::Family::shape_lines)).
pub fn shapes_format() -> String {
    let forms: Vec<&str> = shape_lines().map(|l| l.format).collect();
    let ops = match forms.split_last() {
        Some((last, [])) => last.to_string(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        None => "none".into(),
    };
    format!(
        "one op per line: {ops}; DTYPE f32, f16 or bf16; every dimension ≥ 1; the keys in any order; blank lines and \
         `#` comments are ignored"
    )
}

/// Every family's shape-file lines, in registry order.
fn shape_lines() -> impl Iterator<Item = &'static ShapeLine> {
    crate::registry::families().flat_map(|f| f.shape_lines().iter())
}

/// Parse a shapes file: the op word picks the family's line, which names the dimensions and
/// checks the shape. Errors name `file:line`.
pub fn parse_shapes(file: &str, text: &str) -> std::result::Result<Vec<TuneShape>, String> {
    let mut shapes = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = |message: String| format!("{file}:{}: {message} (expected {})", i + 1, shapes_format());
        let mut words = line.split_whitespace();
        let op = words.next().unwrap_or_default();
        let Some(kind) = shape_lines().find(|l| l.op == op) else {
            let ops: Vec<&str> = shape_lines().map(|l| l.op).collect();
            return Err(bad(format!("unknown op `{op}`; tunable ops: {}", ops.join(", "))));
        };
        let names = kind.dims;
        let dtype_word = words.next().ok_or_else(|| bad("missing the dtype".into()))?;
        let dtype = DType::from_name(dtype_word)
            .filter(|d| d.is_float())
            .ok_or_else(|| bad(format!("`{dtype_word}` is not f32, f16 or bf16")))?;
        let mut values: Vec<Option<usize>> = vec![None; names.len()];
        for word in words {
            let (name, value) = word.split_once('=').ok_or_else(|| bad(format!("`{word}` is not NAME=VALUE")))?;
            let slot = names
                .iter()
                .position(|n| *n == name)
                .map(|j| &mut values[j])
                .ok_or_else(|| bad(format!("unknown dimension `{name}`")))?;
            if slot.is_some() {
                return Err(bad(format!("`{name}` given twice")));
            }
            let v: usize = value.parse().map_err(|_| bad(format!("`{word}`: not a positive integer")))?;
            if v == 0 || u32::try_from(v).is_err() {
                return Err(bad(format!("`{word}`: must be between 1 and {}", u32::MAX)));
            }
            *slot = Some(v);
        }
        let dims = names
            .iter()
            .zip(&values)
            .map(|(name, v)| v.ok_or_else(|| bad(format!("missing `{name}=`"))))
            .collect::<std::result::Result<Vec<usize>, String>>()?;
        shapes.push((kind.parse)(dtype, &dims).map_err(bad)?);
    }
    Ok(shapes)
}

/// [`parse_shapes`] of a file on disk.
pub fn read_shapes(path: &Path) -> std::result::Result<Vec<TuneShape>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse_shapes(&path.display().to_string(), &text)
}

/// Tune one shape on `stream`'s GPU with zero-filled operands (timing does not depend on the
/// values): the choice (its candidate's name is `splits=N` or a tile such as `tc128x128w4.s3`),
/// or `None` when tuning does not apply (CPU device, `RUDA_AUTOTUNE=off`).
pub fn tune_shape(stream: &Stream, shape: &TuneShape) -> Result<Option<Choice>> {
    match shape {
        TuneShape::Gemv { dtype, m, n, k } => {
            let x = Tensor::zeros(stream.device(), *dtype, &[*m, *k])?;
            let w = Tensor::zeros(stream.device(), *dtype, &[*n, *k])?;
            Ok(tuned_gemv(stream, &x, &w)?.map(|(_, t)| t.choice))
        }
        TuneShape::Gemm { dtype, m, n, k } => tune_gemm_shape(stream, *dtype, *m, *n, *k),
        TuneShape::AttentionDecode(s) => tune_decode_shape(stream, s),
        TuneShape::MoeExperts { dtype, tokens, experts, top_k, hidden, inter } => {
            tune_experts_shape(stream, *dtype, [*tokens, *experts, *top_k, *hidden, *inter])
        }
    }
}

/// A text progress bar, `[#####...............] 3/12`, for tuning many shapes.
pub fn progress_bar(done: usize, total: usize) -> String {
    const WIDTH: usize = 20;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH).min(WIDTH);
    format!("[{}{}] {done}/{total}", "#".repeat(filled), ".".repeat(WIDTH - filled))
}

/// What `rudac tune` does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TuneCommand {
    /// `--shapes FILE`: tune every shape of the file on the `RUDA_DEVICE` GPU.
    Shapes(std::path::PathBuf),
    /// `--show`: print the cache of the current GPU, or every cache file without a GPU.
    Show,
}

/// How `rudac tune` reports its shapes: an `indicatif` bar with each result printed above it
/// when writing to the process's standard error on a terminal, else one plain line per shape
/// (`[#####...............] 3/12 SHAPE: RESULT`, see [`progress_bar`]), which logs and tests
/// read.
pub enum Progress<'a> {
    Bar(indicatif::ProgressBar),
    Lines(&'a mut dyn std::io::Write),
}

impl<'a> Progress<'a> {
    /// A bar for `total` shapes when `writer` is standard error on a terminal, else plain lines
    /// to `writer`.
    pub fn new<W: std::io::Write + 'static>(writer: &'a mut W, total: usize) -> Progress<'a> {
        use std::io::IsTerminal;
        let is_stderr = (writer as &mut dyn std::any::Any).is::<std::io::Stderr>();
        if is_stderr && std::io::stderr().is_terminal() {
            let bar = indicatif::ProgressBar::new(total as u64);
            if let Ok(style) = indicatif::ProgressStyle::with_template("[{bar:20}] {pos}/{len} {msg}") {
                bar.set_style(style.progress_chars("#>."));
            }
            Progress::Bar(bar)
        } else {
            Progress::Lines(writer)
        }
    }

    /// Shape `done` of `total` finished with `result`.
    pub fn shape(&mut self, done: usize, total: usize, shape: &TuneShape, result: &str) -> std::io::Result<()> {
        match self {
            Progress::Bar(bar) => {
                bar.println(format!("{shape}: {result}"));
                bar.set_position(done as u64);
                Ok(())
            }
            Progress::Lines(w) => writeln!(w, "{} {shape}: {result}", progress_bar(done, total)),
        }
    }

    /// Every shape is done.
    pub fn finish(self) {
        if let Progress::Bar(bar) = self {
            bar.finish_and_clear();
        }
    }
}

/// Run `rudac tune`: results and listings to `out`, the progress of each shape to `progress`
/// ([`Progress`]). `Ok(false)` when some shape failed to tune.
pub fn run_tune<W: std::io::Write + 'static>(
    command: &TuneCommand,
    out: &mut dyn std::io::Write,
    progress: &mut W,
) -> std::result::Result<bool, String> {
    let io = |e: std::io::Error| e.to_string();
    match command {
        TuneCommand::Shapes(path) => {
            let shapes = read_shapes(path)?;
            let device = Device::from_env().map_err(|e| e.to_string())?;
            let mode = ruda_runtime::AutotuneMode::from_env(&device).map_err(|e| e.to_string())?;
            if device.is_cpu() || mode == ruda_runtime::AutotuneMode::Off {
                let why = if device.is_cpu() { "autotuning is off on the CPU device" } else { "RUDA_AUTOTUNE=off" };
                writeln!(out, "{why}: {} shape(s) in {} are valid; nothing tuned", shapes.len(), path.display())
                    .map_err(io)?;
                return Ok(true);
            }
            let stream = device.default_stream();
            let mut failed = 0;
            let mut progress = Progress::new(progress, shapes.len());
            for (i, shape) in shapes.iter().enumerate() {
                let line = match tune_shape(&stream, shape) {
                    Ok(Some(c)) => format!(
                        "best {} ({}){}",
                        c.candidate.name,
                        c.median_ms.map_or("not measured".into(), |ms| format!("{ms:.4} ms")),
                        if c.cached { ", cached" } else { "" }
                    ),
                    Ok(None) => "not tunable here".into(),
                    Err(e) => {
                        failed += 1;
                        format!("FAILED: {e}")
                    }
                };
                progress.shape(i + 1, shapes.len(), shape, &line).map_err(io)?;
            }
            progress.finish();
            if let Some(t) = tuner_for(&device).map_err(|e| e.to_string())? {
                writeln!(
                    out,
                    "tuned {} of {} shape(s) on {}; cache: {}",
                    shapes.len() - failed,
                    shapes.len(),
                    device.description(),
                    t.path().display()
                )
                .map_err(io)?;
            }
            Ok(failed == 0)
        }
        TuneCommand::Show => {
            let device = Device::from_env().map_err(|e| e.to_string())?;
            if let Some(t) = tuner_for(&device).map_err(|e| e.to_string())? {
                let file = t.snapshot();
                if file.entries.is_empty() {
                    writeln!(out, "no autotuning results for {} yet ({})", file.fingerprint, t.path().display())
                        .map_err(io)?;
                } else {
                    write!(out, "{}: {}", t.path().display(), file.render()).map_err(io)?;
                }
                return Ok(true);
            }
            let dir = ruda_runtime::cache_dir_from_env().map_err(|e| e.to_string())?.join("autotune");
            let mut files: Vec<_> = match std::fs::read_dir(&dir) {
                Ok(entries) => entries
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|x| x == "json"))
                    .collect(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
                Err(e) => return Err(format!("{}: {e}", dir.display())),
            };
            files.sort();
            if files.is_empty() {
                writeln!(out, "no autotune cache files in {}", dir.display()).map_err(io)?;
            }
            for p in files {
                match ruda_runtime::CacheFile::read(&p) {
                    Ok(f) => write!(out, "{}: {}", p.display(), f.render()).map_err(io)?,
                    Err(e) => writeln!(out, "{e}").map_err(io)?,
                }
            }
            Ok(true)
        }
    }
}

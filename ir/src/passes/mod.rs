//! The pass manager and the optimisation passes.
//!
//! A pass rewrites a verified kernel in place and must preserve the interpreter's result bit
//! for bit (the property tests check this for every pass). Instructions and values a pass
//! removes stay in the arenas, unreachable from the regions; the printer and backends only walk
//! what the regions reach.

use std::path::{Path, PathBuf};

use crate::kernel::Kernel;
use crate::print::print_kernel_with_locs;
use crate::verify::{verify, VerifyError};

/// One optimisation pass.
pub trait Pass: Send + Sync {
    /// Short name used on the command line (`--passes fold,cse,dce`).
    fn name(&self) -> &'static str;
    /// One line for `rudac passes`.
    fn description(&self) -> &'static str;
    /// Rewrite `kernel`; return whether anything changed.
    fn run(&self, kernel: &mut Kernel) -> bool;
}

/// Why a pipeline could not run.
#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("unknown pass `{name}`; known passes: {known} (or `none`, `default`)")]
    UnknownPass { name: String, known: String },
    #[error("pass `{pass}` produced IR that does not verify (a bug in the pass): {error}")]
    BrokeVerifier { pass: &'static str, error: VerifyError },
    #[error("RUDA_DUMP_IR: cannot write {path}: {error}")]
    Dump { path: PathBuf, error: std::io::Error },
}

/// Every pass, in the order of the default pipeline.
pub fn all_passes() -> Vec<Box<dyn Pass>> {
    vec![]
}

/// Parse a pipeline: `none`, `default`, or pass names separated by commas.
pub fn parse_pipeline(spec: &str) -> Result<Vec<Box<dyn Pass>>, PassError> {
    match spec.trim() {
        "none" | "" => return Ok(vec![]),
        "default" => return Ok(all_passes()),
        _ => {}
    }
    spec.split(',')
        .map(|name| {
            let name = name.trim();
            all_passes().into_iter().find(|p| p.name() == name).ok_or_else(|| PassError::UnknownPass {
                name: name.to_string(),
                known: all_passes().iter().map(|p| p.name()).collect::<Vec<_>>().join(", "),
            })
        })
        .collect()
}

/// Run `passes` in order, verifying after each; with `dump`, write the IR before the first pass
/// and after each one to `dump/<kernel>.<NN>-<pass>.rir`.
pub fn run_pipeline(kernel: &mut Kernel, passes: &[Box<dyn Pass>], dump: Option<&Path>) -> Result<(), PassError> {
    let write = |kernel: &Kernel, step: usize, name: &str| -> Result<(), PassError> {
        let Some(dir) = dump else { return Ok(()) };
        let path = dir.join(format!("{}.{step:02}-{name}.rir", kernel.name));
        std::fs::create_dir_all(dir)
            .and_then(|_| std::fs::write(&path, print_kernel_with_locs(kernel)))
            .map_err(|error| PassError::Dump { path, error })
    };
    write(kernel, 0, "input")?;
    for (i, pass) in passes.iter().enumerate() {
        pass.run(kernel);
        verify(kernel).map_err(|error| PassError::BrokeVerifier { pass: pass.name(), error })?;
        write(kernel, i + 1, pass.name())?;
    }
    Ok(())
}

/// The default pipeline, dumping to `RUDA_DUMP_IR` when it is set.
pub fn optimize(kernel: &mut Kernel) -> Result<(), PassError> {
    let dump = std::env::var_os("RUDA_DUMP_IR").filter(|d| !d.is_empty()).map(PathBuf::from);
    run_pipeline(kernel, &all_passes(), dump.as_deref())
}

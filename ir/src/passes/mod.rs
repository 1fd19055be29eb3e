//! The pass manager and the optimisation passes.
//!
//! A pass rewrites a verified kernel in place and must preserve the interpreter's result bit
//! for bit (the property tests check this for every pass). Instructions and values a pass
//! removes stay in the arenas, unreachable from the regions; the printer and backends only walk
//! what the regions reach.
//!
//! The passes (each module documents its rules and why they are exact):
//!
//! | name | what it does |
//! | --- | --- |
//! | `fold` | constant folding: pure ops on constants (as the interpreter computes them), `select`/`if` on constant conditions, loops that never run |
//! | `simplify` | exact algebraic identities, constants to the right and combined, multiplies/divides/remainders by powers of two as shifts and masks |
//! | `cse` | common-subexpression elimination over the region tree (loads only within one memory epoch) |
//! | `licm` | loop-invariant code motion: pure ops, and loads of loops that write no memory and surely run |
//! | `unroll` | unrolling of constant-trip loops: fully up to 16 iterations, else by 4 with the remainder as copies |
//! | `addr-fold` | address arithmetic as `ptradd(ptradd(base, i), constant)`, constant offsets combined, for `[reg+imm]` addressing |
//! | `vectorize` | adjacent aligned scalar loads of one base merged into a vector load and extracts |
//! | `dce` | dead-code elimination: unused pure values, `if` results, loop-carried values, empty `if`s and finite loops |
//!
//! No pass adds work on any path: each rewrite removes an instruction or replaces one by a
//! cheaper one, except unrolling (bounded by its budgets) and the signed power-of-two division,
//! four integer instructions instead of a division. Operations that may fail (loads, integer
//! division without a non-zero constant divisor, shuffles and votes) are never removed, and
//! never moved before another that may fail, so a kernel that fails still fails (with one
//! exception, documented in `vectorize`: the vector load's error replaces the scalar load's).
//!
//! [`DEFAULT_PIPELINE`] runs some passes twice: unrolling exposes constants for `fold` and
//! `simplify`, and `addr-fold` exposes common bases for `cse` and invariants for `licm`.

use std::path::{Path, PathBuf};

mod addr_fold;
mod cse;
mod dce;
mod eval;
mod fold;
mod licm;
mod ranges;
mod simplify;
mod unroll;
mod util;
mod vectorize;

pub use addr_fold::AddrFold;
pub use cse::Cse;
pub use dce::Dce;
pub use fold::Fold;
pub use licm::Licm;
pub use simplify::Simplify;
pub use unroll::{Unroll, FULL_MAX_INSTS, FULL_MAX_TRIPS, PARTIAL_FACTOR, PARTIAL_MAX_BODY};
pub use vectorize::Vectorize;

use crate::kernel::Kernel;
use crate::print::print_kernel_with_locs;
use crate::verify::{verify_form, VerifyError};

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
    BrokeVerifier { pass: &'static str, error: Box<VerifyError> },
    #[error("RUDA_DUMP_IR: cannot write {path}: {error}")]
    Dump { path: PathBuf, error: std::io::Error },
}

/// The default pipeline, by pass name.
pub const DEFAULT_PIPELINE: &[&str] = &[
    "fold",
    "simplify",
    "cse",
    "licm",
    "unroll",
    "fold",
    "simplify",
    "cse",
    "addr-fold",
    "cse",
    "licm",
    "vectorize",
    "dce",
];

/// Every pass once, in the order of its first run in the default pipeline.
pub fn all_passes() -> Vec<Box<dyn Pass>> {
    vec![
        Box::new(Fold),
        Box::new(Simplify),
        Box::new(Cse),
        Box::new(Licm),
        Box::new(Unroll),
        Box::new(AddrFold),
        Box::new(Vectorize),
        Box::new(Dce),
    ]
}

/// The passes of [`DEFAULT_PIPELINE`], in order.
pub fn default_pipeline() -> Vec<Box<dyn Pass>> {
    DEFAULT_PIPELINE.iter().filter_map(|name| all_passes().into_iter().find(|p| p.name() == *name)).collect()
}

/// Parse a pipeline: `none`, `default`, or pass names separated by commas.
pub fn parse_pipeline(spec: &str) -> Result<Vec<Box<dyn Pass>>, PassError> {
    match spec.trim() {
        "none" | "" => return Ok(vec![]),
        "default" => return Ok(default_pipeline()),
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
        verify_form(kernel).map_err(|error| PassError::BrokeVerifier { pass: pass.name(), error: Box::new(error) })?;
        write(kernel, i + 1, pass.name())?;
    }
    Ok(())
}

/// The default pipeline, dumping to `RUDA_DUMP_IR` when it is set.
pub fn optimize(kernel: &mut Kernel) -> Result<(), PassError> {
    let dump = std::env::var_os("RUDA_DUMP_IR").filter(|d| !d.is_empty()).map(PathBuf::from);
    run_pipeline(kernel, &default_pipeline(), dump.as_deref())
}

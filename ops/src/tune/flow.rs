//! One tuning flow for every tuned family: a family says what its tuning key is, which
//! candidate values it tries (its heuristic's first: the choice when tuning is off), what each
//! is called in the cache, and which kernels they run; [`tune`] measures them through the
//! device's [`Autotuner`] and [`run_tuned`] runs the choice, falling back to the next-best
//! candidate when a cached one fails.
//!
//! Candidates are values (a split count, a [`crate::gemm::tile::GemmTile`]); their names are
//! only what the cache stores, and a cached choice is read back by its position in the
//! candidate set, whose checksum covers the names and the kernels. The kernels enter the
//! checksum by their IR printed *without* source locations ([`ir_digest`]), so moving a line of
//! a kernel builder does not re-tune; the checksum also folds in [`CANDIDATE_FORMAT`], so a
//! cache written before this scheme is ignored (re-measured), never misread.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, OnceLock};

use ruda_ir::fnv1a64;
use ruda_runtime::{Autotuner, CandidateSet, Choice, Device, HashedKernel, Launchable, TuneKey};

use crate::error::{OpError, Result};

/// Folded into every candidate set's checksum: bump it when the meaning of cached names
/// changes, so older entries are re-measured.
pub const CANDIDATE_FORMAT: &str = "ruda-ops candidates v2 (location-free IR digests)";

/// The kernels a family's candidates run: their digest goes into the candidate set's checksum.
pub type Kernels = Vec<Arc<HashedKernel>>;

/// A family's tuned choice.
pub trait Tuned {
    /// One configuration the op can run in.
    type Candidate: Copy + PartialEq + Debug;

    /// The problem's dimensions the candidates depend on (`[m, n, k]`).
    type Dims: Copy;

    /// The op's name in messages.
    const OP: &'static str;

    /// The candidate's name in the cache (`splits=4`, `tc128x64.s3`).
    fn name(candidate: &Self::Candidate) -> String;

    /// The candidates for a problem of `dims` under `key` on `device`, the heuristic's first,
    /// and the kernels they run. Every problem of one key must get the same candidates (a set
    /// that differed would invalidate the key's cached choice each time), so the heuristic
    /// sees the key's bucketed shape.
    fn candidates(device: &Device, key: &TuneKey, dims: Self::Dims) -> Result<(Vec<Self::Candidate>, Kernels)>;
}

/// FNV-1a over [`CANDIDATE_FORMAT`] and the kernels' IR printed without source locations.
pub fn ir_digest(kernels: &[Arc<HashedKernel>]) -> u64 {
    let mut text = String::from(CANDIDATE_FORMAT);
    for k in kernels {
        text.push_str(&format!("\n{:016x}", location_free_hash(k)));
    }
    fnv1a64(text.as_bytes())
}

/// FNV-1a of a kernel's IR printed without locations, computed once per kernel (by its
/// IR hash with locations, which [`HashedKernel`] holds).
fn location_free_hash(k: &HashedKernel) -> u64 {
    static DIGESTS: OnceLock<Mutex<HashMap<u64, u64>>> = OnceLock::new();
    let map = DIGESTS.get_or_init(Default::default);
    if let Some(&h) = map.lock().unwrap_or_else(|e| e.into_inner()).get(&k.ir_hash()) {
        return h;
    }
    let h = fnv1a64(ruda_ir::print::print_kernel(k.kernel()).as_bytes());
    map.lock().unwrap_or_else(|e| e.into_inner()).insert(k.ir_hash(), h);
    h
}

/// A family's candidates as the tuner sees them, beside their values.
pub struct Candidates<T: Tuned> {
    pub values: Vec<T::Candidate>,
    pub set: CandidateSet,
}

impl<T: Tuned> Candidates<T> {
    /// The candidates for `dims` under `key` on `device`.
    pub fn new(device: &Device, key: &TuneKey, dims: T::Dims) -> Result<Candidates<T>> {
        let (values, kernels) = T::candidates(device, key, dims)?;
        let set = CandidateSet::new(values.iter().map(T::name), ir_digest(&kernels));
        Ok(Candidates { values, set })
    }

    /// The value of a choice the tuner made from this set.
    pub fn value(&self, choice: &Choice) -> Result<T::Candidate> {
        self.values.get(choice.index).copied().filter(|v| T::name(v) == choice.candidate.name).ok_or_else(|| {
            OpError::InvalidArgument {
                op: T::OP,
                message: format!("autotune chose `{}`, which is not one of its candidates", choice.candidate.name),
            }
        })
    }
}

/// What [`tune`] chose: the candidate's value and the tuner's record of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Tuning<C> {
    pub value: C,
    pub choice: Choice,
}

/// The candidate `tuner` picks for `key`, measuring each with `measure` (median milliseconds,
/// or why it failed) on a cache miss. Testable with injected timings.
pub fn tune<T: Tuned>(
    tuner: &Autotuner,
    device: &Device,
    key: &TuneKey,
    dims: T::Dims,
    mut measure: impl FnMut(T::Candidate) -> std::result::Result<f64, String>,
) -> Result<Tuning<T::Candidate>> {
    let c = Candidates::<T>::new(device, key, dims)?;
    let choice = tuner.tune(key, &c.set, |cand| {
        let i = c.set.candidates.iter().position(|x| x == cand).ok_or("not a candidate of this set")?;
        measure(c.values[i])
    })?;
    Ok(Tuning { value: c.value(&choice)?, choice })
}

/// Run `tuning`'s choice with `run`; when a cached choice fails, evict it and run the
/// next-best candidate instead.
pub fn run_tuned<T: Tuned, R>(
    tuner: &Autotuner,
    device: &Device,
    key: &TuneKey,
    dims: T::Dims,
    tuning: &Tuning<T::Candidate>,
    run: impl Fn(T::Candidate) -> Result<R>,
) -> Result<R> {
    match run(tuning.value) {
        Err(_) if tuning.choice.cached => {
            let c = Candidates::<T>::new(device, key, dims)?;
            let next = tuner.evict_and_fall_back(key, &c.set, &tuning.choice.candidate.name)?;
            run(c.value(&next)?)
        }
        other => other,
    }
}

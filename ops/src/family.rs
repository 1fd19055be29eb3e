//! What the registry, the sample problems and the shape files ask of an op family. A family
//! implements [`Family`] in its folder and adds one line to [`crate::registry::FAMILIES`];
//! nothing outside its folder switches on its name.

use ruda_runtime::DType;

use crate::problem::Case;
use crate::registry::Registered;
use crate::tune::TuneShape;

/// One op family.
pub trait Family: Sync {
    /// The family names its configurations carry ([`Registered::family`]); usually one, two
    /// where a family registers a companion kernel (`rope` and `rope_kv_cache`).
    fn names(&self) -> &'static [&'static str];

    /// Its registered configurations, in a stable order (what `rudac list` prints).
    fn configs(&self) -> Vec<Registered>;

    /// The launch of configuration `id` of family name `name` as a sample problem: a grid of a
    /// few blocks and scalars that keep every access in bounds. `None` when `id` does not say
    /// enough (a head dim, a tile).
    fn sample(&self, name: &str, id: &str) -> Option<Case>;

    /// The lines of a `rudac tune --shapes` file this family reads (none unless it is tuned).
    fn shape_lines(&self) -> &'static [ShapeLine] {
        &[]
    }
}

/// One kind of line of a shapes file: `OP DTYPE NAME=VALUE ...`.
pub struct ShapeLine {
    /// The first word (`gemv`).
    pub op: &'static str,
    /// The dimension names, in the order `parse` receives their values.
    pub dims: &'static [&'static str],
    /// The line's form for messages: `` `gemv DTYPE m=M n=N k=K` (1 ≤ M ≤ 16) ``.
    pub format: &'static str,
    /// The shape of a line whose dtype is a float and whose dimensions are all given, each in
    /// `1..=u32::MAX`; an error says what else is wrong with it.
    pub parse: fn(DType, &[usize]) -> Result<TuneShape, String>,
}

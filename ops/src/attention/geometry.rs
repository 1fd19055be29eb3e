//! The flash kernels' tile shape for a pair of head dims, their block size and registered head
//! dims, and the head-dim part of configuration ids.

/// Threads per block of the flash kernels (prefill and decode).
pub const THREADS: u32 = 128;
/// Keys per online-softmax step (scores live in registers for one chunk at a time).
pub const CHUNK: u32 = 4;
/// Elements of one staged tile (`BC · D`): K and V tiles take 16 KiB of shared memory, and
/// each thread has 4 vector loads per tensor in flight (more made ptxas spill on sm_80).
pub(super) const TILE_ELEMS: u32 = 2048;
/// Most keys per tile: the masked kernels stage a `rows × (BC + 1)` bias tile as well, and
/// with one lane per row (small head dims) 256 rows of 33 keys already take 33 KiB.
pub(super) const MAX_TILE_KEYS: u32 = 32;
/// Registers of `q` plus accumulator a lane may keep (`rows per lane · (q dims + v dims)`):
/// 64, as at D = 64, 128 and 256, keeps every configuration within 128 registers.
pub(super) const LANE_VALUES: u32 = 64;
/// Head dims (of `q`/`k` and of `v`) the flash kernels take: any in this range.
pub const FLASH_HEAD_DIM_RANGE: std::ops::RangeInclusive<u32> = 1..=1024;
/// Head dims with registered (checked, snapshotted) flash configurations, `Dv = D`: the
/// common ones, whose tiles fit them exactly or nearly (others are built on first use).
pub const FLASH_HEAD_DIMS: [u32; 6] = [64, 80, 96, 128, 192, 256];
/// `(D, Dv)` pairs registered for the general path: a scalar-load dim, padded dims, a
/// value head dim other than the key's (both ways), and the largest.
pub const FLASH_GENERAL_HEAD_DIMS: [(u32, u32); 6] =
    [(1, 1), (48, 32), (64, 128), (112, 112), (200, 200), (1024, 1024)];
/// Threads per block of the fallback softmax.
pub const SOFTMAX_THREADS: u32 = 256;

/// The tile shape for a pair of head dims.
///
/// Each of a lane's `rows_per_lane` query rows is shared by a group of `G` lanes, lane `g`
/// owning the 4-wide runs of dimensions `4g + 4G·r` (`r < runs_k` of `q`, `r < runs_v` of the
/// accumulator): the smallest power-of-two `G` (two rows per lane when they fit, else one)
/// whose runs keep `LANE_VALUES` registers. Dims past `D` (or `Dv`) are padding: loaded as
/// zeros and never stored, and the tiles are staged at the padded widths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub head_dim: u32,
    pub v_head_dim: u32,
    /// Lanes sharing a row (each owning `4 · runs` of the row's dimensions).
    pub group: u32,
    /// Query rows per lane: each K or V element read from shared memory feeds this many FMAs.
    pub rows_per_lane: u32,
    /// Query rows per block.
    pub rows: u32,
    /// Keys per shared-memory tile.
    pub keys: u32,
    /// 4-wide runs of `q` (and K) dimensions per lane.
    pub runs_k: u32,
    /// 4-wide runs of accumulator (and V) dimensions per lane.
    pub runs_v: u32,
}

impl Geometry {
    /// The geometry of `D = head_dim`, `Dv = v_head_dim` (each in [`FLASH_HEAD_DIM_RANGE`]).
    pub fn new(head_dim: u32, v_head_dim: u32) -> Geometry {
        let (d, dv) = (head_dim.max(1), v_head_dim.max(1));
        let fits = |rl: u32, g: u32| rl * 4 * (d.div_ceil(4 * g) + dv.div_ceil(4 * g)) <= LANE_VALUES;
        let (rows_per_lane, group) = [2, 1]
            .into_iter()
            .flat_map(|rl| [1, 2, 4, 8, 16, 32].map(|g| (rl, g)))
            .find(|&(rl, g)| fits(rl, g))
            .unwrap_or((1, 32));
        let (runs_k, runs_v) = (d.div_ceil(4 * group), dv.div_ceil(4 * group));
        let width = 4 * group * runs_k.max(runs_v);
        let keys = (TILE_ELEMS / width).max(1);
        let keys = (1 << keys.ilog2()).clamp(CHUNK, MAX_TILE_KEYS);
        let rows = THREADS / group * rows_per_lane;
        Geometry { head_dim, v_head_dim, group, rows_per_lane, rows, keys, runs_k, runs_v }
    }

    /// Padded widths of a K and a V tile row.
    pub(super) fn width_k(&self) -> u32 {
        4 * self.group * self.runs_k
    }
    pub(super) fn width_v(&self) -> u32 {
        4 * self.group * self.runs_v
    }

    /// The blocks per SM the kernels ask ptxas to fit (measured with ptxas 12.9 on every
    /// registered configuration, so that none spills): none where K and V rows have one
    /// power-of-two width, as at D = 64, 128, 256, which ptxas gives 128 registers unasked;
    /// else 4 (128 registers), which left to itself ptxas cuts to 96 and spills; 3 for groups
    /// of 16 or more lanes, whose butterflies need more than 128 there.
    pub fn min_blocks(&self) -> Option<u32> {
        let (wk, wv) = (self.width_k(), self.width_v());
        if wk == wv && wk.is_power_of_two() {
            None
        } else if self.group >= 16 {
            Some(3)
        } else {
            Some(4)
        }
    }

    /// Whether rows may be read 4 elements at a time (both head dims multiples of 4; the
    /// tensors then start at a multiple of 4 elements too, which the entry points check).
    pub fn vector(&self) -> bool {
        self.head_dim.is_multiple_of(4) && self.v_head_dim.is_multiple_of(4)
    }
}

/// The id suffix of a pair of head dims: `d64`, or `d48v32` when `Dv ≠ D`.
pub(super) fn dims_id(head_dim: u32, v_head_dim: u32) -> String {
    if head_dim == v_head_dim {
        format!("d{head_dim}")
    } else {
        format!("d{head_dim}v{v_head_dim}")
    }
}

/// `(D, Dv)` of a flash configuration id (`d64` or `d48v32` among its dotted parts), for
/// the sample problems.
pub fn head_dims_of_id(id: &str) -> Option<(u32, u32)> {
    id.split('.').find_map(|p| {
        let rest = p.strip_prefix('d')?;
        match rest.split_once('v') {
            Some((d, v)) => Some((d.parse().ok()?, v.parse().ok()?)),
            None => rest.parse().ok().map(|d| (d, d)),
        }
    })
}

//! The tensor-core GEMM's tiles: the block tile and warp layout ([`TcTile`]), the `k` depth of a
//! staged tile ([`BK`]) and the pipeline depths ([`STAGES`]); the pair the host picks
//! ([`GemmTile`]) and the heuristic that picks it when tuning is off.

use ruda_runtime::Device;

/// The pipeline depths built: shared-memory stages filled by `cp.async`.
pub const STAGES: [u32; 2] = [2, 3];

/// Depth in `k` of a staged tile.
pub const BK: u32 = 32;

/// The block tile and its warp layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TcTile {
    /// 4 warps of 32 × 32.
    T64x64,
    /// 4 warps of 32 × 64.
    T64x128,
    /// 4 warps of 64 × 32.
    T128x64,
    /// 8 warps (2 × 4) of 64 × 32.
    T128x128,
    /// 4 warps of 64 × 64: half the `ldmatrix` traffic per mma of the 8-warp tile, at twice
    /// the accumulator registers.
    T128x128W4,
}

impl TcTile {
    pub const ALL: [TcTile; 5] =
        [TcTile::T64x64, TcTile::T64x128, TcTile::T128x64, TcTile::T128x128, TcTile::T128x128W4];

    /// `(BM, BN)`.
    pub fn dims(self) -> (u32, u32) {
        match self {
            TcTile::T64x64 => (64, 64),
            TcTile::T64x128 => (64, 128),
            TcTile::T128x64 => (128, 64),
            TcTile::T128x128 | TcTile::T128x128W4 => (128, 128),
        }
    }

    /// Warps along `m` and along `n`.
    pub fn warps(self) -> (u32, u32) {
        match self {
            TcTile::T128x128 => (2, 4),
            _ => (2, 2),
        }
    }

    pub fn threads(self) -> u32 {
        let (a, b) = self.warps();
        32 * a * b
    }

    /// `(WM, WN)`: the warp tile.
    pub fn warp_tile(self) -> (u32, u32) {
        let ((bm, bn), (wm, wn)) = (self.dims(), self.warps());
        (bm / wm, bn / wn)
    }

    /// `tc128x64`, the id part (`w4` marks the 4-warp variant of a tile).
    pub fn name(self) -> String {
        let (bm, bn) = self.dims();
        let w4 = if self == TcTile::T128x128W4 { "w4" } else { "" };
        format!("tc{bm}x{bn}{w4}")
    }

    pub fn from_name(name: &str) -> Option<TcTile> {
        TcTile::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// A tensor-core GEMM configuration the host may pick (by heuristic or autotuning): the block
/// tile and the number of shared-memory stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GemmTile {
    pub tile: TcTile,
    pub stages: u32,
}

impl GemmTile {
    /// Every configuration `linear` can run: each tile (smallest first) at each pipeline depth.
    pub fn all() -> Vec<GemmTile> {
        TcTile::ALL.into_iter().flat_map(|tile| STAGES.map(|stages| GemmTile { tile, stages })).collect()
    }

    /// `tc128x64.s3`: the autotuning candidate name.
    pub fn name(&self) -> String {
        format!("{}.s{}", self.tile.name(), self.stages)
    }

    pub fn from_name(name: &str) -> Option<GemmTile> {
        GemmTile::all().into_iter().find(|t| t.name() == name)
    }
}

/// SMs assumed where the device does not say (the CPU device).
const DEFAULT_SMS: usize = 108;

/// The tile `linear` uses for an `M × N` output when tuning is off: the largest tile that
/// still gives every SM a block (128 × 128 for large outputs, 64 × 64 for small ones). At
/// 128 × 128 the 4-warp variant: `mma.sync` GEMMs are bound by `ldmatrix` bandwidth, and its
/// 64 × 64 warp tiles load 8 fragments per 32 mma where 64 × 32 ones load 6 per 16.
pub fn heuristic_gemm_tile(device: &Device, m: usize, n: usize) -> GemmTile {
    let sms = device.cuda_info().map_or(DEFAULT_SMS, |i| i.multiprocessor_count as usize);
    let blocks = |t: TcTile| {
        let (bm, bn) = t.dims();
        m.div_ceil(bm as usize) * n.div_ceil(bn as usize)
    };
    let tile = [TcTile::T128x128W4, TcTile::T128x64, TcTile::T64x128]
        .into_iter()
        .find(|&t| {
            let (bm, bn) = t.dims();
            m >= bm as usize && n >= bn as usize && blocks(t) >= sms
        })
        .unwrap_or(TcTile::T64x64);
    // The deepest pipeline: 48 KiB of shared memory at 128 × 128, still two blocks per SM.
    GemmTile { tile, stages: STAGES[STAGES.len() - 1] }
}

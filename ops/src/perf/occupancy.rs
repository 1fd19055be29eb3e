//! Theoretical occupancy: how many warps of a kernel an SM holds at once, and which resource
//! runs out first, by the rules of NVIDIA's CUDA occupancy calculator (`cuda_occupancy.h`,
//! `cudaOccMaxActiveBlocksPerMultiprocessor`) with each architecture's limits from the CUDA C++
//! Programming Guide's "Technical Specifications per Compute Capability" table.
//!
//! The calculator's rules, for a block of `W = ceil(threads / 32)` warps:
//!
//! - warps: `floor(max warps per SM / W)` blocks;
//! - blocks: the per-SM block limit;
//! - registers: a warp is allocated `registers x 32` rounded up to 256 (so registers per
//!   thread round up to a multiple of 8); each of the SM's 4 sub-partitions holds
//!   `floor(16,384 / that)` warps (the 65,536 registers are split among them and a warp lives
//!   in one), so `floor(4 x that / W)` blocks. A block whose `W x` allocation exceeds the
//!   65,536 registers a block may have, or whose allocation times `W` rounded up to a multiple
//!   of 4 does (the hardware's check), or above 255 registers per thread, cannot run;
//! - shared memory: a block is allocated its static plus dynamic bytes plus 1 KiB the driver
//!   reserves per block (sm_80 and later), rounded up to 128 bytes; the SM's shared memory at
//!   the largest carveout divided by that, in whole blocks. A block above the per-block
//!   maximum (opt-in) plus the reserve cannot run.
//!
//! The result is an upper bound the hardware may not reach: it ignores the L1/shared carveout
//! a launch actually gets (the driver may choose a smaller one), barriers per SM, and the tail
//! of a grid too small to fill every SM.

use std::fmt;

use ruda_codegen_ptx::Arch;

/// The resource that limits how many blocks an SM holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    Registers,
    Shared,
    Warps,
    Blocks,
}

/// Blocks and warps one SM holds at once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Occupancy {
    pub warps_per_sm: u32,
    pub blocks_per_sm: u32,
    /// The resource that allows the fewest blocks. On a tie the hardware's own limits (warps,
    /// then blocks) are named before the kernel's (registers, then shared memory): when the
    /// warp slots are full, trimming registers would not help.
    pub limit: Limit,
    /// The architecture's maximum, for the fraction `warps_per_sm / max_warps_per_sm`.
    pub max_warps_per_sm: u32,
}

/// One architecture's per-SM limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmLimits {
    pub max_warps: u32,
    pub max_blocks: u32,
    pub registers: u32,
    pub max_registers_per_block: u32,
    pub max_registers_per_thread: u32,
    /// Shared memory per SM at the largest carveout.
    pub shared_bytes: u32,
    /// The most shared memory one block may opt into (without the reserve).
    pub max_shared_bytes_per_block: u32,
    /// What the driver reserves per block.
    pub reserved_shared_bytes_per_block: u32,
}

const KIB: u32 = 1024;
const WARP: u32 = 32;
const MAX_THREADS_PER_BLOCK: u32 = 1024;
/// Registers are allocated per warp in units of 256 (`cudaOccRegAllocationGranularity`).
const REGISTER_GRANULE: u32 = 256;
/// Register file sub-partitions per SM (`cudaOccSubPartitionsPerMultiprocessor`).
const SUB_PARTITIONS: u32 = 4;
/// Shared memory is allocated in units of 128 bytes on sm_80 and later
/// (`cudaOccSMemAllocationGranularity`).
const SHARED_GRANULE: u32 = 128;

/// The limits of `arch`, from the Programming Guide's table (the calculator agrees where it
/// knows the architecture; its header allows 256 registers per thread where the Guide and
/// ptxas stop at 255).
pub fn limits(arch: Arch) -> SmLimits {
    let common = SmLimits {
        max_warps: 64,
        max_blocks: 32,
        registers: 64 * KIB,
        max_registers_per_block: 64 * KIB,
        max_registers_per_thread: 255,
        shared_bytes: 164 * KIB,
        max_shared_bytes_per_block: 163 * KIB,
        reserved_shared_bytes_per_block: KIB,
    };
    match arch {
        Arch::Sm80 => common,
        // GA10x and AD10x: 1,536 threads, 100 KiB of shared memory; 16 blocks on sm_86, 24 on
        // sm_89.
        Arch::Sm86 => SmLimits {
            max_warps: 48,
            max_blocks: 16,
            shared_bytes: 100 * KIB,
            max_shared_bytes_per_block: 99 * KIB,
            ..common
        },
        Arch::Sm89 => SmLimits {
            max_warps: 48,
            max_blocks: 24,
            shared_bytes: 100 * KIB,
            max_shared_bytes_per_block: 99 * KIB,
            ..common
        },
        Arch::Sm90 | Arch::Sm90a => {
            SmLimits { shared_bytes: 228 * KIB, max_shared_bytes_per_block: 227 * KIB, ..common }
        }
    }
}

/// The occupancy of a kernel using `registers_per_thread` (from `ptxas -v`) and
/// `shared_bytes_per_block` (static plus dynamic) in blocks of `block_threads` on `arch`; an
/// error, naming the resource, when one block cannot run at all.
pub fn occupancy(
    arch: Arch,
    block_threads: u32,
    registers_per_thread: u32,
    shared_bytes_per_block: u32,
) -> Result<Occupancy, String> {
    let lim = limits(arch);
    if block_threads == 0 || block_threads > MAX_THREADS_PER_BLOCK {
        return Err(format!("a block of {block_threads} threads cannot run on {arch} (1 to {MAX_THREADS_PER_BLOCK})"));
    }
    let warps = block_threads.div_ceil(WARP);
    let by_warps = lim.max_warps / warps;

    if registers_per_thread > lim.max_registers_per_thread {
        return Err(format!(
            "{registers_per_thread} registers per thread: {arch} allows at most {}",
            lim.max_registers_per_thread
        ));
    }
    let per_warp = (registers_per_thread * WARP).next_multiple_of(REGISTER_GRANULE);
    let per_block = per_warp * warps;
    let hardware_check = per_warp * warps.next_multiple_of(SUB_PARTITIONS);
    if per_block.max(hardware_check) > lim.max_registers_per_block {
        return Err(format!(
            "a block of {block_threads} threads at {registers_per_thread} registers needs {} registers; {arch} allows \
             {} per block",
            per_block.max(hardware_check),
            lim.max_registers_per_block
        ));
    }
    let by_registers = match per_warp {
        0 => u32::MAX,
        _ => (lim.registers / SUB_PARTITIONS / per_warp) * SUB_PARTITIONS / warps,
    };

    let shared_limit = lim.max_shared_bytes_per_block + lim.reserved_shared_bytes_per_block;
    let shared = u64::from(shared_bytes_per_block) + u64::from(lim.reserved_shared_bytes_per_block);
    let shared = shared.next_multiple_of(u64::from(SHARED_GRANULE));
    if shared > u64::from(shared_limit) {
        return Err(format!(
            "{shared_bytes_per_block} bytes of shared memory per block: {arch} allows at most {} (plus {} the driver \
             reserves)",
            lim.max_shared_bytes_per_block, lim.reserved_shared_bytes_per_block
        ));
    }
    // `shared` is at least the reserve, so never zero.
    let by_shared = (u64::from(lim.shared_bytes) / shared) as u32;

    // In the order ties are named (see `Occupancy::limit`).
    let candidates = [
        (by_warps, Limit::Warps),
        (lim.max_blocks, Limit::Blocks),
        (by_registers, Limit::Registers),
        (by_shared, Limit::Shared),
    ];
    let (blocks, limit) = candidates.into_iter().fold(candidates[0], |best, c| if c.0 < best.0 { c } else { best });
    Ok(Occupancy { warps_per_sm: blocks * warps, blocks_per_sm: blocks, limit, max_warps_per_sm: lim.max_warps })
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::Registers => "registers",
            Limit::Shared => "shared",
            Limit::Warps => "warps",
            Limit::Blocks => "blocks",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occ(arch: Arch, threads: u32, regs: u32, shared: u32) -> (u32, u32, Limit) {
        let o = occupancy(arch, threads, regs, shared).unwrap_or_else(|e| panic!("{e}"));
        (o.warps_per_sm, o.blocks_per_sm, o.limit)
    }

    #[test]
    fn full_occupancy_is_limited_by_warps() {
        // 256 threads = 8 warps. Warps: 64 / 8 = 8 blocks. Registers: 32 x 32 = 1,024 per warp,
        // 16,384 / 1,024 = 16 warps per sub-partition, 64 per SM, 8 blocks (a tie, named warps).
        // Shared: the 1 KiB reserve, 167,936 / 1,024 = 164 blocks. Blocks: 32.
        assert_eq!(occ(Arch::Sm80, 256, 32, 0), (64, 8, Limit::Warps));
        // sm_90 alike; sm_86 holds 48 warps: 48 / 8 = 6 blocks.
        assert_eq!(occ(Arch::Sm90, 256, 32, 0), (64, 8, Limit::Warps));
        assert_eq!(occ(Arch::Sm86, 256, 32, 0), (48, 6, Limit::Warps));
    }

    #[test]
    fn registers_limit_by_sub_partition() {
        // 256 threads x 128 registers: 4,096 per warp, 16,384 / 4,096 = 4 warps per
        // sub-partition, 16 per SM: 2 blocks of 8 warps.
        assert_eq!(occ(Arch::Sm80, 256, 128, 0), (16, 2, Limit::Registers));
        // 64 threads (2 warps) x 192 registers: 6,144 per warp, floor(16,384 / 6,144) = 2 per
        // sub-partition, 8 per SM: 4 blocks. (The SM's 65,536 / 6,144 would allow 10 warps, 5
        // blocks, if a warp could straddle sub-partitions.)
        assert_eq!(occ(Arch::Sm80, 64, 192, 0), (8, 4, Limit::Registers));
        // 37 registers round up to 40: 1,280 per warp, 12 warps per sub-partition, 48 per SM;
        // 4 warps per block: 12 blocks (warps alone would allow 16).
        assert_eq!(occ(Arch::Sm80, 128, 37, 0), (48, 12, Limit::Registers));
    }

    #[test]
    fn shared_memory_limits_with_reserve_and_granularity() {
        // 128 threads, 48 KiB: 49,152 + 1,024 = 50,176 bytes (a multiple of 128);
        // 167,936 / 50,176 = 3 blocks of 4 warps.
        assert_eq!(occ(Arch::Sm80, 128, 32, 48 * 1024), (12, 3, Limit::Shared));
        // 22,926 + 1,024 = 23,950 bytes round up to 24,064: 167,936 / 24,064 = 6 blocks (without
        // the rounding 167,936 / 23,950 would give 7).
        assert_eq!(occ(Arch::Sm80, 32, 32, 22_926), (6, 6, Limit::Shared));
        // sm_90: 227 KiB is the per-block maximum; with the reserve it fills the 228 KiB SM.
        assert_eq!(occ(Arch::Sm90, 128, 32, 227 * 1024), (4, 1, Limit::Shared));
        // sm_86: 100 KiB per SM, 48 KiB + 1 KiB per block: 2 blocks.
        assert_eq!(occ(Arch::Sm86, 128, 32, 48 * 1024), (8, 2, Limit::Shared));
    }

    #[test]
    fn blocks_limit_small_blocks() {
        // 64 threads (2 warps) x 37 registers: warps 48 / 2 = 24 blocks, registers 48 / 2 = 24,
        // shared 102,400 / 1,024 = 100; sm_86 holds 16 blocks, sm_89 24 (a tie, named warps).
        assert_eq!(occ(Arch::Sm86, 64, 37, 0), (32, 16, Limit::Blocks));
        assert_eq!(occ(Arch::Sm89, 64, 37, 0), (48, 24, Limit::Warps));
        // 32 threads on sm_80: 32 blocks of 1 warp.
        assert_eq!(occ(Arch::Sm80, 32, 16, 0), (32, 32, Limit::Blocks));
        assert_eq!(Limit::Blocks.to_string(), "blocks");
    }

    #[test]
    fn blocks_that_cannot_run_are_errors() {
        // 1,024 threads x 128 registers: 4,096 x 32 warps = 131,072 > 65,536 per block.
        let e = occupancy(Arch::Sm80, 1024, 128, 0).unwrap_err();
        assert!(e.contains("needs 131072 registers"), "{e}");
        // 1,024 threads x 64 registers: 2,048 x 32 = 65,536 exactly: runs, one block (warps
        // alone would allow 64 / 32 = 2).
        assert_eq!(occ(Arch::Sm80, 1024, 64, 0), (32, 1, Limit::Registers));
        // The hardware check: 800 threads (25 warps) x 80 registers = 2,560 per warp, 64,000
        // for the block, but 25 warps round up to 28 (whole sub-partitions): 71,680 > 65,536.
        let e = occupancy(Arch::Sm80, 800, 80, 0).unwrap_err();
        assert!(e.contains("needs 71680 registers"), "{e}");
        assert!(occupancy(Arch::Sm80, 256, 256, 0).unwrap_err().contains("at most 255"));
        assert!(occupancy(Arch::Sm80, 1025, 32, 0).unwrap_err().contains("1025 threads"));
        assert!(occupancy(Arch::Sm80, 0, 32, 0).is_err());
        // sm_86: 100 KiB per block exceeds 99 KiB (+ 1 KiB reserve); sm_80 takes it.
        assert!(occupancy(Arch::Sm86, 128, 32, 100 * 1024).unwrap_err().contains("at most 101376"));
        assert_eq!(occ(Arch::Sm80, 128, 32, 100 * 1024), (4, 1, Limit::Shared));
        // sm_90: one byte past 227 KiB rounds past the 228 KiB limit.
        assert!(occupancy(Arch::Sm90, 128, 32, 227 * 1024 + 1).is_err());
    }
}

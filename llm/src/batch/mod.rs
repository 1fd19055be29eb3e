//! Continuous batching on the host: which requests run in the next step, with which tokens,
//! positions and KV pages. The executor (another module) runs a [`ScheduledBatch`] and reports
//! one token per row back with [`ContinuousBatchScheduler::complete_batch`]. See `docs/batching.md`.

mod generate;
mod pages;
mod scheduler;

pub use generate::{parse_prompt_lines, BatchRequest, StopSequenceMatcher};
pub use scheduler::{
    BatchKind, ContinuousBatchConfig, ContinuousBatchScheduler, FinishedRequest, PageCopy, PagedKvCacheConfig,
    PrefixCacheConfig, RequestId, ScheduledBatch, ScheduledSequence, SchedulerStats, SnapshotId,
};

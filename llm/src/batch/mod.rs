//! Continuous batching: on the host, which requests run in the next step, with which tokens,
//! positions and KV pages ([`ContinuousBatchScheduler`]), and the loop that runs them through a
//! model (`run`: [`crate::Pipeline::generate_batch`]). The model's executor runs a [`ScheduledBatch`] and reports
//! one token per row back with [`ContinuousBatchScheduler::complete_batch`]. See `docs/batching.md`.

mod generate;
mod pages;
mod prefix;
mod run;
mod scheduler;

pub use generate::{parse_prompt_lines, BatchRequest, IncrementalDecoder, StopSequenceMatcher};
pub use run::{BatchEvent, BatchOptions, BatchOutput, BatchRunner, BatchSummary, PrefixCacheBounds, RunnerEvent};
pub use scheduler::{
    BatchKind, ContinuousBatchConfig, ContinuousBatchScheduler, FinishedRequest, PageCopy, PagedKvCacheConfig,
    PrefixCacheConfig, RequestId, ScheduledBatch, ScheduledSequence, SchedulerStats, SnapshotId,
};

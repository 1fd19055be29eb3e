//! Runtime (in progress).

//! Ops (in progress).

//! IR to PTX (in progress).

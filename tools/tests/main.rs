//! The integration tests of `ruda-tools`, one binary: a module per former test file.

mod cli;
mod rudac;
mod tune;

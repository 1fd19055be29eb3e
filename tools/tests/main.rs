//! The integration tests of `ruda-tools`, one binary: a module per former test file.

mod rudac;
mod tune;

//! The integration tests of `ruda-tools`, one binary: a module per former test file.
//! A new test file compiles only once it has a `mod` line here (the crate sets `autotests = false`).

mod cli;
mod profile;
mod rudac;
mod tune;

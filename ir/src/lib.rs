//! `ruda-ir`: the language in which RUDA kernels are written.
//!
//! - [`types`]: scalars, vectors and pointers with address spaces;
//! - [`kernel`]: the IR (SSA values, instructions and structured regions in arenas);
//! - [`builder`]: the Rust-embedded DSL kernels are written in;
//! - [`mod@verify`]: the verifier;
//! - [`mod@print`]: the text form;
//! - [`interp`]: the interpreter, the semantic reference every backend must agree with;
//! - [`target`]: GPU architectures, PTX ISA versions and targets, shared by both backends.

pub mod builder;
pub mod coverage;
pub mod gen;
pub mod interp;
pub mod kernel;
pub mod parse;
pub mod passes;
pub mod print;
pub mod target;
pub mod types;
pub mod verify;

pub use builder::KernelBuilder;
pub use kernel::*;
pub use parse::{parse_kernel, ParseError};
pub use print::{print_kernel, print_kernel_with_locs};
pub use types::{AddrSpace, ScalarType, Type};
pub use verify::{verify, verify_form, VerifyError};

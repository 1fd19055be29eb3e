//! Kernel parameters declared once ([`crate::kernel_params!`]): one definition gives the kernel
//! builder its parameter list (`declare`, in field order) and the launcher a struct to fill by
//! field name (`args`). [`launch`] checks the arguments' names against the built kernel's
//! parameters before the runtime checks their types, so two arguments of one type in the wrong
//! order are an error naming both, not a silent swap.

use ruda_ir::Type;
use ruda_runtime::{Arg, HashedKernel, LaunchConfig, Launchable, Stream};

use crate::error::{OpError, Result};

/// A scalar kernel parameter's Rust type.
pub trait ScalarParam: Copy {
    /// Its IR type.
    const TYPE: Type;
    /// It as a launch argument.
    fn arg(self) -> Arg<'static>;
}

macro_rules! scalar_param {
    ($($t:ty => $ir:expr),*) => {
        $(impl ScalarParam for $t {
            const TYPE: Type = $ir;
            fn arg(self) -> Arg<'static> {
                Arg::scalar(self)
            }
        })*
    };
}

scalar_param!(u32 => Type::U32, u64 => Type::U64, f32 => Type::F32);

/// Declares a kernel's parameters: a launch-side struct of tensors and scalars named after the
/// parameters, a build-side struct of their IR values, and `declare` / `args` between them.
///
/// ```ignore
/// kernel_params! {
///     /// The parameters of `row_reduce`.
///     pub struct RowReduceParams, RowReduceValues for RowReduceConfig as cfg {
///         input: tensor(cfg.dtype),
///         out: tensor(ScalarType::F32),
///         beta: opt_tensor(ScalarType::F32, cfg.beta),
///         cols: scalar(u32),
///         n: opt_scalar(u32, cfg.bias),
///     }
/// }
/// ```
///
/// `tensor(ELEM)` is a global pointer to `ELEM`; `scalar(T)` a `u32`, `u64` or `f32`; the
/// `opt_` forms exist only where their condition on the configuration holds (`Option`s on both
/// sides). Element types and conditions are expressions over the configuration, named by the
/// identifier after `as`.
#[macro_export]
macro_rules! kernel_params {
    (
        $(#[$meta:meta])*
        $vis:vis struct $params:ident, $values:ident for $cfg_ty:ty as $cfg:ident {
            $($(#[$fmeta:meta])* $field:ident : $kind:ident ( $($spec:tt)* )),* $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy)]
        $vis struct $params<'a> {
            $($(#[$fmeta])* pub $field: $crate::kernel_params!(@launch_ty 'a $kind ($($spec)*)),)*
        }

        /// The IR values of the parameters, inside the kernel being built.
        #[allow(dead_code)]
        $vis struct $values {
            $(pub $field: $crate::kernel_params!(@value_ty $kind),)*
        }

        impl<'a> $params<'a> {
            /// Declare the parameters of a kernel of `cfg`, in order.
            #[allow(unused_variables)]
            pub fn declare(b: &mut ruda_ir::KernelBuilder, $cfg: &$cfg_ty) -> $values {
                $(let $field = $crate::kernel_params!(@declare b, $field, $kind ($($spec)*));)*
                $values { $($field,)* }
            }

            /// The launch arguments, named, in parameter order (absent optional ones left out).
            pub fn args(&self) -> Vec<(&'static str, ruda_runtime::Arg<'a>)> {
                [$($crate::kernel_params!(@arg self, $field, $kind)),*].into_iter().flatten().collect()
            }
        }
    };
    (@launch_ty $a:lifetime tensor ($($s:tt)*)) => { &$a ruda_runtime::Tensor };
    (@launch_ty $a:lifetime opt_tensor ($($s:tt)*)) => { Option<&$a ruda_runtime::Tensor> };
    (@launch_ty $a:lifetime scalar ($t:ty)) => { $t };
    (@launch_ty $a:lifetime opt_scalar ($t:ty, $c:expr)) => { Option<$t> };
    (@value_ty tensor) => { ruda_ir::Value };
    (@value_ty scalar) => { ruda_ir::Value };
    (@value_ty opt_tensor) => { Option<ruda_ir::Value> };
    (@value_ty opt_scalar) => { Option<ruda_ir::Value> };
    (@declare $b:ident, $f:ident, tensor ($e:expr)) => {
        $b.param(stringify!($f), ruda_ir::Type::Ptr(ruda_ir::AddrSpace::Global, $e))
    };
    (@declare $b:ident, $f:ident, opt_tensor ($e:expr, $c:expr)) => {
        if $c { Some($b.param(stringify!($f), ruda_ir::Type::Ptr(ruda_ir::AddrSpace::Global, $e))) } else { None }
    };
    (@declare $b:ident, $f:ident, scalar ($t:ty)) => {
        $b.param(stringify!($f), <$t as $crate::params::ScalarParam>::TYPE)
    };
    (@declare $b:ident, $f:ident, opt_scalar ($t:ty, $c:expr)) => {
        if $c { Some($b.param(stringify!($f), <$t as $crate::params::ScalarParam>::TYPE)) } else { None }
    };
    (@arg $s:ident, $f:ident, tensor) => {
        Some((stringify!($f), ruda_runtime::Arg::Tensor($s.$f)))
    };
    (@arg $s:ident, $f:ident, opt_tensor) => {
        $s.$f.map(|t| (stringify!($f), ruda_runtime::Arg::Tensor(t)))
    };
    (@arg $s:ident, $f:ident, scalar) => {
        Some((stringify!($f), $crate::params::ScalarParam::arg($s.$f)))
    };
    (@arg $s:ident, $f:ident, opt_scalar) => {
        $s.$f.map(|v| (stringify!($f), $crate::params::ScalarParam::arg(v)))
    };
}

/// Launch `kernel` with named arguments: their names must be the kernel's parameter names, in
/// order (the runtime then checks their types and the launch).
pub fn launch(stream: &Stream, kernel: &HashedKernel, launch: LaunchConfig, args: &[(&str, Arg<'_>)]) -> Result<()> {
    check_names(kernel.kernel(), args)?;
    let args: Vec<Arg<'_>> = args.iter().map(|(_, a)| *a).collect();
    stream.launch(kernel, launch, &args)?;
    Ok(())
}

/// Whether `args` name `kernel`'s parameters, in order.
pub fn check_names(kernel: &ruda_ir::Kernel, args: &[(&str, Arg<'_>)]) -> Result<()> {
    let params: Vec<&str> = kernel.params.iter().map(|p| p.name.as_str()).collect();
    let given: Vec<&str> = args.iter().map(|(n, _)| *n).collect();
    if params == given {
        return Ok(());
    }
    let message = match params.iter().zip(&given).position(|(p, g)| p != g) {
        Some(i) => format!("argument {i} is `{}`, but the kernel's parameter {i} is `{}`", given[i], params[i]),
        None => format!("{} arguments ({}) for the parameters ({})", given.len(), given.join(", "), params.join(", ")),
    };
    Err(OpError::InvalidArgument { op: "launch", message: format!("`{}`: {message}", kernel.name) })
}

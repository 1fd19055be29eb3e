//! The small device functions the emitted C++ calls where C++ has no construct with the IR's
//! exact meaning. Only those a module uses are written, in a fixed order, before its kernels.

use std::fmt::Write;

use ruda_ir::ScalarType;

/// A PTX register class as C++ sees it in inline `asm` operands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Reg {
    /// 8- and 16-bit integers, f16 and bf16 (`"h"`).
    B16,
    /// `"r"`
    B32,
    /// `"l"`
    B64,
    /// `"f"`
    F32,
    /// `"d"`
    F64,
}

impl Reg {
    pub(crate) fn of(t: ScalarType) -> Reg {
        use ScalarType::*;
        match t {
            // A predicate never reaches an `asm` operand (the verifier keeps it out of `cvt`).
            Pred | I8 | U8 | I16 | U16 | F16 | BF16 => Reg::B16,
            I32 | U32 => Reg::B32,
            I64 | U64 => Reg::B64,
            F32 => Reg::F32,
            F64 => Reg::F64,
        }
    }

    /// The C++ type of an `asm` operand of this class.
    pub(crate) fn c_type(self) -> &'static str {
        match self {
            Reg::B16 => "unsigned short",
            Reg::B32 => "unsigned",
            Reg::B64 => "unsigned long long",
            Reg::F32 => "float",
            Reg::F64 => "double",
        }
    }

    fn constraint(self) -> &'static str {
        match self {
            Reg::B16 => "h",
            Reg::B32 => "r",
            Reg::B64 => "l",
            Reg::F32 => "f",
            Reg::F64 => "d",
        }
    }
}

/// One helper definition. The derived order is the order of the prelude.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Helper {
    /// `ruda_vec<T, N>`: vector values.
    Vec,
    /// `ruda_shared_ptr<T>`, `ruda_shared`, `ruda_shared_addr`: 32-bit shared-memory pointers.
    Shared,
    /// `ruda_laneid()`.
    LaneId,
    /// Integer division without C++'s undefined cases.
    Div(ScalarType),
    Rem(ScalarType),
    /// Shifts with PTX's clamping of the amount.
    Shl(ScalarType),
    Shr(ScalarType),
    /// One PTX instruction `instr d, a` (conversions, approximate functions).
    Asm1 {
        instr: String,
        d: Reg,
        a: Reg,
    },
    /// One PTX instruction `instr d, a, b` with operands of one class (float min/max).
    Asm2 {
        instr: String,
        reg: Reg,
    },
}

/// `cvt.rzi.s32.f32` -> `ruda_cvt_rzi_s32_f32`.
pub(crate) fn asm_name(instr: &str) -> String {
    format!("ruda_{}", instr.replace('.', "_"))
}

/// The C++ type of a scalar (f16 and bf16 are their raw bits).
pub(crate) fn c_scalar(t: ScalarType) -> &'static str {
    use ScalarType::*;
    match t {
        Pred => "bool",
        I8 => "signed char",
        I16 => "short",
        I32 => "int",
        I64 => "long long",
        U8 => "unsigned char",
        U16 | F16 | BF16 => "unsigned short",
        U32 => "unsigned",
        U64 => "unsigned long long",
        F32 => "float",
        F64 => "double",
    }
}

/// The unsigned type in which wrapping arithmetic on `t` happens (C++ promotes 16-bit operands
/// to `int`, where a product can overflow).
pub(crate) fn wide_unsigned(t: ScalarType) -> &'static str {
    if t.bits() > 32 {
        "unsigned long long"
    } else {
        "unsigned"
    }
}

impl Helper {
    /// The helper's C++ name (for the kinds that are called by name with a type suffix).
    pub(crate) fn name(&self) -> String {
        match self {
            Helper::Vec => "ruda_vec".into(),
            Helper::Shared => "ruda_shared".into(),
            Helper::LaneId => "ruda_laneid".into(),
            Helper::Div(t) => format!("ruda_div_{t}"),
            Helper::Rem(t) => format!("ruda_rem_{t}"),
            Helper::Shl(t) => format!("ruda_shl_{t}"),
            Helper::Shr(t) => format!("ruda_shr_{t}"),
            Helper::Asm1 { instr, .. } | Helper::Asm2 { instr, .. } => asm_name(instr),
        }
    }

    /// The definition, ending with a newline.
    pub(crate) fn definition(&self) -> String {
        const F: &str = "__device__ __forceinline__";
        let name = self.name();
        let mut s = String::new();
        let w = &mut s;
        match self {
            Helper::Vec => {
                let _ = writeln!(
                    w,
                    "// A vector value: N lanes of T, aligned to its size as the IR's vector accesses are."
                );
                let _ =
                    writeln!(w, "template <typename T, int N> struct alignas(sizeof(T) * N) ruda_vec {{ T v[N]; }};");
            }
            Helper::Shared => {
                let _ = writeln!(
                    w,
                    "// Shared-memory pointers are 32-bit addresses in the shared window, as in the IR and"
                );
                let _ = writeln!(w, "// PTX (their arithmetic wraps at 32 bits); ruda_shared makes one accessible.");
                let _ = writeln!(w, "template <typename T> using ruda_shared_ptr = unsigned;");
                let _ = writeln!(w, "template <typename T> {F} T* ruda_shared(unsigned addr) {{ return (T*)__cvta_shared_to_generic(addr); }}");
                let _ = writeln!(
                    w,
                    "{F} unsigned ruda_shared_addr(const void* p) {{ return (unsigned)__cvta_generic_to_shared(p); }}"
                );
            }
            Helper::LaneId => {
                let _ = writeln!(w, "{F} unsigned ruda_laneid() {{ unsigned r; asm(\"mov.u32 %0, %%laneid;\" : \"=r\"(r)); return r; }}");
            }
            Helper::Div(t) => {
                let c = c_scalar(*t);
                let u = wide_unsigned(*t);
                if t.is_signed_int() {
                    let _ = writeln!(
                        w,
                        "// IR `div` on {t}: truncating, MIN / -1 wraps to MIN; a zero divisor (an error in the IR)"
                    );
                    let _ = writeln!(w, "// gives -1. C++ leaves both undefined.");
                    let _ = writeln!(
                        w,
                        "{F} {c} {name}({c} a, {c} b) {{ return b == 0 ? ({c})-1 : b == -1 ? ({c})(({u})0 - ({u})a) : ({c})(a / b); }}"
                    );
                } else {
                    let _ = writeln!(w, "// IR `div` on {t}; a zero divisor (an error in the IR) gives all ones, not undefined behaviour.");
                    let _ = writeln!(w, "{F} {c} {name}({c} a, {c} b) {{ return b == 0 ? ({c})-1 : ({c})(a / b); }}");
                }
            }
            Helper::Rem(t) => {
                let c = c_scalar(*t);
                if t.is_signed_int() {
                    let _ = writeln!(
                        w,
                        "// IR `rem` on {t}: the dividend's sign, MIN % -1 is 0; a zero divisor (an error in the IR)"
                    );
                    let _ = writeln!(w, "// gives the dividend. C++ leaves both undefined.");
                    let _ = writeln!(
                        w,
                        "{F} {c} {name}({c} a, {c} b) {{ return b == 0 ? a : b == -1 ? ({c})0 : ({c})(a % b); }}"
                    );
                } else {
                    let _ = writeln!(w, "// IR `rem` on {t}; a zero divisor (an error in the IR) gives the dividend.");
                    let _ = writeln!(w, "{F} {c} {name}({c} a, {c} b) {{ return b == 0 ? a : ({c})(a % b); }}");
                }
            }
            Helper::Shl(t) => {
                let (c, u, bits) = (c_scalar(*t), wide_unsigned(*t), t.bits());
                let _ = writeln!(
                    w,
                    "// IR `shl` on {t}: amounts of {bits} or more give 0 (PTX clamps; C++ leaves them undefined)."
                );
                let _ = writeln!(
                    w,
                    "{F} {c} {name}({c} a, unsigned n) {{ return n >= {bits}u ? ({c})0 : ({c})(({u})a << n); }}"
                );
            }
            Helper::Shr(t) => {
                let (c, bits) = (c_scalar(*t), t.bits());
                if t.is_signed_int() {
                    let _ = writeln!(
                        w,
                        "// IR `shr` on {t}: arithmetic; amounts of {bits} or more fill with the sign bit."
                    );
                    let _ = writeln!(
                        w,
                        "{F} {c} {name}({c} a, unsigned n) {{ return ({c})(a >> (n < {m}u ? n : {m}u)); }}",
                        m = bits - 1
                    );
                } else {
                    let _ = writeln!(w, "// IR `shr` on {t}: logical; amounts of {bits} or more give 0.");
                    let _ = writeln!(
                        w,
                        "{F} {c} {name}({c} a, unsigned n) {{ return n >= {bits}u ? ({c})0 : ({c})(a >> n); }}"
                    );
                }
            }
            Helper::Asm1 { instr, d, a } => {
                let _ = writeln!(
                    w,
                    "{F} {dt} {name}({at} a) {{ {dt} d; asm(\"{instr} %0, %1;\" : \"={dc}\"(d) : \"{ac}\"(a)); return d; }}",
                    dt = d.c_type(),
                    at = a.c_type(),
                    dc = d.constraint(),
                    ac = a.constraint(),
                );
            }
            Helper::Asm2 { instr, reg } => {
                let _ = writeln!(
                    w,
                    "{F} {t} {name}({t} a, {t} b) {{ {t} d; asm(\"{instr} %0, %1, %2;\" : \"={c}\"(d) : \"{c}\"(a), \"{c}\"(b)); return d; }}",
                    t = reg.c_type(),
                    c = reg.constraint(),
                );
            }
        }
        s
    }
}

/// The prelude of a module: every helper in `helpers`, in their order, with a note before the
/// inline `asm` ones.
pub(crate) fn prelude<'a>(helpers: impl IntoIterator<Item = &'a Helper>) -> String {
    let mut out = String::new();
    let mut asm_note = false;
    for h in helpers {
        if matches!(h, Helper::Asm1 { .. } | Helper::Asm2 { .. }) && !asm_note {
            asm_note = true;
            out.push_str(
                "// Single PTX instructions, as the PTX backend emits them: conversions (PTX's rounding,\n\
                 // saturation and NaN rules), the approximate functions, and float min/max (NVVM folds\n\
                 // fminf/fmaxf of constants with another signed-zero rule than the hardware's).\n",
            );
        }
        out.push_str(&h.definition());
    }
    out
}

//! The Rust-embedded kernel language.
//!
//! A kernel is written as an ordinary Rust function that drives a [`KernelBuilder`]: Rust is the
//! meta-language (loops over tile sizes, `match` on dtypes, configuration structs), and every
//! builder call appends one IR instruction, recording the caller's source location so that
//! verifier errors and PTX `.loc` lines point at the kernel author's Rust code.
//!
//! ```
//! use ruda_ir::{AddrSpace, KernelBuilder, ScalarType, Type};
//!
//! // y[i] = a * x[i] for i < n, one thread per element.
//! let mut b = KernelBuilder::new("scale");
//! let x = b.param("x", Type::Ptr(AddrSpace::Global, ScalarType::F32));
//! let y = b.param("y", Type::Ptr(AddrSpace::Global, ScalarType::F32));
//! let a = b.param("a", Type::F32);
//! let n = b.param("n", Type::U32);
//! let i = b.global_thread_id_x();
//! let in_range = b.lt(i, n);
//! b.if_then(in_range, |b| {
//!     let src = b.ptr_add(x, i);
//!     let v = b.load(src);
//!     let v = b.mul(v, a);
//!     let dst = b.ptr_add(y, i);
//!     b.store(dst, v);
//! });
//! let kernel = b.finish().expect("verifies");
//! assert!(ruda_ir::print_kernel(&kernel).contains("mul"));
//! ```
//!
//! Builder methods never panic on ill-typed input: they infer a result type as best they can and
//! leave the complaint, with the location, to the verifier that [`KernelBuilder::finish`] runs.

use crate::kernel::*;
use crate::types::{AddrSpace, ScalarType, Type};
use crate::verify::{verify, VerifyError};

/// Builds one kernel. See the module documentation.
pub struct KernelBuilder {
    k: Kernel,
    /// The regions being filled, innermost last.
    stack: Vec<RegionId>,
}

impl KernelBuilder {
    pub fn new(name: impl Into<String>) -> KernelBuilder {
        let k = Kernel::new(name);
        let body = k.body;
        KernelBuilder { k, stack: vec![body] }
    }

    /// Declare the next kernel parameter.
    pub fn param(&mut self, name: impl Into<String>, ty: impl Into<Type>) -> Value {
        let value = self.k.new_value(ty.into());
        self.k.params.push(Param { name: name.into(), value });
        value
    }

    /// The largest block size the kernel will be launched with (PTX `.maxntid`), and optionally
    /// the number of blocks per SM to plan registers for (`.minnctapersm`).
    pub fn launch_bounds(&mut self, max_threads: u32, min_blocks: Option<u32>) {
        self.k.launch_bounds = Some(LaunchBounds { max_threads, min_blocks });
    }

    /// Declare a static shared-memory array of `len` elements, 16-byte aligned.
    pub fn shared_array(&mut self, name: impl Into<String>, elem: ScalarType, len: u32) -> SharedId {
        self.k.shared.push(SharedDecl { name: name.into(), elem, len, align: 16 });
        SharedId(self.k.shared.len() as u32 - 1)
    }

    /// The type of a value built so far.
    pub fn ty(&self, v: Value) -> Type {
        self.k.ty(v)
    }

    /// Verify and return the kernel.
    pub fn finish(self) -> Result<Kernel, VerifyError> {
        verify(&self.k)?;
        Ok(self.k)
    }

    /// Return the kernel without verifying it (for tests of the verifier itself).
    pub fn finish_unverified(self) -> Kernel {
        self.k
    }

    #[track_caller]
    fn push(&mut self, op: Op, result_types: &[Type]) -> Vec<Value> {
        let results: Vec<Value> = result_types.iter().map(|t| self.k.new_value(*t)).collect();
        let loc = Some(Loc::from_caller(std::panic::Location::caller()));
        let id = self.k.push_inst(Inst { op, results: results.clone(), loc });
        let region = *self.stack.last().expect("the entry region is never popped");
        self.k.regions[region.index()].insts.push(id);
        results
    }

    #[track_caller]
    fn push1(&mut self, op: Op, ty: Type) -> Value {
        self.push(op, &[ty])[0]
    }

    // ---- constants and special registers -------------------------------------------------

    #[track_caller]
    pub fn constant(&mut self, c: Constant) -> Value {
        self.push1(Op::Const(c), Type::Scalar(c.ty))
    }
    #[track_caller]
    pub fn const_u32(&mut self, v: u32) -> Value {
        self.constant(Constant::u32(v))
    }
    #[track_caller]
    pub fn const_i32(&mut self, v: i32) -> Value {
        self.constant(Constant::i32(v))
    }
    #[track_caller]
    pub fn const_u64(&mut self, v: u64) -> Value {
        self.constant(Constant::u64(v))
    }
    #[track_caller]
    pub fn const_i64(&mut self, v: i64) -> Value {
        self.constant(Constant::i64(v))
    }
    #[track_caller]
    pub fn const_f32(&mut self, v: f32) -> Value {
        self.constant(Constant::f32(v))
    }
    #[track_caller]
    pub fn const_f64(&mut self, v: f64) -> Value {
        self.constant(Constant::f64(v))
    }
    #[track_caller]
    pub fn const_pred(&mut self, v: bool) -> Value {
        self.constant(Constant::pred(v))
    }

    #[track_caller]
    pub fn special(&mut self, reg: SpecialReg) -> Value {
        self.push1(Op::Special(reg), Type::U32)
    }
    #[track_caller]
    pub fn thread_id_x(&mut self) -> Value {
        self.special(SpecialReg::TidX)
    }
    #[track_caller]
    pub fn block_id_x(&mut self) -> Value {
        self.special(SpecialReg::CtaidX)
    }
    #[track_caller]
    pub fn block_id_y(&mut self) -> Value {
        self.special(SpecialReg::CtaidY)
    }
    #[track_caller]
    pub fn block_dim_x(&mut self) -> Value {
        self.special(SpecialReg::NtidX)
    }
    #[track_caller]
    pub fn grid_dim_x(&mut self) -> Value {
        self.special(SpecialReg::NctaidX)
    }
    #[track_caller]
    pub fn lane_id(&mut self) -> Value {
        self.special(SpecialReg::LaneId)
    }
    /// `ctaid.x * ntid.x + tid.x` as `u32`.
    #[track_caller]
    pub fn global_thread_id_x(&mut self) -> Value {
        let block = self.block_id_x();
        let dim = self.block_dim_x();
        let tid = self.thread_id_x();
        self.fma(block, dim, tid)
    }

    // ---- arithmetic -----------------------------------------------------------------------

    #[track_caller]
    pub fn unary(&mut self, op: UnaryOp, a: Value) -> Value {
        let ty = self.ty(a);
        self.push1(Op::Unary(op, a), ty)
    }
    #[track_caller]
    pub fn binary(&mut self, op: BinaryOp, a: Value, b: Value) -> Value {
        let ty = self.ty(a);
        self.push1(Op::Binary(op, a, b), ty)
    }
    #[track_caller]
    pub fn add(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Add, a, b)
    }
    #[track_caller]
    pub fn sub(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Sub, a, b)
    }
    #[track_caller]
    pub fn mul(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Mul, a, b)
    }
    #[track_caller]
    pub fn mul_hi(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::MulHi, a, b)
    }
    #[track_caller]
    pub fn div(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Div, a, b)
    }
    #[track_caller]
    pub fn rem(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Rem, a, b)
    }
    #[track_caller]
    pub fn min(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Min, a, b)
    }
    #[track_caller]
    pub fn max(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Max, a, b)
    }
    #[track_caller]
    pub fn and(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::And, a, b)
    }
    #[track_caller]
    pub fn or(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Or, a, b)
    }
    #[track_caller]
    pub fn xor(&mut self, a: Value, b: Value) -> Value {
        self.binary(BinaryOp::Xor, a, b)
    }
    #[track_caller]
    pub fn shl(&mut self, a: Value, amount: Value) -> Value {
        self.binary(BinaryOp::Shl, a, amount)
    }
    #[track_caller]
    pub fn shr(&mut self, a: Value, amount: Value) -> Value {
        self.binary(BinaryOp::Shr, a, amount)
    }
    #[track_caller]
    pub fn fma(&mut self, a: Value, b: Value, c: Value) -> Value {
        let ty = self.ty(a);
        self.push1(Op::Fma(a, b, c), ty)
    }
    #[track_caller]
    pub fn neg(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Neg, a)
    }
    #[track_caller]
    pub fn not(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Not, a)
    }
    #[track_caller]
    pub fn abs(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Abs, a)
    }
    #[track_caller]
    pub fn sqrt(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Sqrt, a)
    }
    #[track_caller]
    pub fn rcp(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Rcp, a)
    }
    #[track_caller]
    pub fn rsqrt(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Rsqrt, a)
    }
    #[track_caller]
    pub fn ex2(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Ex2, a)
    }
    #[track_caller]
    pub fn lg2(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Lg2, a)
    }
    #[track_caller]
    pub fn tanh(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Tanh, a)
    }
    #[track_caller]
    pub fn sin(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Sin, a)
    }
    #[track_caller]
    pub fn cos(&mut self, a: Value) -> Value {
        self.unary(UnaryOp::Cos, a)
    }

    // ---- comparisons and selection --------------------------------------------------------

    #[track_caller]
    pub fn cmp(&mut self, op: CmpOp, a: Value, b: Value) -> Value {
        self.push1(Op::Cmp(op, a, b), Type::PRED)
    }
    #[track_caller]
    pub fn eq(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Eq, a, b)
    }
    #[track_caller]
    pub fn ne(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Ne, a, b)
    }
    #[track_caller]
    pub fn lt(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Lt, a, b)
    }
    #[track_caller]
    pub fn le(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Le, a, b)
    }
    #[track_caller]
    pub fn gt(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Gt, a, b)
    }
    #[track_caller]
    pub fn ge(&mut self, a: Value, b: Value) -> Value {
        self.cmp(CmpOp::Ge, a, b)
    }
    #[track_caller]
    pub fn select(&mut self, cond: Value, a: Value, b: Value) -> Value {
        let ty = self.ty(a);
        self.push1(Op::Select(cond, a, b), ty)
    }

    // ---- conversions ----------------------------------------------------------------------

    /// Convert with the rounding the IR requires chosen for you: round-to-nearest-even where the
    /// result is a float, toward zero (C's truncation) for float to integer, none where exact.
    #[track_caller]
    pub fn cvt(&mut self, a: Value, to: ScalarType) -> Value {
        let from = self.ty(a).elem();
        let rounding = crate::verify::cvt_needs_rounding(from, to).then(|| {
            if from.is_float() && to.is_int() {
                Rounding::Rz
            } else {
                Rounding::Rn
            }
        });
        self.cvt_with(a, Cvt { to, rounding, sat: false })
    }

    /// Convert with an explicit rounding mode and saturation.
    #[track_caller]
    pub fn cvt_with(&mut self, a: Value, cvt: Cvt) -> Value {
        self.push1(Op::Cvt(a, cvt), Type::Scalar(cvt.to))
    }

    #[track_caller]
    pub fn bitcast(&mut self, a: Value, to: ScalarType) -> Value {
        self.push1(Op::Bitcast(a, to), Type::Scalar(to))
    }

    // ---- memory ---------------------------------------------------------------------------

    /// `ptr + index` in elements of the pointee type.
    #[track_caller]
    pub fn ptr_add(&mut self, ptr: Value, index: Value) -> Value {
        let ty = self.ty(ptr);
        self.push1(Op::PtrAdd(ptr, index), ty)
    }

    /// The same address as a pointer to `elem`.
    #[track_caller]
    pub fn ptr_cast(&mut self, ptr: Value, elem: ScalarType) -> Value {
        let space = match self.ty(ptr) {
            Type::Ptr(space, _) => space,
            _ => AddrSpace::Global,
        };
        self.push1(Op::PtrCast(ptr, elem), Type::Ptr(space, elem))
    }

    /// Pointer to a static shared array.
    #[track_caller]
    pub fn shared_ptr(&mut self, id: SharedId) -> Value {
        let elem = self.k.shared.get(id.index()).map_or(ScalarType::U8, |s| s.elem);
        self.push1(Op::SharedBase(id), Type::Ptr(AddrSpace::Shared, elem))
    }

    /// Pointer to the dynamic shared memory given at launch.
    #[track_caller]
    pub fn dyn_shared_ptr(&mut self, elem: ScalarType) -> Value {
        self.push1(Op::DynSharedBase(elem), Type::Ptr(AddrSpace::Shared, elem))
    }

    #[track_caller]
    pub fn load(&mut self, ptr: Value) -> Value {
        let elem = self.ty(ptr).elem();
        self.push1(Op::Load { ptr, lanes: 1 }, Type::Scalar(elem))
    }

    /// Load 2 or 4 consecutive elements as a vector (the address must be aligned to the vector).
    #[track_caller]
    pub fn load_vec(&mut self, ptr: Value, lanes: u8) -> Value {
        let elem = self.ty(ptr).elem();
        self.push1(Op::Load { ptr, lanes }, Type::Vector(elem, lanes))
    }

    #[track_caller]
    pub fn store(&mut self, ptr: Value, value: Value) {
        self.push(Op::Store { ptr, value }, &[]);
    }

    #[track_caller]
    pub fn atomic(&mut self, op: AtomicOp, ptr: Value, value: Value) -> Value {
        let elem = self.ty(ptr).elem();
        self.push1(Op::Atomic { op, ptr, value, compare: None }, Type::Scalar(elem))
    }

    /// Compare-and-swap: store `value` if the old value equals `compare`; returns the old value.
    #[track_caller]
    pub fn atomic_cas(&mut self, ptr: Value, compare: Value, value: Value) -> Value {
        let elem = self.ty(ptr).elem();
        self.push1(Op::Atomic { op: AtomicOp::Cas, ptr, value, compare: Some(compare) }, Type::Scalar(elem))
    }

    /// Block-wide barrier (`bar.sync 0`).
    #[track_caller]
    pub fn barrier(&mut self) {
        self.push(Op::Barrier, &[]);
    }

    // ---- warp operations ------------------------------------------------------------------

    #[track_caller]
    pub fn shfl(&mut self, mode: ShflMode, value: Value, lane: Value) -> Value {
        let ty = self.ty(value);
        self.push1(Op::Shfl { mode, value, lane }, ty)
    }

    /// Exchange with lane `laneid ^ mask` (butterfly reductions).
    #[track_caller]
    pub fn shfl_xor(&mut self, value: Value, mask: u32) -> Value {
        let m = self.const_u32(mask);
        self.shfl(ShflMode::Bfly, value, m)
    }

    #[track_caller]
    pub fn vote(&mut self, mode: VoteMode, pred: Value) -> Value {
        let ty = if mode == VoteMode::Ballot { Type::U32 } else { Type::PRED };
        self.push1(Op::Vote { mode, pred }, ty)
    }

    /// Tensor-core `D = A * B + C` on m16n8k16 fragments (see [`Op::Mma`] for the layouts):
    /// `a: v4u32`, `b: v2u32`, `c: v4f32`; returns the `v4f32` D fragment.
    #[track_caller]
    pub fn mma_m16n8k16(&mut self, ty: MmaType, a: Value, b: Value, c: Value) -> Value {
        self.push1(Op::Mma { ty, a, b, c }, Type::Vector(ScalarType::F32, 4))
    }

    /// Warp load of `count` (1, 2, 4) 8x8 matrices of 16-bit elements from shared memory
    /// (see [`Op::LdMatrix`]): `u32` for one matrix, else a `v2u32`/`v4u32`.
    #[track_caller]
    pub fn ldmatrix(&mut self, ptr: Value, count: u8, trans: bool) -> Value {
        let ty = if count == 1 { Type::U32 } else { Type::Vector(ScalarType::U32, count) };
        self.push1(Op::LdMatrix { ptr, count, trans }, ty)
    }

    /// `cp.async` of `size` (4, 8 or 16) bytes from the global `src` to the shared `dst`, both
    /// aligned to `size` (see [`Op::CpAsync`]); it lands at a later [`Self::cp_async_wait`].
    #[track_caller]
    pub fn cp_async(&mut self, dst: Value, src: Value, size: u8) {
        self.push(Op::CpAsync { dst, src, size, src_size: None }, &[]);
    }

    /// `cp.async` that reads only the first `src_size` (a `u32`, at most `size`) bytes of
    /// `src` and zero-fills the rest of the `size` bytes at `dst` (`src_size` 0: all zeros,
    /// nothing read; the predicated tile loads of GEMMs).
    #[track_caller]
    pub fn cp_async_zfill(&mut self, dst: Value, src: Value, size: u8, src_size: Value) {
        self.push(Op::CpAsync { dst, src, size, src_size: Some(src_size) }, &[]);
    }

    /// `cp.async.commit_group`: close this thread's open group of copies.
    #[track_caller]
    pub fn cp_async_commit(&mut self) {
        self.push(Op::CpAsyncCommit, &[]);
    }

    /// `cp.async.wait_group n`: wait until at most `n` of this thread's most recent committed
    /// groups are pending. Other threads' copies need a barrier after it to be visible.
    #[track_caller]
    pub fn cp_async_wait(&mut self, n: u8) {
        self.push(Op::CpAsyncWait(n), &[]);
    }

    /// `cp.async.wait_all`: commit the open group and wait for every group.
    #[track_caller]
    pub fn cp_async_wait_all(&mut self) {
        self.cp_async_commit();
        self.cp_async_wait(0);
    }

    // ---- vectors --------------------------------------------------------------------------

    #[track_caller]
    pub fn extract(&mut self, vector: Value, lane: u8) -> Value {
        let elem = self.ty(vector).elem();
        self.push1(Op::Extract(vector, lane), Type::Scalar(elem))
    }

    #[track_caller]
    pub fn make_vector(&mut self, elems: &[Value]) -> Value {
        let elem = elems.first().map_or(ScalarType::F32, |v| self.ty(*v).elem());
        self.push1(Op::MakeVector(elems.to_vec()), Type::Vector(elem, elems.len() as u8))
    }

    // ---- structured control flow ----------------------------------------------------------

    /// Run `then` only where `cond` holds.
    #[track_caller]
    pub fn if_then(&mut self, cond: Value, then: impl FnOnce(&mut KernelBuilder)) {
        self.if_else(
            cond,
            |b| {
                then(b);
                vec![]
            },
            |_| vec![],
        );
    }

    /// A conditional whose two branches yield values of the same types; returns those values.
    #[track_caller]
    pub fn if_else(
        &mut self,
        cond: Value,
        then: impl FnOnce(&mut KernelBuilder) -> Vec<Value>,
        otherwise: impl FnOnce(&mut KernelBuilder) -> Vec<Value>,
    ) -> Vec<Value> {
        let then_region = self.k.new_region();
        let else_region = self.k.new_region();
        let then_yields = self.in_region(then_region, then);
        let else_yields = self.in_region(else_region, otherwise);
        let types: Vec<Type> = then_yields.iter().map(|v| self.ty(*v)).collect();
        self.k.regions[then_region.index()].yields = then_yields;
        self.k.regions[else_region.index()].yields = else_yields;
        self.push(Op::If { cond, then_region, else_region }, &types)
    }

    /// `for (iv = start; iv < end; iv += step)`, carrying `init` through the iterations. The
    /// body receives the induction variable and the current carried values and returns the next
    /// ones; the call returns the final carried values.
    #[track_caller]
    pub fn for_range(
        &mut self,
        start: Value,
        end: Value,
        step: Value,
        init: &[Value],
        body: impl FnOnce(&mut KernelBuilder, Value, &[Value]) -> Vec<Value>,
    ) -> Vec<Value> {
        let region = self.k.new_region();
        let iv = self.k.new_value(self.ty(start));
        let carried: Vec<Value> = init.iter().map(|v| self.k.new_value(self.ty(*v))).collect();
        let mut params = vec![iv];
        params.extend(&carried);
        self.k.regions[region.index()].params = params;
        let yields = self.in_region(region, |b| body(b, iv, &carried));
        self.k.regions[region.index()].yields = yields;
        let types: Vec<Type> = init.iter().map(|v| self.ty(*v)).collect();
        self.push(Op::For { start, end, step, init: init.to_vec(), body: region }, &types)
    }

    /// A loop without carried values.
    #[track_caller]
    pub fn for_each(&mut self, start: Value, end: Value, step: Value, body: impl FnOnce(&mut KernelBuilder, Value)) {
        self.for_range(start, end, step, &[], |b, iv, _| {
            body(b, iv);
            vec![]
        });
    }

    fn in_region<R>(&mut self, region: RegionId, f: impl FnOnce(&mut KernelBuilder) -> R) -> R {
        self.stack.push(region);
        let r = f(self);
        self.stack.pop();
        r
    }
}

//! Kernel operand handles: inputs (`Ref`), outputs (`RefMut`), scratch (`Scratch`) and SMEM
//! tables (`Smem`). Their methods append loads and stores to the kernel being traced.

use std::marker::PhantomData;

use super::ops::{poisoned_value, IntoValue};
use super::state::{emit, with_trace, Value};
use crate::ir::{DType, Loc, Op, RefId, Slice};

/// A Rust element type usable in kernel operand types (`Ref<f32>`, `Scratch<half::bf16>`, ...).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a kernel element type",
    label = "this is not a kernel element type",
    note = "kernel operands hold `f32`, `bf16`, `i32`, `i8` or `bool` elements"
)]
pub trait Element: Copy + Send + Sync + 'static {
    const DTYPE: DType;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}
impl Element for i32 {
    const DTYPE: DType = DType::I32;
}
impl Element for i8 {
    const DTYPE: DType = DType::I8;
}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
}

/// One dimension of a window into a block: everything (`all()`), `len` elements from `start`
/// (`ds(start, len)`), or one index that drops the dimension (`i.into()` from a `usize` or an
/// i32 [`Value`]: Pallas' `buf[slot]`, so `buf.at(&[slot.into(), all()])` of a `[2, 128]`
/// buffer loads a `[128]` vector).
#[derive(Debug, Clone, Copy)]
pub struct Idx(pub(crate) IdxKind, pub(crate) Squeeze);

/// Whether an [`Idx`] drops its dimension from what a window loads and stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Squeeze {
    Keep,
    Drop,
}

impl From<usize> for Idx {
    /// One compile-time index, squeezing the dimension.
    fn from(i: usize) -> Idx {
        Idx(IdxKind::Static { start: i, len: 1 }, Squeeze::Drop)
    }
}

impl From<Value> for Idx {
    /// One run-time index (an i32 scalar), squeezing the dimension.
    fn from(i: Value) -> Idx {
        Idx(IdxKind::Dynamic { start: i, len: 1 }, Squeeze::Drop)
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum IdxKind {
    All,
    Static { start: usize, len: usize },
    Dynamic { start: Value, len: usize },
}

/// The whole dimension (`:` in Python).
pub fn all() -> Idx {
    Idx(IdxKind::All, Squeeze::Keep)
}

/// A start that is known at compile time (`usize`) or at run time (an i32 [`Value`]).
pub trait IntoStart {
    fn into_idx(self, len: usize) -> Idx;
}

impl IntoStart for usize {
    fn into_idx(self, len: usize) -> Idx {
        Idx(IdxKind::Static { start: self, len }, Squeeze::Keep)
    }
}

impl IntoStart for Value {
    fn into_idx(self, len: usize) -> Idx {
        Idx(IdxKind::Dynamic { start: self, len }, Squeeze::Keep)
    }
}

/// A window length: a compile-time `usize`, since vector shapes are static.
#[diagnostic::on_unimplemented(
    message = "a window length is a vector shape and must be a compile-time `usize`, not `{Self}`",
    label = "this is not a compile-time `usize`",
    note = "for a run-time extent, load a fixed-size window and mask it with `select`"
)]
pub trait StaticLen {
    fn static_len(self) -> usize;
}

impl StaticLen for usize {
    fn static_len(self) -> usize {
        self
    }
}

/// `len` elements from `start` (Pallas' `pl.ds`). The length is always a compile-time size:
/// vector shapes must be static.
pub fn ds(start: impl IntoStart, len: impl StaticLen) -> Idx {
    start.into_idx(len.static_len())
}

pub(crate) fn slices(idx: &[Idx]) -> Vec<Slice> {
    idx.iter()
        .map(|i| match i.0 {
            IdxKind::All => Slice::Full,
            IdxKind::Static { start, len } => Slice::Static { start, len },
            IdxKind::Dynamic { start, len } => Slice::Dynamic {
                start: start.id,
                len,
            },
        })
        .collect()
}

/// The dims that integer indices among `idx` drop.
pub(crate) fn squeezed_dims(idx: &[Idx]) -> Vec<usize> {
    idx.iter()
        .enumerate()
        .filter(|(_, i)| i.1 == Squeeze::Drop)
        .map(|(d, _)| d)
        .collect()
}

/// Loads a window of `r`, dropping the `squeezed` dims from the result.
#[track_caller]
pub(crate) fn load_squeezed(r: RefId, s: Vec<Slice>, squeezed: &[usize]) -> Value {
    let v = load(r, s);
    if squeezed.is_empty() || v.is_poisoned() {
        return v;
    }
    let kept: Vec<usize> = (v.shape().iter().enumerate())
        .filter(|(d, _)| !squeezed.contains(d))
        .map(|(_, &n)| n)
        .collect();
    v.reshape(&kept)
}

/// Stores into a window of `r` whose `squeezed` dims the value leaves out (a value with
/// them, or a scalar, is stored as it is).
#[track_caller]
pub(crate) fn store_squeezed(r: RefId, s: Vec<Slice>, squeezed: &[usize], value: impl IntoValue) {
    let Some(v) = value
        .as_value()
        .filter(|v| !squeezed.is_empty() && !v.is_poisoned())
    else {
        return store(r, s, value);
    };
    let view = with_trace(|t| t.operands[r.index()].view_shape());
    let window: Vec<usize> = s.iter().zip(&view).map(|(s, &n)| s.len(n)).collect();
    if v.shape().len() + squeezed.len() == window.len() && !v.shape().is_empty() {
        store(r, s, v.reshape(&window))
    } else {
        store(r, s, v)
    }
}

pub(crate) fn full_window(r: RefId) -> Vec<Slice> {
    let rank = with_trace(|t| t.operands[r.index()].view_shape().len());
    vec![Slice::Full; rank]
}

#[track_caller]
pub(crate) fn load(r: RefId, s: Vec<Slice>) -> Value {
    emit(Op::Load { src: r, slices: s }, Loc::caller())[0]
}

/// Stores `value` into a window; a scalar (or literal) is broadcast to the window's shape.
#[track_caller]
pub(crate) fn store(r: RefId, s: Vec<Slice>, value: impl IntoValue) {
    let loc = Loc::caller();
    let (dtype, view) = with_trace(|t| {
        let o = &t.operands[r.index()];
        (o.dtype, o.view_shape())
    });
    let value = match value.as_value() {
        Some(v) => v,
        None => value.into_value_like(Some(dtype)),
    };
    let window: Vec<usize> = s.iter().zip(&view).map(|(s, &n)| s.len(n)).collect();
    let value = if s.len() == view.len()
        && value.shape().is_empty()
        && !window.is_empty()
        && !value.is_poisoned()
    {
        emit(
            Op::Broadcast {
                x: value.id,
                shape: window,
            },
            loc,
        )[0]
    } else {
        value
    };
    emit(
        Op::Store {
            dst: r,
            slices: s,
            value: value.id,
        },
        loc,
    );
}

/// A window (sub-block) of a ref, from [`Ref::at`] and friends.
#[derive(Debug, Clone)]
pub struct Window {
    r: RefId,
    slices: Vec<Slice>,
    /// The dims integer indices drop.
    squeezed: Vec<usize>,
    writable: bool,
}

impl Window {
    fn new(r: RefId, idx: &[Idx], writable: bool) -> Window {
        Window {
            r,
            slices: slices(idx),
            squeezed: squeezed_dims(idx),
            writable,
        }
    }

    #[track_caller]
    pub fn load(&self) -> Value {
        load_squeezed(self.r, self.slices.clone(), &self.squeezed)
    }
}

/// A writable window of an output or scratch ref.
#[derive(Debug, Clone)]
pub struct WindowMut(Window);

impl WindowMut {
    #[track_caller]
    pub fn load(&self) -> Value {
        self.0.load()
    }

    #[track_caller]
    pub fn store(&self, value: impl IntoValue) {
        debug_assert!(self.0.writable);
        store_squeezed(self.0.r, self.0.slices.clone(), &self.0.squeezed, value)
    }
}

/// A read-only input block in VMEM.
#[derive(Debug)]
pub struct Ref<T: Element> {
    id: RefId,
    _t: PhantomData<T>,
}

/// An output block in VMEM. It can be read back ([`RefMut::load`], [`RefMut::at`]): the
/// block stays in VMEM, holding what earlier steps stored, while consecutive grid steps map
/// to the same block index (as Pallas' output refs); it starts as garbage when the index
/// changes.
#[derive(Debug)]
pub struct RefMut<T: Element> {
    id: RefId,
    _t: PhantomData<T>,
}

/// A kernel-private buffer that persists across grid steps (accumulators).
#[derive(Debug)]
pub struct Scratch<T: Element> {
    id: RefId,
    _t: PhantomData<T>,
}

/// A whole small array in SMEM (scalar prefetch), read one element at a time.
#[derive(Debug)]
pub struct Smem<T: Element> {
    id: RefId,
    _t: PhantomData<T>,
}

// The structs are written out (not generated) so that a bound they state is shown as written.
macro_rules! handle_impls {
    ($($name:ident),*) => {$(
        impl<T: Element> Clone for $name<T> {
            fn clone(&self) -> Self {
                *self
            }
        }
        impl<T: Element> Copy for $name<T> {}
    )*
        handle_accessors!($($name),*);
    };
}

/// `__from_id`, `id`, `shape` and `dtype` of operand handles (also the non-`Copy` ones of
/// kernels that move their own data).
macro_rules! handle_accessors {
    ($($name:ident),*) => {$(
        impl<T: Element> $name<T> {
            #[doc(hidden)]
            pub fn __from_id(id: RefId) -> Self {
                $name { id, _t: PhantomData }
            }

            /// The ref's id in the kernel IR.
            pub fn id(&self) -> RefId {
                self.id
            }

            /// The shape the kernel body sees (block without squeezed dims, or whole array).
            pub fn shape(&self) -> Vec<usize> {
                with_trace(|t| t.operands[self.id.index()].view_shape())
            }

            pub fn dtype(&self) -> DType {
                T::DTYPE
            }
        }
    )*};
}
pub(crate) use handle_accessors;

handle_impls!(Ref, RefMut, Scratch, Smem);

/// Marks the refs a kernel may store to. Inputs (`Ref<T>`) and SMEM tables are read-only.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is a kernel input, and inputs are read-only",
    label = "an input cannot be stored to",
    note = "declare the parameter as `RefMut<T>` (an output) or keep partial results in a `Scratch<T>`"
)]
pub trait Writable {}

impl<T: Element> Writable for RefMut<T> {}
impl<T: Element> Writable for Scratch<T> {}

impl<T: Element> Ref<T> {
    /// Inputs are read-only: this exists only to turn a store into a clear compile error.
    #[doc(hidden)]
    pub fn store(&self, _value: impl IntoValue)
    where
        Self: Writable,
    {
        unreachable!("Ref<T> never implements Writable")
    }

    /// Loads the whole block.
    #[track_caller]
    pub fn load(&self) -> Value {
        load(self.id, full_window(self.id))
    }

    /// A window of the block, one [`Idx`] per dimension.
    pub fn at(&self, idx: &[Idx]) -> Window {
        Window::new(self.id, idx, false)
    }
}

impl<T: Element> RefMut<T> {
    /// Loads the whole block: what this block's earlier steps stored (garbage where none did).
    #[track_caller]
    pub fn load(&self) -> Value {
        load(self.id, full_window(self.id))
    }

    /// Stores into the whole block; a scalar is broadcast.
    #[track_caller]
    pub fn store(&self, value: impl IntoValue) {
        store(self.id, full_window(self.id), value)
    }

    /// A window of the block, one [`Idx`] per dimension.
    pub fn at(&self, idx: &[Idx]) -> WindowMut {
        WindowMut(Window::new(self.id, idx, true))
    }
}

impl<T: Element> Scratch<T> {
    #[track_caller]
    pub fn load(&self) -> Value {
        load(self.id, full_window(self.id))
    }

    /// Stores into the whole buffer; a scalar is broadcast.
    #[track_caller]
    pub fn store(&self, value: impl IntoValue) {
        store(self.id, full_window(self.id), value)
    }

    pub fn at(&self, idx: &[Idx]) -> WindowMut {
        WindowMut(Window::new(self.id, idx, true))
    }
}

/// An index into an SMEM table: an i32 [`Value`] or a Rust integer.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be used as an index",
    label = "this is not an i32 `Value` or a Rust integer",
    note = "index maps return one block index per array dim, and `Smem::get` takes one index \
            per table dim: grid indices, values read from SMEM, or integers"
)]
pub trait IntoIndex {
    #[track_caller]
    fn into_index(self) -> Value;
}

#[diagnostic::do_not_recommend]
impl IntoIndex for Value {
    fn into_index(self) -> Value {
        self
    }
}

macro_rules! into_index_int {
    ($($t:ty),*) => {$(
        #[diagnostic::do_not_recommend]
        impl IntoIndex for $t {
            #[track_caller]
            fn into_index(self) -> Value {
                match i32::try_from(self) {
                    Ok(v) => super::ops::constant(DType::I32, &[], v),
                    Err(_) => {
                        let loc = Loc::caller();
                        with_trace(|t| t.problem("index", loc, format!("index {self} does not fit in i32")));
                        poisoned_value()
                    }
                }
            }
        }
    )*};
}
into_index_int!(i32, i64, usize, u32);

impl<T: Element> Smem<T> {
    /// Reads one element (Pallas' `ref[i, j]` on an SMEM ref).
    #[track_caller]
    pub fn get<const N: usize>(&self, indices: [impl IntoIndex; N]) -> Value {
        let loc = Loc::caller();
        let indices: Vec<_> = indices.into_iter().map(|i| i.into_index().id).collect();
        emit(
            Op::LoadScalar {
                src: self.id,
                indices,
            },
            loc,
        )[0]
    }

    /// Writes one element of SMEM scratch (`#[scratch(..)] t: Smem<T>`, Pallas'
    /// `pltpu.SMEM`); a Rust literal takes the table's dtype. Scalar prefetch tables are
    /// read-only: writing one is an error at this line.
    #[track_caller]
    pub fn set<const N: usize>(&self, indices: [impl IntoIndex; N], value: impl IntoValue) {
        let loc = Loc::caller();
        let indices: Vec<_> = indices.into_iter().map(|i| i.into_index().id).collect();
        let value = match value.as_value() {
            Some(v) => v,
            None => value.into_value_like(Some(T::DTYPE)),
        };
        emit(
            Op::StoreScalar {
                dst: self.id,
                indices,
                value: value.id,
            },
            loc,
        );
    }
}

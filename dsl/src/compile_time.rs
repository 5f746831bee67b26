//! What `#[tpu_kernel]` requires to be known when a kernel is instantiated: sizes (grid,
//! block, shape and scratch dims), preconditions on them, and the bounds of the `for` loops of its body, which run
//! (unroll) while the body is traced. Each is a trait whose message names the mistake of
//! passing a traced [`Value`](crate::Value), which only exists when the kernel runs.

use std::ops::{Range, RangeInclusive};

/// A kernel size: a `usize` known when the kernel is instantiated.
#[diagnostic::on_unimplemented(
    message = "a kernel size must be a compile-time `usize`, but this is `{Self}`",
    label = "this is not a `usize` known when the kernel is instantiated",
    note = "grid, block, shape and scratch sizes are plain Rust values: literals, const \
            generics, `#[comptime]` parameters and argument dims; a traced `Value` only exists \
            at run time"
)]
pub trait KernelSize {
    /// The size.
    fn kernel_size(self) -> usize;
}

impl KernelSize for usize {
    fn kernel_size(self) -> usize {
        self
    }
}

/// The condition of a `#[tpu_kernel(require(cond, ".."))]` precondition: a `bool` over sizes
/// known when the kernel is instantiated.
#[diagnostic::on_unimplemented(
    message = "a `require` condition is a `bool` over the kernel's sizes, but this is `{Self}`",
    label = "not a `bool`",
    note = "write a comparison over sizes, e.g. `require(S % 2 == 0, \"{{S}} rows are odd\")`; \
            a traced `Value` only exists at run time (check it in the body instead)"
)]
pub trait Precondition {
    /// Whether the precondition holds.
    fn holds(self) -> bool;
}

impl Precondition for bool {
    fn holds(self) -> bool {
        self
    }
}

/// An integer type a `for` loop of a kernel body can run over (every Rust integer type).
#[diagnostic::on_unimplemented(
    message = "a `for` loop in a kernel runs when the kernel is traced, so its bounds must be \
               Rust integers, but they are `{Self}`",
    label = "these bounds are not compile-time integers",
    note = "for a loop whose trip count is only known when the kernel runs, use `fori_loop`"
)]
pub trait LoopInt {}

/// The bounds of a `for` loop of a kernel body, `(start, end)`: two Rust integers of one
/// type. `#[tpu_kernel]` passes the bounds of `for _ in start..end` (and `start..=end`)
/// through this trait, so a traced [`Value`](crate::Value) bound is named as such.
#[diagnostic::on_unimplemented(
    message = "a `for` loop in a kernel runs when the kernel is traced, so its bounds must be \
               Rust integers of one type, but they are `{Self}`",
    label = "these bounds are not compile-time integers of one type",
    note = "for a loop whose trip count is only known when the kernel runs, use `fori_loop`"
)]
pub trait LoopBounds<T> {
    /// `start..end`.
    fn range(self) -> Range<T>;
    /// `start..=end`.
    fn range_inclusive(self) -> RangeInclusive<T>;
}

#[diagnostic::do_not_recommend]
impl<T: LoopInt> LoopBounds<T> for (T, T) {
    fn range(self) -> Range<T> {
        self.0..self.1
    }
    fn range_inclusive(self) -> RangeInclusive<T> {
        self.0..=self.1
    }
}

impl LoopInt for u8 {}
impl LoopInt for u16 {}
impl LoopInt for u32 {}
impl LoopInt for u64 {}
impl LoopInt for u128 {}
impl LoopInt for usize {}
impl LoopInt for i8 {}
impl LoopInt for i16 {}
impl LoopInt for i32 {}
impl LoopInt for i64 {}
impl LoopInt for i128 {}
impl LoopInt for isize {}

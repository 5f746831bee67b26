//! Kernels that move their own data: operands left in HBM, VMEM scratch that copies fill,
//! DMA and regular semaphores, asynchronous copies (local and to other devices), scoped
//! allocations, and the device mesh a kernel runs on.
//!
//! The protocol is checked as far as Rust's types can see it:
//!
//! - a copy in flight is a borrow: [`async_copy`] takes its source window by shared borrow and
//!   its destination window by exclusive borrow, and the returned [`AsyncCopy`] keeps both
//!   borrows until [`AsyncCopy::wait`] consumes it; reading or writing the destination (or
//!   writing the source) before the wait does not compile, and neither does waiting twice;
//! - a copy token dropped without a wait is reported at the line that started the copy when
//!   the kernel is instantiated, and so is a wait in another region than the start (inside a
//!   `when` or a loop body: it would run a different number of times);
//! - a remote copy's target is a position on a typed mesh axis of the kernel's mesh
//!   ([`Devices::next`], [`Devices::prev`], [`Devices::at`]): an axis the mesh does not have
//!   is a compile error.
//!
//! What types cannot see (a copy detached in one grid step and waited in the next, a
//! [`CopyDescriptor`] started and waited across iterations, counts of signals against waits,
//! a destination touched while its copy is in flight) is checked when the kernel is
//! instantiated and, for what depends on data, by the interpreter.

use std::marker::PhantomData;

use tessera_hlo::{HasAxis, MeshAxis, MeshShape};

use super::ops::{poisoned_value, Carry, IntoValue};
use super::refs::{
    full_window, handle_accessors, load_squeezed, slices, squeezed_dims, store_squeezed, Element,
    Idx, IntoIndex,
};
use super::state::{emit, trace_region, try_with_trace, with_trace, Value};
use crate::ir::{
    DType, Loc, MemorySpace, Op, Operand, OperandRole, RefId, RefWindow, RemoteDma, SemKind, SemRef,
};

/// Identifies the region being traced: its depth and the instruction counts of the regions
/// around it (frozen while it is open), so two distinct regions never compare equal.
#[derive(Debug, Clone, PartialEq, Eq)]
struct RegionKey(Vec<usize>);

fn region_key() -> RegionKey {
    with_trace(|t| RegionKey(t.regions.iter().map(|r| r.insts.len()).collect())).trimmed()
}

impl RegionKey {
    /// Drops the innermost count (it grows while the region is traced).
    fn trimmed(mut self) -> Self {
        self.0.pop();
        self
    }
}

pub(crate) fn declare_operand(
    name: &str,
    role: OperandRole,
    dtype: DType,
    memory: MemorySpace,
    shape: Vec<usize>,
    loc: Loc,
) -> RefId {
    with_trace(|t| {
        t.operands.push(Operand {
            name: name.into(),
            role,
            dtype,
            memory,
            array_shape: shape,
            block: None,
            aliases: None,
            loc,
        });
        RefId((t.operands.len() - 1) as u32)
    })
}

/// Records a problem unless `r` may be used here (a scoped ref used outside its scope).
fn in_scope(r: RefId, op: &'static str, loc: Loc) -> bool {
    with_trace(|t| {
        let m = &t.memory;
        if m.scoped.contains(&r) && !m.live.contains(&r) {
            let name = t.operands[r.index()].name.clone();
            t.problem(
                op,
                loc,
                format!("`{name}` was allocated by a `run_scoped` region and is used outside it"),
            );
            false
        } else {
            true
        }
    })
}

// ---------------------------------------------------------------------------------------
// Operand handles.

/// An input left in HBM (Pallas' `memory_space=ANY`): no block spec, the kernel copies
/// windows of it into [`Vmem`] scratch with [`async_copy`]. It cannot be loaded directly.
#[derive(Debug)]
pub struct Hbm<T: Element> {
    id: RefId,
    _t: PhantomData<T>,
}

/// An output left in HBM: the kernel writes it only by copies ([`HbmMut::at_mut`] as a copy
/// destination), and may copy from it too.
#[derive(Debug)]
pub struct HbmMut<T: Element> {
    id: RefId,
    _t: PhantomData<T>,
}

/// A VMEM scratch buffer that copies may fill or drain (Pallas' `pltpu.VMEM(shape, dtype)`).
/// Unlike `Scratch<T>` it is not `Copy`: a copy in flight borrows it, so the borrow checker
/// sees every access. Loads take `&self`, stores `&mut self`.
#[derive(Debug)]
pub struct Vmem<T: Element> {
    id: RefId,
    _t: PhantomData<T>,
}

impl<T: Element> Clone for Hbm<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Element> Copy for Hbm<T> {}

handle_accessors!(Hbm, HbmMut, Vmem);

/// Marks the refs a kernel may load as vector blocks: HBM operands are not among them.
#[diagnostic::on_unimplemented(
    message = "`{Self}` lives in HBM and cannot be loaded",
    label = "an HBM operand cannot be loaded",
    note = "copy a window of it into a `Vmem<T>` buffer with `async_copy`, wait the copy, and load the buffer"
)]
pub trait Loadable {}

impl<T: Element> Loadable for Vmem<T> {}

// The `load` stubs are written out (not generated) so that the bound they state is shown as
// written in the error, without a macro backtrace.
impl<T: Element> Hbm<T> {
    /// HBM operands cannot be loaded: this exists only to turn a load into a clear error.
    #[doc(hidden)]
    pub fn load(&self) -> Value
    where
        Self: Loadable,
    {
        unreachable!("Hbm<T> never implements Loadable")
    }

    /// A window of the array, one [`Idx`] per dim, to copy from.
    pub fn at(&self, idx: &[Idx]) -> HbmWindow<'_, T> {
        HbmWindow(window(self.id, idx), PhantomData)
    }
}

impl<T: Element> HbmMut<T> {
    /// HBM operands cannot be loaded: this exists only to turn a load into a clear error.
    #[doc(hidden)]
    pub fn load(&self) -> Value
    where
        Self: Loadable,
    {
        unreachable!("HbmMut<T> never implements Loadable")
    }

    /// A window of the array, one [`Idx`] per dim, to copy from.
    pub fn at(&self, idx: &[Idx]) -> HbmWindow<'_, T> {
        HbmWindow(window(self.id, idx), PhantomData)
    }
}

impl<T: Element> HbmMut<T> {
    /// A window of the array to copy into (borrows the output exclusively).
    pub fn at_mut(&mut self, idx: &[Idx]) -> HbmWindowMut<'_, T> {
        HbmWindowMut(window(self.id, idx), PhantomData)
    }
}

impl<T: Element> Vmem<T> {
    /// Loads the whole buffer.
    #[track_caller]
    pub fn load(&self) -> Value {
        load_window(&whole(self.id), &[])
    }

    /// Stores into the whole buffer; a scalar is broadcast.
    #[track_caller]
    pub fn store(&mut self, value: impl IntoValue) {
        store_window(&whole(self.id), &[], value)
    }

    /// A window to load from or copy from (borrows the buffer shared).
    pub fn at(&self, idx: &[Idx]) -> VmemWindow<'_, T> {
        VmemWindow(window(self.id, idx), squeezed_dims(idx), PhantomData)
    }

    /// A window to store into or copy into (borrows the buffer exclusively).
    pub fn at_mut(&mut self, idx: &[Idx]) -> VmemWindowMut<'_, T> {
        VmemWindowMut(window(self.id, idx), squeezed_dims(idx), PhantomData)
    }
}

fn window(r: RefId, idx: &[Idx]) -> RefWindow {
    RefWindow {
        r,
        slices: slices(idx),
    }
}

/// A window of an HBM operand, to copy from.
#[derive(Debug)]
pub struct HbmWindow<'a, T>(RefWindow, PhantomData<&'a T>);

/// A window of an HBM output, to copy into.
#[derive(Debug)]
pub struct HbmWindowMut<'a, T>(RefWindow, PhantomData<&'a mut T>);

/// A window of a [`Vmem`] buffer, to load or copy from.
#[derive(Debug)]
pub struct VmemWindow<'a, T>(RefWindow, Vec<usize>, PhantomData<&'a T>);

/// A window of a [`Vmem`] buffer, to store, load or copy into.
#[derive(Debug)]
pub struct VmemWindowMut<'a, T>(RefWindow, Vec<usize>, PhantomData<&'a mut T>);

impl<T: Element> VmemWindow<'_, T> {
    /// The window `idx` of the buffer `r` (a `Vmem<T>` the caller holds no handle of).
    pub(crate) fn of(r: RefId, idx: &[Idx]) -> Self {
        VmemWindow(window(r, idx), squeezed_dims(idx), PhantomData)
    }
}

impl<T: Element> VmemWindowMut<'_, T> {
    /// The window `idx` of the buffer `r` (a `Vmem<T>` the caller holds no handle of).
    pub(crate) fn of(r: RefId, idx: &[Idx]) -> Self {
        VmemWindowMut(window(r, idx), squeezed_dims(idx), PhantomData)
    }
}

/// Loads a window of a `Vmem` buffer (checking its scope), dropping the `squeezed` dims.
#[track_caller]
fn load_window(w: &RefWindow, squeezed: &[usize]) -> Value {
    if !in_scope(w.r, "load", Loc::caller()) {
        return poisoned_value();
    }
    load_squeezed(w.r, w.slices.clone(), squeezed)
}

impl<T: Element> VmemWindow<'_, T> {
    #[track_caller]
    pub fn load(&self) -> Value {
        load_window(&self.0, &self.1)
    }
}

impl<T: Element> VmemWindowMut<'_, T> {
    #[track_caller]
    pub fn load(&self) -> Value {
        load_window(&self.0, &self.1)
    }

    /// Stores `value` into the window; a scalar is broadcast.
    #[track_caller]
    pub fn store(&self, value: impl IntoValue) {
        store_window(&self.0, &self.1, value)
    }
}

/// Stores into a window of a `Vmem` buffer (checking its scope) whose `squeezed` dims the
/// value leaves out.
#[track_caller]
fn store_window(w: &RefWindow, squeezed: &[usize], value: impl IntoValue) {
    if in_scope(w.r, "store", Loc::caller()) {
        store_squeezed(w.r, w.slices.clone(), squeezed, value)
    }
}

/// What a copy may read: a window of an HBM operand or of a [`Vmem`] buffer (`x.at(..)`), or
/// a whole one (`&x`). The source stays borrowed (shared) while the copy is in flight.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the source of a copy of `{T}` elements",
    label = "not a copy source",
    note = "a copy reads a window of an `Hbm<T>`, `HbmMut<T>` or `Vmem<T>` of the same element type: `x.at(&[..])` or `&x`"
)]
pub trait CopySource<'a, T: Element> {
    #[doc(hidden)]
    fn source(self) -> RefWindow;
}

/// What a copy may write: a window of an HBM output or of a [`Vmem`] buffer
/// (`x.at_mut(..)`), or a whole one (`&mut x`). The destination stays borrowed (exclusive)
/// while the copy is in flight.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be the destination of a copy of `{T}` elements",
    label = "not a copy destination",
    note = "a copy writes a window of an `HbmMut<T>` or `Vmem<T>` of the same element type, borrowed mutably: `x.at_mut(&[..])` or `&mut x` (inputs are read-only)"
)]
pub trait CopyDest<'a, T: Element> {
    #[doc(hidden)]
    fn dest(self) -> RefWindow;
}

impl<'a, T: Element> CopySource<'a, T> for HbmWindow<'a, T> {
    fn source(self) -> RefWindow {
        self.0
    }
}
impl<'a, T: Element> CopySource<'a, T> for VmemWindow<'a, T> {
    fn source(self) -> RefWindow {
        self.0
    }
}
impl<'a, T: Element> CopySource<'a, T> for &'a Hbm<T> {
    fn source(self) -> RefWindow {
        whole(self.id)
    }
}
impl<'a, T: Element> CopySource<'a, T> for &'a HbmMut<T> {
    fn source(self) -> RefWindow {
        whole(self.id)
    }
}
impl<'a, T: Element> CopySource<'a, T> for &'a Vmem<T> {
    fn source(self) -> RefWindow {
        whole(self.id)
    }
}
impl<'a, T: Element> CopyDest<'a, T> for HbmWindowMut<'a, T> {
    fn dest(self) -> RefWindow {
        self.0
    }
}
impl<'a, T: Element> CopyDest<'a, T> for VmemWindowMut<'a, T> {
    fn dest(self) -> RefWindow {
        self.0
    }
}
impl<'a, T: Element> CopyDest<'a, T> for &'a mut HbmMut<T> {
    fn dest(self) -> RefWindow {
        whole(self.id)
    }
}
impl<'a, T: Element> CopyDest<'a, T> for &'a mut Vmem<T> {
    fn dest(self) -> RefWindow {
        whole(self.id)
    }
}

fn whole(r: RefId) -> RefWindow {
    RefWindow {
        r,
        slices: full_window(r),
    }
}

// ---------------------------------------------------------------------------------------
// Semaphores.

/// An array of DMA semaphores (Pallas' `SemaphoreType.DMA`, of any shape; `[]` is one):
/// copies signal them when they land, waits take the copies' bytes back.
#[derive(Debug, Clone, Copy)]
pub struct DmaSem {
    id: RefId,
}

/// An array of regular semaphores (Pallas' `SemaphoreType.REGULAR`): `signal`, `wait`,
/// `read`, also on other devices.
#[derive(Debug, Clone, Copy)]
pub struct Sem {
    id: RefId,
}

/// One DMA semaphore of a [`DmaSem`] array.
#[derive(Debug, Clone)]
pub struct DmaSemSlot(SemRef);

/// One regular semaphore of a [`Sem`] array.
#[derive(Debug, Clone)]
pub struct SemSlot(SemRef);

/// What a copy signals: one DMA semaphore (`&sem` for a single one, `sems.at(i)`).
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not a DMA semaphore",
    label = "copies signal DMA semaphores",
    note = "declare the copy's semaphore as `DmaSem` and pass `&sem` (one) or `sems.at(i)` (one of an array); regular semaphores (`Sem`) take `signal`/`wait`"
)]
pub trait DmaSemaphore {
    #[doc(hidden)]
    fn dma_sem(self) -> SemRef;
}

impl DmaSemaphore for &DmaSem {
    fn dma_sem(self) -> SemRef {
        SemRef {
            sem: self.id,
            index: Vec::new(),
        }
    }
}
impl DmaSemaphore for DmaSemSlot {
    fn dma_sem(self) -> SemRef {
        self.0
    }
}
impl DmaSemaphore for &DmaSemSlot {
    fn dma_sem(self) -> SemRef {
        self.0.clone()
    }
}

/// Marks the semaphores `signal` and `wait(n)` apply to: regular ones.
#[diagnostic::on_unimplemented(
    message = "a DMA semaphore is signalled and waited by copies only",
    label = "not a regular semaphore",
    note = "wait a copy with `.wait()` on its token (or `wait_copy`); for signals between steps or devices declare a regular `Sem`"
)]
pub trait RegularSemaphore {}
impl RegularSemaphore for &Sem {}
impl RegularSemaphore for &SemSlot {}

#[track_caller]
fn index_values<const N: usize>(idx: [impl IntoIndex; N]) -> Vec<crate::ir::ValueId> {
    idx.into_iter().map(|i| i.into_index().id).collect()
}

impl DmaSem {
    #[doc(hidden)]
    pub fn __from_id(id: RefId) -> Self {
        DmaSem { id }
    }

    /// Semaphore `i` of a one-dimensional array.
    #[track_caller]
    pub fn at(&self, i: impl IntoIndex) -> DmaSemSlot {
        self.at_nd([i])
    }

    /// One semaphore of an array of any rank: one index per dim.
    #[track_caller]
    pub fn at_nd<const N: usize>(&self, idx: [impl IntoIndex; N]) -> DmaSemSlot {
        DmaSemSlot(SemRef {
            sem: self.id,
            index: index_values(idx),
        })
    }

    /// The current count (bytes landed and not yet waited) of a single DMA semaphore.
    #[track_caller]
    pub fn read(&self) -> Value {
        sem_read(self.dma_sem_ref(), Loc::caller())
    }

    fn dma_sem_ref(&self) -> SemRef {
        SemRef {
            sem: self.id,
            index: Vec::new(),
        }
    }

    /// DMA semaphores are signalled by copies: this exists only to turn a signal into a clear
    /// error.
    #[doc(hidden)]
    pub fn signal(&self, _inc: impl IntoValue)
    where
        for<'a> &'a Self: RegularSemaphore,
    {
        unreachable!("DmaSem never implements RegularSemaphore")
    }

    /// DMA semaphores are waited through copies: this exists only to turn a wait into a
    /// clear error.
    #[doc(hidden)]
    pub fn wait(&self, _n: impl IntoValue)
    where
        for<'a> &'a Self: RegularSemaphore,
    {
        unreachable!("DmaSem never implements RegularSemaphore")
    }
}

impl DmaSemSlot {
    /// The current count (bytes landed and not yet waited).
    #[track_caller]
    pub fn read(&self) -> Value {
        sem_read(self.0.clone(), Loc::caller())
    }
}

impl Sem {
    #[doc(hidden)]
    pub fn __from_id(id: RefId) -> Self {
        Sem { id }
    }

    /// Semaphore `i` of a one-dimensional array.
    #[track_caller]
    pub fn at(&self, i: impl IntoIndex) -> SemSlot {
        self.at_nd([i])
    }

    /// One semaphore of an array of any rank: one index per dim.
    #[track_caller]
    pub fn at_nd<const N: usize>(&self, idx: [impl IntoIndex; N]) -> SemSlot {
        SemSlot(SemRef {
            sem: self.id,
            index: index_values(idx),
        })
    }

    fn one(&self) -> SemSlot {
        SemSlot(SemRef {
            sem: self.id,
            index: Vec::new(),
        })
    }

    /// Adds `inc` to this (single) semaphore.
    #[track_caller]
    pub fn signal(&self, inc: impl IntoValue) {
        self.one().signal(inc)
    }

    /// Adds `inc` to this semaphore on device `to`.
    #[track_caller]
    pub fn signal_to<M: MeshShape>(&self, inc: impl IntoValue, to: DeviceId<M>) {
        self.one().signal_to(inc, to)
    }

    /// Waits until this semaphore counts at least `n`, and takes `n`.
    #[track_caller]
    pub fn wait(&self, n: impl IntoValue) {
        self.one().wait(n)
    }

    /// The current count.
    #[track_caller]
    pub fn read(&self) -> Value {
        self.one().read()
    }
}

impl SemSlot {
    /// Adds `inc` to this semaphore.
    #[track_caller]
    pub fn signal(&self, inc: impl IntoValue) {
        let loc = Loc::caller();
        let inc = inc.into_value_like(Some(DType::I32));
        sem_op(
            Op::SemSignal {
                sem: self.0.clone(),
                inc: inc.id,
                device: None,
            },
            loc,
        );
    }

    /// Adds `inc` to this semaphore on device `to` (Pallas' `semaphore_signal(.., device_id=)`).
    #[track_caller]
    pub fn signal_to<M: MeshShape>(&self, inc: impl IntoValue, to: DeviceId<M>) {
        let loc = Loc::caller();
        let inc = inc.into_value_like(Some(DType::I32));
        sem_op(
            Op::SemSignal {
                sem: self.0.clone(),
                inc: inc.id,
                device: Some(to.id.id),
            },
            loc,
        );
    }

    /// Waits until this semaphore counts at least `n`, and takes `n`.
    #[track_caller]
    pub fn wait(&self, n: impl IntoValue) {
        let loc = Loc::caller();
        let n = n.into_value_like(Some(DType::I32));
        sem_op(
            Op::SemWait {
                sem: self.0.clone(),
                value: n.id,
            },
            loc,
        );
    }

    /// The current count.
    #[track_caller]
    pub fn read(&self) -> Value {
        sem_read(self.0.clone(), Loc::caller())
    }
}

fn sem_op(op: Op, loc: Loc) {
    let refs = op.refs();
    if refs.iter().all(|&r| in_scope(r, op.name(), loc)) {
        emit(op, loc);
    }
}

fn sem_read(sem: SemRef, loc: Loc) -> Value {
    if !in_scope(sem.sem, "semaphore_read", loc) {
        return poisoned_value();
    }
    emit(Op::SemRead { sem }, loc)[0]
}

// ---------------------------------------------------------------------------------------
// Copies.

/// A started copy, not yet waited.
#[derive(Debug)]
struct InFlight {
    src: RefWindow,
    dst: RefWindow,
    sem: SemRef,
    /// The send semaphore of a remote copy.
    send: Option<SemRef>,
    loc: Loc,
    region: RegionKey,
    what: &'static str,
}

impl InFlight {
    /// Reports a wait in another region than the start; true when the wait may be emitted.
    fn same_region(&self, op: &'static str, loc: Loc) -> bool {
        if region_key() == self.region {
            return true;
        }
        let start = self.loc;
        with_trace(|t| {
            t.problem(
                op,
                loc,
                format!(
                    "this waits the {} started at line {} from inside a `when`, loop or scope \
                     that did not start it, so it would run a different number of times than \
                     the start; wait it where it started, or `.detach()` it there and use \
                     `wait_copy` in the step that should wait it",
                    self.what, start.line
                ),
            )
        });
        false
    }

    fn never_waited(&self) {
        let loc = self.loc;
        let what = self.what;
        try_with_trace(|t| {
            t.problem(
                what,
                loc,
                format!(
                    "this {what} is never waited: call `.wait()` on its token before it goes \
                     out of scope, or `.detach()` it and wait it with `wait_copy` in a later \
                     step"
                ),
            )
        });
    }
}

/// An asynchronous copy in flight (Pallas' `make_async_copy(..).start()`). It borrows its
/// source (shared) and destination (exclusive) until [`AsyncCopy::wait`] consumes it.
/// Dropping it unwaited is an error reported at the line that started it.
#[must_use = "a copy must be waited: call `.wait()` (or `.detach()` it and wait it later with `wait_copy`)"]
#[derive(Debug)]
pub struct AsyncCopy<'s, 'd> {
    inner: Option<InFlight>,
    _borrows: PhantomData<(&'s (), &'d mut ())>,
}

/// A remote copy in flight (Pallas' `make_async_remote_copy(..).start()`): it writes the
/// destination window on another device. Its source stays borrowed until the send side is
/// waited, and its destination (this device's buffer of the same name, which the symmetric
/// copy of another device writes) until the receive side is.
#[must_use = "a remote copy must be waited: call `.wait()` (or `.detach()` it and wait both sides later with `wait_copy`)"]
#[derive(Debug)]
pub struct RemoteCopy<'s, 'd> {
    inner: Option<InFlight>,
    _borrows: PhantomData<(&'s (), &'d mut ())>,
}

/// The receive side of a [`RemoteCopy`] whose send side was waited.
#[must_use = "the receive side must be waited: call `.wait_recv()`"]
#[derive(Debug)]
pub struct RecvPending<'d> {
    inner: Option<InFlight>,
    _borrow: PhantomData<&'d mut ()>,
}

impl Drop for AsyncCopy<'_, '_> {
    fn drop(&mut self) {
        if let Some(c) = self.inner.take() {
            if !std::thread::panicking() {
                c.never_waited();
            }
        }
    }
}

impl Drop for RemoteCopy<'_, '_> {
    fn drop(&mut self) {
        if let Some(c) = self.inner.take() {
            if !std::thread::panicking() {
                c.never_waited();
            }
        }
    }
}

impl Drop for RecvPending<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.inner.take() {
            if !std::thread::panicking() {
                c.never_waited();
            }
        }
    }
}

fn emit_wait(src: &RefWindow, dst: &RefWindow, sem: &SemRef, loc: Loc) {
    emit(
        Op::DmaWait {
            src: src.clone(),
            dst: dst.clone(),
            sem: sem.clone(),
        },
        loc,
    );
}

impl AsyncCopy<'_, '_> {
    /// Waits until the copy has landed (Pallas' `.wait()`); the borrows end here.
    #[track_caller]
    pub fn wait(mut self) {
        let loc = Loc::caller();
        if let Some(c) = self.inner.take() {
            if c.same_region("wait_copy", loc) {
                emit_wait(&c.src, &c.dst, &c.sem, loc);
            }
        }
    }

    /// Leaves the copy in flight past the end of its borrows: a later grid step or loop
    /// iteration waits it with [`wait_copy`] on the same windows and semaphore (the pattern of
    /// double buffering). The verifier and the interpreter check that it is waited.
    pub fn detach(mut self) {
        self.inner = None;
    }
}

impl<'d> RemoteCopy<'_, 'd> {
    /// Waits both sides: the send (this copy has read its source) and the receive (the
    /// symmetric copy from another device has landed in this device's destination).
    #[track_caller]
    pub fn wait(self) {
        let loc = Loc::caller();
        self.wait_send_at(loc).wait_recv_at(loc);
    }

    /// Waits the send side only; the source is free again, the destination stays borrowed.
    #[track_caller]
    pub fn wait_send(self) -> RecvPending<'d> {
        self.wait_send_at(Loc::caller())
    }

    fn wait_send_at(mut self, loc: Loc) -> RecvPending<'d> {
        let inner = self.inner.take().and_then(|c| {
            let send = c.send.clone().expect("remote copies have a send semaphore");
            c.same_region("wait_send", loc).then(|| {
                emit_wait(&c.src, &c.dst, &send, loc);
                c
            })
        });
        RecvPending {
            inner,
            _borrow: PhantomData,
        }
    }

    /// See [`AsyncCopy::detach`]: both sides are waited later with [`wait_copy`] (the send
    /// semaphore with this copy's windows, and the receive semaphore).
    pub fn detach(mut self) {
        self.inner = None;
    }
}

impl RecvPending<'_> {
    /// Leaves the receive side to a [`wait_copy`] elsewhere (an earlier or later step).
    pub fn detach(mut self) {
        self.inner = None;
    }

    /// Waits until the symmetric copy from another device has landed here.
    #[track_caller]
    pub fn wait_recv(self) {
        self.wait_recv_at(Loc::caller())
    }

    fn wait_recv_at(mut self, loc: Loc) {
        if let Some(c) = self.inner.take() {
            if c.same_region("wait_recv", loc) {
                emit_wait(&c.src, &c.dst, &c.sem, loc);
            }
        }
    }
}

fn start(
    src: RefWindow,
    dst: RefWindow,
    sem: SemRef,
    remote: Option<RemoteDma>,
    loc: Loc,
) -> Option<InFlight> {
    let what = if remote.is_some() {
        "remote_copy"
    } else {
        "async_copy"
    };
    let op = Op::DmaStart {
        src: src.clone(),
        dst: dst.clone(),
        sem: sem.clone(),
        remote: remote.clone(),
    };
    if !op.refs().iter().all(|&r| in_scope(r, what, loc)) {
        return None;
    }
    let poisoned = op
        .operands()
        .iter()
        .any(|v| with_trace(|t| t.poisoned.contains(v)));
    let problems_before = with_trace(|t| t.problems.len());
    emit(op, loc);
    // An ill-formed copy is reported once, by the start.
    if poisoned || with_trace(|t| t.problems.len()) > problems_before {
        return None;
    }
    Some(InFlight {
        src,
        dst,
        sem,
        send: remote.map(|r| r.send_sem),
        loc,
        region: region_key(),
        what,
    })
}

/// Starts copying `src` into `dst` (Pallas' `make_async_copy(src, dst, sem).start()`);
/// `sem` counts the copy's bytes when it lands. Both windows must have the same element type
/// and shape (unit dims aside). Wait the returned copy before touching `dst` again, or
/// writing `src`; the borrow checker enforces it.
#[track_caller]
pub fn async_copy<'s, 'd, T: Element>(
    src: impl CopySource<'s, T>,
    dst: impl CopyDest<'d, T>,
    sem: impl DmaSemaphore,
) -> AsyncCopy<'s, 'd> {
    let loc = Loc::caller();
    AsyncCopy {
        inner: start(src.source(), dst.dest(), sem.dma_sem(), None, loc),
        _borrows: PhantomData,
    }
}

/// Starts copying `src` into `dst` on device `to` (Pallas'
/// `make_async_remote_copy(src, dst, send_sem, recv_sem, device_id=to).start()`): `send_sem`
/// (here) counts the bytes once they are read, `recv_sem` (on `to`) once they land there.
/// Every device runs the same kernel, so this device's `dst` is written by the symmetric copy
/// of another device: [`RemoteCopy::wait`] waits both.
#[track_caller]
pub fn remote_copy<'s, 'd, T: Element, M: MeshShape>(
    src: impl CopySource<'s, T>,
    dst: impl CopyDest<'d, T>,
    send_sem: impl DmaSemaphore,
    recv_sem: impl DmaSemaphore,
    to: DeviceId<M>,
) -> RemoteCopy<'s, 'd> {
    let loc = Loc::caller();
    let remote = remote_dma(to, send_sem);
    RemoteCopy {
        inner: start(
            src.source(),
            dst.dest(),
            recv_sem.dma_sem(),
            Some(remote),
            loc,
        ),
        _borrows: PhantomData,
    }
}

/// What makes a copy remote: the target device, and the sender's semaphore.
fn remote_dma<M>(to: DeviceId<M>, send_sem: impl DmaSemaphore) -> RemoteDma {
    RemoteDma {
        device: to.id.id,
        send_sem: send_sem.dma_sem(),
    }
}

/// A copy described once and started and waited where the kernel needs (Pallas'
/// `make_async_copy(src, dst, sem)` with `.start()` and `.wait()`): across loop iterations
/// and grid steps, which a borrowing [`AsyncCopy`] token cannot outlive. It holds its windows
/// and semaphore, not borrows: what the borrow checker would have held is checked when the
/// kernel is instantiated (a start no wait ends, a load or store of the destination while
/// the copy may be in flight: `ir::protocol`) and by the interpreter where it depends on data.
#[derive(Debug, Clone)]
pub struct CopyDescriptor {
    src: RefWindow,
    dst: RefWindow,
    sem: SemRef,
}

/// A remote copy described once (Pallas' `make_async_remote_copy(src, dst, send_sem,
/// recv_sem, device_id)`), started and waited like a [`CopyDescriptor`]: `wait_send` where
/// the source may be reused, `wait_recv` where this device's destination (written by the
/// symmetric copy of another device) is read.
#[derive(Debug, Clone)]
pub struct RemoteCopyDescriptor {
    copy: CopyDescriptor,
    remote: RemoteDma,
}

/// Describes the copy of `src` into `dst` signalled on `sem`; see [`CopyDescriptor`].
pub fn make_async_copy<'s, 'd, T: Element>(
    src: impl CopySource<'s, T>,
    dst: impl CopyDest<'d, T>,
    sem: impl DmaSemaphore,
) -> CopyDescriptor {
    CopyDescriptor {
        src: src.source(),
        dst: dst.dest(),
        sem: sem.dma_sem(),
    }
}

/// Describes the copy of `src` into `dst` on device `to`; see [`RemoteCopyDescriptor`] and
/// [`remote_copy`] for the semaphores.
pub fn make_async_remote_copy<'s, 'd, T: Element, M: MeshShape>(
    src: impl CopySource<'s, T>,
    dst: impl CopyDest<'d, T>,
    send_sem: impl DmaSemaphore,
    recv_sem: impl DmaSemaphore,
    to: DeviceId<M>,
) -> RemoteCopyDescriptor {
    RemoteCopyDescriptor {
        copy: make_async_copy(src, dst, recv_sem),
        remote: remote_dma(to, send_sem),
    }
}

/// Emits a wait of `sem` for the copy `c` describes, if its refs are in scope here.
fn wait_described(c: &CopyDescriptor, sem: &SemRef, loc: Loc) {
    wait_in_scope(c.src.clone(), c.dst.clone(), sem.clone(), loc);
}

impl CopyDescriptor {
    /// A descriptor of windows and a semaphore the caller has checked belong together.
    pub(crate) fn from_parts(src: RefWindow, dst: RefWindow, sem: SemRef) -> Self {
        CopyDescriptor { src, dst, sem }
    }

    /// Starts the copy.
    #[track_caller]
    pub fn start(&self) {
        self.start_at(Loc::caller())
    }

    pub(crate) fn start_at(&self, loc: Loc) {
        let c = self.clone();
        // Protocol problems of the start are recorded by `start` itself.
        let _ = start(c.src, c.dst, c.sem, None, loc);
    }

    /// Waits until the copy has landed.
    #[track_caller]
    pub fn wait(&self) {
        self.wait_at(Loc::caller())
    }

    pub(crate) fn wait_at(&self, loc: Loc) {
        wait_described(self, &self.sem, loc);
    }
}

impl RemoteCopyDescriptor {
    /// Starts the copy.
    #[track_caller]
    pub fn start(&self) {
        let c = self.copy.clone();
        let _ = start(
            c.src,
            c.dst,
            c.sem,
            Some(self.remote.clone()),
            Loc::caller(),
        );
    }

    /// Waits both sides: [`wait_send`](Self::wait_send), then
    /// [`wait_recv`](Self::wait_recv).
    #[track_caller]
    pub fn wait(&self) {
        let loc = Loc::caller();
        wait_described(&self.copy, &self.remote.send_sem, loc);
        wait_described(&self.copy, &self.copy.sem, loc);
    }

    /// Waits until this copy has read its source (the source may be written again).
    #[track_caller]
    pub fn wait_send(&self) {
        wait_described(&self.copy, &self.remote.send_sem, Loc::caller());
    }

    /// Waits until the symmetric copy from another device has landed in this device's
    /// destination.
    #[track_caller]
    pub fn wait_recv(&self) {
        wait_described(&self.copy, &self.copy.sem, Loc::caller());
    }
}

/// A buffer a copy may read and write at once (two windows of it): an HBM output or a
/// [`Vmem`] buffer, borrowed mutably.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be both the source and the destination of a copy of `{T}` elements",
    label = "not a writable buffer",
    note = "copies within one buffer take `&mut x` of an `HbmMut<T>` or a `Vmem<T>`"
)]
pub trait CopyBuffer<'a, T: Element> {
    #[doc(hidden)]
    fn buffer(self) -> RefId;
}

impl<'a, T: Element> CopyBuffer<'a, T> for &'a mut HbmMut<T> {
    fn buffer(self) -> RefId {
        self.id
    }
}
impl<'a, T: Element> CopyBuffer<'a, T> for &'a mut Vmem<T> {
    fn buffer(self) -> RefId {
        self.id
    }
}

/// [`async_copy`] from window `src` of `buf` into its window `dst` (Rust cannot borrow two
/// windows of one buffer at run-time offsets apart, so the copy borrows the whole buffer).
#[track_caller]
pub fn async_copy_within<'b, T: Element>(
    buf: impl CopyBuffer<'b, T>,
    src: &[Idx],
    dst: &[Idx],
    sem: impl DmaSemaphore,
) -> AsyncCopy<'b, 'b> {
    let loc = Loc::caller();
    let r = buf.buffer();
    AsyncCopy {
        inner: start(window(r, src), window(r, dst), sem.dma_sem(), None, loc),
        _borrows: PhantomData,
    }
}

/// [`remote_copy`] from window `src` of this device's `buf` into window `dst` of device
/// `to`'s `buf` (the same window for the all-gather pattern). The copy borrows the whole
/// buffer, which the symmetric copy from another device writes.
#[track_caller]
pub fn remote_copy_within<'b, T: Element, M: MeshShape>(
    buf: impl CopyBuffer<'b, T>,
    src: &[Idx],
    dst: &[Idx],
    send_sem: impl DmaSemaphore,
    recv_sem: impl DmaSemaphore,
    to: DeviceId<M>,
) -> RemoteCopy<'b, 'b> {
    let loc = Loc::caller();
    let r = buf.buffer();
    let remote = remote_dma(to, send_sem);
    RemoteCopy {
        inner: start(
            window(r, src),
            window(r, dst),
            recv_sem.dma_sem(),
            Some(remote),
            loc,
        ),
        _borrows: PhantomData,
    }
}

/// Waits for a copy of `src` into `dst` signalled on `sem` that this region did not start
/// with a token: one detached in an earlier grid step or loop iteration (double buffering),
/// or a side of a detached remote copy. The windows give the size; the verifier and the
/// interpreter check that some copy signals it.
#[track_caller]
pub fn wait_copy<'s, 'd, T: Element>(
    src: impl CopySource<'s, T>,
    dst: impl CopyDest<'d, T>,
    sem: impl DmaSemaphore,
) {
    wait_in_scope(src.source(), dst.dest(), sem.dma_sem(), Loc::caller());
}

/// Emits a wait of `sem` for a copy of `src` into `dst` that no token holds, if its refs may
/// be used here ([`wait_copy`], [`wait_copy_within`], copy descriptors).
fn wait_in_scope(src: RefWindow, dst: RefWindow, sem: SemRef, loc: Loc) {
    let op = Op::DmaWait { src, dst, sem };
    if op.refs().iter().all(|&r| in_scope(r, "wait_copy", loc)) {
        emit(op, loc);
    }
}

/// [`wait_copy`] for a copy between two windows of one buffer (started by
/// [`async_copy_within`] or [`remote_copy_within`] and detached), so that several such
/// copies may be in flight in one buffer at once.
#[track_caller]
pub fn wait_copy_within<'b, T: Element>(
    buf: impl CopyBuffer<'b, T>,
    src: &[Idx],
    dst: &[Idx],
    sem: impl DmaSemaphore,
) {
    let r = buf.buffer();
    wait_in_scope(window(r, src), window(r, dst), sem.dma_sem(), Loc::caller());
}

// ---------------------------------------------------------------------------------------
// Scoped allocations.

/// Allocates scratch for one region of the kernel (Pallas' `run_scoped`), through the
/// [`Scope`] handed to `f`. Buffers start as garbage, semaphores at zero; when the region
/// ends, its semaphores must be back at zero with no copy in flight. Returns what `f`
/// returns (traced values).
#[track_caller]
pub fn run_scoped<C: Carry>(f: impl FnOnce(&mut Scope) -> C) -> C {
    run_scoped_at(f, Loc::caller())
}

/// [`run_scoped`] attributed to `loc`.
pub(crate) fn run_scoped_at<C: Carry>(f: impl FnOnce(&mut Scope) -> C, loc: Loc) -> C {
    let id = with_trace(|t| {
        t.memory.scopes += 1;
        t.memory.scopes
    });
    let mut scope = Scope {
        allocs: Vec::new(),
        id,
    };
    let (mut region, result) = trace_region(Vec::new(), |_| f(&mut scope));
    let values = result.flatten();
    region.yields = values.iter().map(|v| v.id).collect();
    with_trace(|t| t.memory.live.retain(|r| !scope.allocs.contains(r)));
    let results = emit(
        Op::Scoped {
            allocs: scope.allocs,
            body: region,
        },
        loc,
    );
    result.rebuild(&mut results.into_iter())
}

/// The allocator of one [`run_scoped`] region.
#[derive(Debug)]
pub struct Scope {
    allocs: Vec<RefId>,
    id: usize,
}

impl Scope {
    pub(crate) fn alloc(
        &mut self,
        name: &str,
        dtype: DType,
        memory: MemorySpace,
        shape: &[usize],
        loc: Loc,
    ) -> RefId {
        let name = format!("{name}@scope{}", self.id);
        let r = declare_operand(
            &name,
            OperandRole::Scratch,
            dtype,
            memory,
            shape.to_vec(),
            loc,
        );
        with_trace(|t| {
            t.memory.scoped.push(r);
            t.memory.live.push(r);
        });
        self.allocs.push(r);
        r
    }

    /// A VMEM buffer of `shape` for this region.
    #[track_caller]
    pub fn vmem<T: Element>(&mut self, name: &str, shape: &[usize]) -> Vmem<T> {
        let loc = Loc::caller();
        Vmem::__from_id(self.alloc(name, T::DTYPE, MemorySpace::Vmem, shape, loc))
    }

    /// DMA semaphores of `shape` (`&[]` for one) for this region.
    #[track_caller]
    pub fn dma_sems(&mut self, name: &str, shape: &[usize]) -> DmaSem {
        let loc = Loc::caller();
        let memory = MemorySpace::Semaphore(SemKind::Dma);
        DmaSem::__from_id(self.alloc(name, DType::I32, memory, shape, loc))
    }

    /// Regular semaphores of `shape` (`&[]` for one) for this region.
    #[track_caller]
    pub fn sems(&mut self, name: &str, shape: &[usize]) -> Sem {
        let loc = Loc::caller();
        let memory = MemorySpace::Semaphore(SemKind::Regular);
        Sem::__from_id(self.alloc(name, DType::I32, memory, shape, loc))
    }
}

// ---------------------------------------------------------------------------------------
// Devices.

/// The device mesh `M` a kernel runs on, as the kernel body sees it: this device's position
/// and its neighbours along typed axes. Every device runs the same kernel (SPMD); device ids
/// are row-major over `M`'s axes.
#[derive(Debug)]
pub struct Devices<M> {
    _m: PhantomData<M>,
}

impl<M> Clone for Devices<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for Devices<M> {}

/// A device of mesh `M` (a traced i32 id), the target of a remote copy or signal.
#[derive(Debug)]
pub struct DeviceId<M> {
    id: Value,
    _m: PhantomData<M>,
}

impl<M> Clone for DeviceId<M> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<M> Copy for DeviceId<M> {}

impl<M> DeviceId<M> {
    /// The id as a traced i32 value.
    pub fn value(&self) -> Value {
        self.id
    }
}

impl<M: MeshShape> Devices<M> {
    #[doc(hidden)]
    pub fn __new() -> Self {
        Devices { _m: PhantomData }
    }

    /// (size, stride) of axis `A`.
    fn axis<A: MeshAxis>(&self) -> (usize, usize)
    where
        M: HasAxis<A>,
    {
        let index = <M as HasAxis<A>>::INDEX;
        with_trace(|t| {
            let mesh = &t.memory.mesh;
            let size = mesh.get(index).map_or(1, |a| a.size);
            let stride = mesh.iter().skip(index + 1).map(|a| a.size).product();
            (size, stride)
        })
    }

    /// The number of devices along axis `A` (known at instantiation).
    pub fn size<A: MeshAxis>(&self) -> usize
    where
        M: HasAxis<A>,
    {
        self.axis::<A>().0
    }

    /// The number of devices of the mesh.
    pub fn count(&self) -> usize {
        with_trace(|t| crate::ir::device_count(&t.memory.mesh))
    }

    /// This device.
    #[track_caller]
    pub fn this(&self) -> DeviceId<M> {
        DeviceId {
            id: emit(Op::DeviceId, Loc::caller())[0],
            _m: PhantomData,
        }
    }

    /// This device's position along axis `A` (Pallas' `lax.axis_index`), an i32 value.
    #[track_caller]
    pub fn index<A: MeshAxis>(&self) -> Value
    where
        M: HasAxis<A>,
    {
        let (size, stride) = self.axis::<A>();
        let id = self.this().id;
        (id / stride as i32) % size as i32
    }

    /// The device at position `i` along axis `A`, at this device's position on the others.
    #[track_caller]
    pub fn at<A: MeshAxis>(&self, i: impl IntoIndex) -> DeviceId<M>
    where
        M: HasAxis<A>,
    {
        let (_, stride) = self.axis::<A>();
        let i = i.into_index();
        let here = self.index::<A>();
        let id = self.this().id;
        DeviceId {
            id: id + (i - here) * stride as i32,
            _m: PhantomData,
        }
    }

    /// The next device along axis `A`, wrapping around (a ring).
    #[track_caller]
    pub fn next<A: MeshAxis>(&self) -> DeviceId<M>
    where
        M: HasAxis<A>,
    {
        self.shifted::<A>(1)
    }

    /// The previous device along axis `A`, wrapping around.
    #[track_caller]
    pub fn prev<A: MeshAxis>(&self) -> DeviceId<M>
    where
        M: HasAxis<A>,
    {
        self.shifted::<A>(-1)
    }

    /// The device `by` positions further along axis `A`, wrapping around (`next` is
    /// `shifted(1)`, `prev` `shifted(-1)`): an all-to-all's `k`-th partner. `by` is a
    /// constant, so every device's target is a fixed permutation of the axis (which the
    /// StableHLO lowering turns into one `collective_permute`).
    #[track_caller]
    pub fn shifted<A: MeshAxis>(&self, by: i64) -> DeviceId<M>
    where
        M: HasAxis<A>,
    {
        let size = self.axis::<A>().0 as i64;
        let by = by.rem_euclid(size) as i32;
        self.neighbour::<A>((self.index::<A>() + by) % size as i32)
    }

    /// [`Devices::at`] a position in range by construction (`(here + k) % size`, `0 <= k <
    /// size`): its id is a device of the mesh, which interval arithmetic cannot see (it
    /// loses that `here` and this device's id move together), so no run-time check is made
    /// for it.
    #[track_caller]
    fn neighbour<A: MeshAxis>(&self, position: Value) -> DeviceId<M>
    where
        M: HasAxis<A>,
    {
        let device = self.at::<A>(position);
        crate::trace::unchecked_index(device.id);
        device
    }

    /// The kernel's barrier semaphore (Pallas' `get_barrier_semaphore`): a regular semaphore
    /// the devices signal each other on to agree that all of them have entered the kernel,
    /// before remote copies may land in their buffers.
    #[track_caller]
    pub fn barrier(&self) -> Sem {
        let loc = Loc::caller();
        let existing = with_trace(|t| t.memory.barrier);
        let id = existing.unwrap_or_else(|| {
            let memory = MemorySpace::Semaphore(SemKind::Barrier);
            let id = declare_operand(
                "barrier",
                OperandRole::Scratch,
                DType::I32,
                memory,
                Vec::new(),
                loc,
            );
            with_trace(|t| t.memory.barrier = Some(id));
            id
        });
        Sem::__from_id(id)
    }
}

//! The kernels of JAX's "Distributed computing in Pallas for TPUs" tutorial, written with
//! tessera's public API: a right permute, a ring all-gather, an all-reduce (psum) with
//! flow-control semaphores, a bidirectional reduce-scatter, and a manual double-buffered
//! pipeline over an operand left in HBM. Each has an f64 reference written with plain loops.
//!
//! The collectives run on the one-axis mesh [`RingMesh`] (`context`), device `d`'s neighbours
//! being `d - 1` (left, `prev`) and `d + 1` (right, `next`), wrapping around. Shapes follow
//! Mosaic's rules for f32: copies move whole 128-lane tiles and multiples of 8 rows.

use tessera::dsl::axes::Context;
use tessera::dsl::{mesh, DeviceAxis, HostArray};
use tessera::prelude::*;

mesh!(
    /// The mesh of the collective kernels: one ring of devices along `context`.
    pub RingMesh = [Context]
);

/// The mesh axes of [`RingMesh`] over `n` devices, to instantiate and run the kernels with.
pub fn ring_mesh(n: usize) -> Vec<DeviceAxis> {
    vec![DeviceAxis::new("context", n)]
}

/// Rows of the windows [`double_buffered_sum`] copies (a whole f32 sublane tile).
pub const WINDOW_ROWS: usize = 8;

/// The indices of the reduce-scatter's two directions in its semaphore arrays.
const LEFT: i32 = 0;
const RIGHT: i32 = 1;

/// The start barrier of the tutorial's collectives: this device signals both neighbours on
/// the barrier semaphore and waits for their two signals, so neither neighbour can send a
/// remote copy or a signal into this device before it has entered the kernel (and its
/// buffers and semaphores exist), and vice versa.
fn meet(devices: &Devices<RingMesh>) {
    let barrier = devices.barrier();
    barrier.signal_to(1, devices.prev::<Context>());
    barrier.signal_to(1, devices.next::<Context>());
    barrier.wait(2);
}

// -----------------------------------------------------------------------------------------
// 1. Right permute (`lax.ppermute` to the right neighbour).

/// `out = x` of the previous device on the ring (the tutorial's `right_permute`): every
/// device sends its whole `x` (f32 `[R, C]`, left in HBM) into the `out` (HBM) of its right
/// neighbour with one remote copy. `send` counts the bytes this device has read out of `x`
/// and `recv` the bytes the left neighbour's copy has landed in this device's `out`; waiting
/// both ends the copy on both sides.
///
/// The barrier comes first: a device may only write into a neighbour that has entered the
/// kernel. Here the receiver gives the permission: each device signals its left neighbour
/// (the one that writes into it) and waits for the signal of its right neighbour (the one it
/// writes into), one signal each way, so the barrier ends at zero.
#[tpu_kernel(grid = 1)]
pub fn right_permute(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] mut out: HbmMut<f32>,
    send: DmaSem,
    recv: DmaSem,
    devices: Devices<RingMesh>,
) {
    let barrier = devices.barrier();
    barrier.signal_to(1, devices.prev::<Context>());
    barrier.wait(1);
    remote_copy(&x, &mut out, &send, &recv, devices.next::<Context>()).wait();
}

/// The reference of [`right_permute`]: device `d` gets the array of device `d - 1`.
pub fn right_permute_reference(per_device: &[HostArray]) -> Vec<Vec<f64>> {
    let n = per_device.len();
    (0..n)
        .map(|d| per_device[(d + n - 1) % n].to_f64_vec())
        .collect()
}

// -----------------------------------------------------------------------------------------
// 2. All-gather (`lax.all_gather`) around the ring.

/// `out[j] = x of device j` for every `j`, on every device (the tutorial's ring
/// `all_gather`): `x` f32 `[S, C]` and `out` `[N, S, C]`, both left in HBM, over a grid of
/// `N - 1` steps. At step 0 each device copies its own shard into `out[me]` (DMA semaphore
/// `local`) and meets its neighbours at the barrier. At step `s` it forwards slot
/// `me - s` of its `out` (its own shard at step 0, then the shard it received at step
/// `s - 1`) into the same slot of its right neighbour's `out`, and waits both sides: its
/// send (`send`) and the left neighbour's copy landing here (`recv[s]`, one DMA semaphore
/// per step as in the tutorial). After `N - 1` steps every shard has gone around the ring.
///
/// No flow control is needed: every slot of `out` is written once per device, and the slot
/// a device forwards at step `s` is the one whose copy it waited at step `s - 1`. The
/// barrier is needed because the first remote copy lands in a neighbour's `out`.
#[tpu_kernel(
    grid = devices.size::<Context>() - 1,
    require(
        devices.size::<Context>() > 1,
        "the ring has {} device; an all-gather needs at least 2",
        devices.size::<Context>()
    )
)]
pub fn all_gather(
    #[shape(S, C)] x: Hbm<f32>,
    #[shape(devices.size::<Context>(), S, C)] mut out: HbmMut<f32>,
    local: DmaSem,
    send: DmaSem,
    #[scratch(devices.size::<Context>() - 1)] recv: DmaSem,
    devices: Devices<RingMesh>,
) {
    let step = program_id(0);
    let n = devices.size::<Context>() as i32;
    let me = devices.index::<Context>();
    let slot = |j: Value| [ds(j, 1), all(), all()];
    when(step.eq(0), || {
        async_copy(&x, out.at_mut(&slot(me)), &local).wait();
        meet(&devices);
    });
    let forwarded = slot((me - step + n) % n);
    remote_copy_within(
        &mut out,
        &forwarded,
        &forwarded,
        &send,
        recv.at(step),
        devices.next::<Context>(),
    )
    .wait();
}

/// The reference of [`all_gather`]: `[N, S, C]`, shard `j` at index `j`, the same on every
/// device.
pub fn all_gather_reference(per_device: &[HostArray]) -> Vec<f64> {
    let mut out = Vec::new();
    for shard in per_device {
        for v in shard.to_f64_vec() {
            out.push(v);
        }
    }
    out
}

// -----------------------------------------------------------------------------------------
// 3. All-reduce (`lax.psum`) with flow-control semaphores.

/// `out = sum of x over the devices`, on every device (the tutorial's `all_reduce`): `x`
/// f32 `[S, C]` left in HBM, `out` `[S, C]` resident in VMEM over a grid of `N` steps.
///
/// Each device's `x` travels once around the ring through a double-buffered VMEM receive
/// buffer `buf` (`[2, S, C]`): at step `s` the *working* slot `s % 2` holds the `x` of device
/// `me - s`, which this device adds to `out` while it sends it on into the *receiving* slot
/// `1 - s % 2` of its right neighbour (remote DMA: `send` here, `recv` there). At step 0 the
/// working slot is filled from `x` (DMA semaphore `local`) after the barrier.
///
/// The regular semaphore `capacity` is the flow control: at the start of every step that
/// sends, a device tells its left neighbour "my receiving slot is free" (its last reader was
/// the step before, now finished), and waits for the same word from its right neighbour
/// before sending. Without it a left neighbour one step ahead would overwrite the working
/// slot this device is still adding and sending. Each device signals and waits `capacity`
/// `N - 1` times, so it ends at zero. The barrier makes sure no signal or copy reaches a
/// device that has not entered the kernel. The last step only adds.
#[tpu_kernel(
    grid = devices.size::<Context>(),
    require(
        devices.size::<Context>() > 1,
        "the ring has {} device; an all-reduce needs at least 2",
        devices.size::<Context>()
    )
)]
pub fn all_reduce(
    #[shape(S, C)] x: Hbm<f32>,
    #[shape(S, C)] out: RefMut<f32>,
    #[scratch(2, S, C)] mut buf: Vmem<f32>,
    local: DmaSem,
    send: DmaSem,
    recv: DmaSem,
    capacity: Sem,
    devices: Devices<RingMesh>,
) {
    let step = program_id(0);
    let n = devices.size::<Context>() as i32;
    let slot = |j: Value| [ds(j, 1), all(), all()];
    let working = slot(step % 2);
    let receiving = slot((step + 1) % 2);
    when(step.eq(0), || {
        meet(&devices);
        async_copy(&x, buf.at_mut(&working), &local).wait();
        out.store(0.0);
    });
    let sends = step.lt(n - 1);
    when(sends, || {
        capacity.signal_to(1, devices.prev::<Context>());
        capacity.wait(1);
        let next = devices.next::<Context>();
        remote_copy_within(&mut buf, &working, &receiving, &send, &recv, next).detach();
    });
    // Accumulate while the working slot is on its way to the right neighbour.
    out.store(out.load() + buf.at(&working).load().reshape(&[S, C]));
    when(sends, || {
        wait_copy_within(&mut buf, &working, &receiving, &send);
        wait_copy_within(&mut buf, &working, &receiving, &recv);
    });
}

/// The f64 reference of [`all_reduce`]: the elementwise sum of every device's array (the
/// same result on every device).
pub fn all_reduce_reference(per_device: &[HostArray]) -> Vec<f64> {
    let mut sum = vec![0.0; per_device[0].len()];
    for x in per_device {
        for (s, v) in sum.iter_mut().zip(x.to_f64_vec()) {
            *s += v;
        }
    }
    sum
}

// -----------------------------------------------------------------------------------------
// 4. Bidirectional reduce-scatter (`lax.psum_scatter`).

/// `out = sum over devices of x[me]` (the tutorial's bidirectional `reduce_scatter`): `x` f32
/// `[N, B, C]` left in HBM (block `j` is this device's contribution to device `j`), `out`
/// `[B, C]` in HBM, over a grid of `N - 1` steps. The upper half of every block (rows
/// `[0, B/2)`) travels the ring leftwards and the lower half rightwards, so both directions
/// of every link carry half the data.
///
/// A partial sum travels through a double-buffered VMEM buffer `buf` (`[2, B, C]`, rows
/// `[0, B/2)` the leftward partial, `[B/2, B)` the rightward one). At step 0 the working slot
/// is filled with this device's starting partials: the upper half of block `me + 1` (going
/// left) and the lower half of block `me - 1` (going right). At step `s` the working slot
/// `s % 2` is sent to both neighbours' receiving slot `1 - s % 2` (remote DMA semaphores
/// `send[LEFT/RIGHT]`, `recv[LEFT/RIGHT]`); meanwhile this device copies its own
/// contributions to the two partials it receives (upper half of block `me + s + 2`, lower
/// half of block `me - s - 2`) into `own` (DMA semaphores `local`), and once both partials
/// have landed it adds them into the receiving slot, which the next step sends. After the
/// last step the receiving slot holds both halves of the full sum of block `me`, which is
/// copied into `out`.
///
/// The regular semaphores `capacity[LEFT/RIGHT]` are the flow control of each direction: at
/// each step a device tells each neighbour that its receiving slot is free and waits for
/// the same from both before sending, so a neighbour a step ahead never overwrites the slot
/// this device is still sending from. Each is signalled and waited `N - 1` times per
/// device. The barrier comes first, before any signal or copy reaches a neighbour.
#[tpu_kernel(
    grid = devices.size::<Context>() - 1,
    require(
        N == devices.size::<Context>(),
        "x holds {N} blocks but the ring has {} devices; give x one block per device",
        devices.size::<Context>()
    ),
    require(
        N > 1,
        "the ring has {N} device; a reduce-scatter needs at least 2"
    ),
    require(
        B % 2 == 0,
        "blocks of {B} rows do not split in two halves; the halves travel in opposite directions"
    )
)]
pub fn reduce_scatter(
    #[shape(N, B, C)] x: Hbm<f32>,
    #[shape(B, C)] mut out: HbmMut<f32>,
    #[scratch(2, B, C)] mut buf: Vmem<f32>,
    #[scratch(B, C)] mut own: Vmem<f32>,
    #[scratch(2)] local: DmaSem,
    #[scratch(2)] send: DmaSem,
    #[scratch(2)] recv: DmaSem,
    #[scratch(2)] capacity: Sem,
    devices: Devices<RingMesh>,
) {
    let half = B / 2;
    let step = program_id(0);
    let n = N as i32;
    let me = devices.index::<Context>();
    let (left, right) = (devices.prev::<Context>(), devices.next::<Context>());
    // The upper (leftward) and lower (rightward) halves of a block of x, and of a slot of buf.
    let upper = |block: Value| [ds(block, 1), ds(0, half), all()];
    let lower = |block: Value| [ds(block, 1), ds(half, half), all()];
    let (working, receiving) = (step % 2, (step + 1) % 2);
    let own_upper = [ds(0, half), all()];
    let own_lower = [ds(half, half), all()];
    when(step.eq(0), || {
        meet(&devices);
        async_copy(
            x.at(&upper((me + 1) % n)),
            buf.at_mut(&upper(working)),
            local.at(LEFT),
        )
        .wait();
        async_copy(
            x.at(&lower((me + n - 1) % n)),
            buf.at_mut(&lower(working)),
            local.at(RIGHT),
        )
        .wait();
    });
    // The receiving slot is free: its last reader was the previous step.
    capacity.at(LEFT).signal_to(1, right);
    capacity.at(RIGHT).signal_to(1, left);
    // This device's contributions to the partials arriving now, fetched during the transfer.
    let from_right = (me + step + 2) % n;
    let from_left = (me - step - 2 + 2 * n) % n;
    async_copy(
        x.at(&upper(from_right)),
        own.at_mut(&own_upper),
        local.at(LEFT),
    )
    .detach();
    async_copy(
        x.at(&lower(from_left)),
        own.at_mut(&own_lower),
        local.at(RIGHT),
    )
    .detach();
    capacity.at(LEFT).wait(1);
    capacity.at(RIGHT).wait(1);
    let (up_w, up_r) = (upper(working), upper(receiving));
    let (low_w, low_r) = (lower(working), lower(receiving));
    remote_copy_within(&mut buf, &up_w, &up_r, send.at(LEFT), recv.at(LEFT), left).detach();
    remote_copy_within(
        &mut buf,
        &low_w,
        &low_r,
        send.at(RIGHT),
        recv.at(RIGHT),
        right,
    )
    .detach();
    wait_copy(
        x.at(&upper(from_right)),
        own.at_mut(&own_upper),
        local.at(LEFT),
    );
    wait_copy(
        x.at(&lower(from_left)),
        own.at_mut(&own_lower),
        local.at(RIGHT),
    );
    wait_copy_within(&mut buf, &up_w, &up_r, send.at(LEFT));
    wait_copy_within(&mut buf, &low_w, &low_r, send.at(RIGHT));
    wait_copy_within(&mut buf, &up_w, &up_r, recv.at(LEFT));
    wait_copy_within(&mut buf, &low_w, &low_r, recv.at(RIGHT));
    let slot = [ds(receiving, 1), all(), all()];
    let partials = buf.at(&slot).load().reshape(&[B, C]);
    buf.at_mut(&slot)
        .store((partials + own.load()).reshape(&[1, B, C]));
    when(step.eq(n - 2), || {
        async_copy(buf.at(&slot), &mut out, local.at(LEFT)).wait();
    });
}

/// The f64 reference of [`reduce_scatter`]: device `d` gets the sum over devices of their
/// block `d`.
pub fn reduce_scatter_reference(per_device: &[HostArray]) -> Vec<Vec<f64>> {
    let n = per_device.len();
    let block = per_device[0].len() / n;
    let xs: Vec<Vec<f64>> = per_device.iter().map(HostArray::to_f64_vec).collect();
    let mut out = vec![vec![0.0; block]; n];
    for (d, sum) in out.iter_mut().enumerate() {
        for x in &xs {
            for i in 0..block {
                sum[i] += x[d * block + i];
            }
        }
    }
    out
}

// -----------------------------------------------------------------------------------------
// 5. A manual double-buffered pipeline over an HBM operand.

/// `out = sum over k of x[8k .. 8k + 8]` (the row blocks of `x` added up): `x` f32 `[R, C]`
/// stays in HBM and the kernel pipelines it itself, one window of 8 rows at a time through
/// a two-slot VMEM buffer `buf` with one DMA semaphore per slot. Before the loop it starts
/// the copy of window 0; iteration `k` first starts the copy of window `k + 1` into the
/// other slot (whose last reader was iteration `k - 1`), then waits window `k` and adds it
/// to `out`, so each copy overlaps the previous window's work. Every copy is started in one
/// iteration (or before the loop) and waited in the next, by `wait_copy` on the same
/// windows and semaphore.
#[tpu_kernel(
    grid = 1,
    require(
        R % WINDOW_ROWS == 0 && R > 0,
        "{R} rows are not whole windows of {} rows; pad x",
        WINDOW_ROWS
    )
)]
pub fn double_buffered_sum(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(WINDOW_ROWS, C)] out: RefMut<f32>,
    #[scratch(2, WINDOW_ROWS, C)] mut buf: Vmem<f32>,
    #[scratch(2)] sems: DmaSem,
) {
    let windows = (R / WINDOW_ROWS) as i32;
    let window = |k: Value| [ds(k * WINDOW_ROWS as i32, WINDOW_ROWS), all()];
    let slot = |k: Value| [ds(k % 2, 1), all(), all()];
    let first = constant(DType::I32, &[], 0);
    async_copy(
        x.at(&window(first)),
        buf.at_mut(&slot(first)),
        sems.at(first % 2),
    )
    .detach();
    out.store(0.0);
    fori_loop(0, windows, (), |k, ()| {
        let next = k + 1;
        when(next.lt(windows), || {
            async_copy(
                x.at(&window(next)),
                buf.at_mut(&slot(next)),
                sems.at(next % 2),
            )
            .detach();
        });
        wait_copy(x.at(&window(k)), buf.at_mut(&slot(k)), sems.at(k % 2));
        let rows = buf.at(&slot(k)).load().reshape(&[WINDOW_ROWS, C]);
        out.store(out.load() + rows);
    });
}

/// The f64 reference of [`double_buffered_sum`].
pub fn double_buffered_sum_reference(x: &HostArray) -> Vec<f64> {
    let (rows, cols) = (x.shape()[0], x.shape()[1]);
    let xs = x.to_f64_vec();
    let mut out = vec![0.0; WINDOW_ROWS * cols];
    for r in 0..rows {
        for c in 0..cols {
            out[(r % WINDOW_ROWS) * cols + c] += xs[r * cols + c];
        }
    }
    out
}

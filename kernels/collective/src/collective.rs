//! Collectives inside kernels: an all-gather over a mesh axis as a ring of remote copies
//! (JAX's `ops/tpu/all_gather.py`), an all-to-all with every device's copies in flight at
//! once, and an all-gather matmul whose remote copy of each weight shard overlaps the matmul
//! of the shard before it (a collective matmul).
//!
//! Both run on any mesh `M` over one of its axes `A`: device `i` of the axis is at position
//! `i`, the others of the mesh take part in their own rings.

use tessera_dsl::prelude::*;
use tessera_dsl::{
    wait_copy, wait_copy_within, HasAxis, HostArray, KernelDef, MeshAxis, MeshShape,
};

/// Every device signals its two neighbours along `A` on the barrier semaphore and waits for
/// theirs: no remote copy lands in a device that has not reached this point.
fn meet<M: MeshShape + HasAxis<A>, A: MeshAxis>(devices: &Devices<M>) {
    let barrier = devices.barrier();
    barrier.signal_to(1, devices.prev::<A>());
    barrier.signal_to(1, devices.next::<A>());
    barrier.wait(2);
}

/// `out = concat(x of every device along A)` on every device (JAX's `all_gather`): `x [S,
/// C]` and `out [N S, C]` in HBM, of any element type `T` (the kernel only copies; bool is
/// refused by the TPU rules). Each device copies its shard into its own slot of `out`, meets
/// its neighbours at the barrier, then for `N - 1` steps sends the upper half of the slot it
/// received last (its own first) to the next device and the lower half of another to the
/// previous one, into the same slots there: the two halves travel the ring in opposite
/// directions, so after `N - 1` steps every slot has reached every device. `S` must be even.
#[tpu_kernel(
    grid = 1,
    name = "all_gather",
    require(
        S % 2 == 0,
        "{S} rows do not split in two halves; the halves travel the ring in opposite directions"
    )
)]
pub fn all_gather_of<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    #[shape(S, C)] x: Hbm<T>,
    #[shape(devices.size::<A>() * S, C)] mut out: HbmMut<T>,
    #[scratch(2)] send: DmaSem,
    #[scratch(2)] recv: DmaSem,
    devices: Devices<M>,
) {
    let half = S / 2;
    let n = devices.size::<A>() as i32;
    let me = devices.index::<A>();
    async_copy(&x, out.at_mut(&[ds(me * S as i32, S), all()]), recv.at(0)).wait();
    if n == 1 {
        return;
    }
    meet::<M, A>(&devices);
    let (next, prev) = (devices.next::<A>(), devices.prev::<A>());
    // Rows `[slot * S + offset, + S/2)` of `out`.
    let part = |slot: Value, offset: usize| [ds(slot * S as i32 + offset as i32, half), all()];
    fori_loop(0, n - 1, (), |step, ()| {
        let right = part((me - step + n) % n, half);
        let left = part((me + step) % n, 0);
        remote_copy_within(&mut out, &right, &right, send.at(1), recv.at(1), next).detach();
        remote_copy_within(&mut out, &left, &left, send.at(0), recv.at(0), prev).detach();
        // This device's sends, and the halves arriving from both neighbours (the slots the
        // neighbours forward at this step).
        let from_prev = part((me - step - 1 + 2 * n) % n, half);
        let from_next = part((me + step + 1) % n, 0);
        wait_copy_within(&mut out, &right, &right, send.at(1));
        wait_copy_within(&mut out, &left, &left, send.at(0));
        wait_copy_within(&mut out, &from_prev, &from_prev, recv.at(1));
        wait_copy_within(&mut out, &from_next, &from_next, recv.at(0));
    });
}

/// [`all_gather_of`] for f32.
pub fn all_gather<M: MeshShape + HasAxis<A>, A: MeshAxis>() -> KernelDef {
    all_gather_of::<f32, M, A>()
}

/// Every device signals every other device along `A` on the barrier semaphore and waits for
/// all of them: an all-to-all writes to every device, so each must have entered the kernel.
pub(crate) fn meet_all<M: MeshShape + HasAxis<A>, A: MeshAxis>(devices: &Devices<M>) {
    let n = devices.size::<A>();
    let barrier = devices.barrier();
    for k in 1..n {
        barrier.signal_to(1, devices.shifted::<A>(k as i64));
    }
    barrier.wait((n - 1) as i32);
}

/// `out = all_to_all(x)` over `A` (JAX's `all_to_all(x, split_axis=0, concat_axis=0)`,
/// Ulysses' exchange of heads for sequence): `x [R, C]` in HBM is `N` chunks of `R / N`
/// rows, chunk `p` for the device at position `p`; chunk `s` of device `d`'s `out` is device
/// `s`'s chunk `d`. Any element type `T` (the kernel only copies). Each device copies its own
/// chunk into place, meets every other device at the barrier, then has all its `N - 1`
/// remote copies in flight at once (chunk `me + k` to the device `k` along, into slot `me`
/// there) and waits them: each send, and each chunk arriving, on a receive semaphore per
/// source (slot `s` lands on `recv[s]`, so a consumer can wait for one source's chunk).
#[tpu_kernel(
    grid = 1,
    name = "all_to_all",
    require(
        R % devices.size::<A>() == 0,
        "{R} rows do not split into {} equal chunks, one per device of the axis",
        devices.size::<A>()
    )
)]
pub fn all_to_all_of<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    #[shape(R, C)] x: Hbm<T>,
    #[shape(R, C)] mut out: HbmMut<T>,
    #[scratch(devices.size::<A>())] send: DmaSem,
    #[scratch(devices.size::<A>())] recv: DmaSem,
    devices: Devices<M>,
) {
    let n = devices.size::<A>();
    let rows = R / n;
    let me = devices.index::<A>();
    let chunk = |p: Value| [ds(p * rows as i32, rows), all()];
    async_copy(x.at(&chunk(me)), out.at_mut(&chunk(me)), recv.at(me)).wait();
    if n == 1 {
        return;
    }
    meet_all::<M, A>(&devices);
    // The positions `k` along from this device and `k` back.
    let along = |k: usize| (me + k as i32) % n as i32;
    let back = |k: usize| (me + (n - k) as i32) % n as i32;
    for k in 1..n {
        let to = along(k);
        let (src, dst) = (x.at(&chunk(to)), out.at_mut(&chunk(me)));
        remote_copy(
            src,
            dst,
            send.at(to),
            recv.at(me),
            devices.shifted::<A>(k as i64),
        )
        .detach();
    }
    for k in 1..n {
        // The send to the device `k` along, and the chunk from the device `k` back.
        let (to, from) = (along(k), back(k));
        wait_copy(x.at(&chunk(to)), out.at_mut(&chunk(me)), send.at(to));
        wait_copy(x.at(&chunk(me)), out.at_mut(&chunk(from)), recv.at(from));
    }
}

/// [`all_to_all_of`] for f32.
pub fn all_to_all<M: MeshShape + HasAxis<A>, A: MeshAxis>() -> KernelDef {
    all_to_all_of::<f32, M, A>()
}

/// The reference of [`all_to_all_of`]: device `d`'s output is chunk `d` of every device's
/// array, in axis order (one axis: `per_device` in axis order), in their dtype.
pub fn all_to_all_reference(per_device: &[HostArray]) -> Vec<HostArray> {
    let n = per_device.len();
    let (rows, cols) = (per_device[0].shape()[0], per_device[0].shape()[1]);
    let chunk = rows / n * cols;
    (0..n)
        .map(|d| {
            let data: Vec<f64> = per_device
                .iter()
                .flat_map(|a| a.to_f64_vec()[d * chunk..(d + 1) * chunk].to_vec())
                .collect();
            HostArray::from_f64(per_device[0].dtype(), [rows, cols], &data)
                .expect("the chunks fill the shape")
        })
        .collect()
}

/// The reference of [`all_gather_of`]: every device gets the shards in device order along
/// the axis (one ring: `per_device` in axis order), in their dtype.
pub fn all_gather_reference(per_device: &[HostArray]) -> HostArray {
    let cols = per_device[0].shape()[1];
    let rows: usize = per_device.iter().map(|a| a.shape()[0]).sum();
    let data: Vec<f64> = per_device.iter().flat_map(|a| a.to_f64_vec()).collect();
    HostArray::from_f64(per_device[0].dtype(), [rows, cols], &data)
        .expect("the shards fill the array")
}

/// `out = x @ all_gather(w)` over axis `A` (a collective matmul): `x [T, K]` (blocks of
/// `block_t` rows), `w [K / N, F]` this device's rows of the weight (left in HBM), `out [T,
/// F]` (blocks of `block_f` columns). The grid walks column blocks `f` (outer) and row blocks
/// `t`. At `t == 0` the devices meet at the barrier, copy their own shard's column block into
/// its slot of a VMEM buffer of every shard's block (`[N, K / N, block_f]`), and for `N` steps
/// multiply the shard of the step while the remote copy of that shard to the next device is
/// in flight: step `s` computes with shard `me - s`, which the previous device sent at step
/// `s - 1`. Later row blocks reuse the gathered column block. `K / N` must be a multiple of
/// 128 for Mosaic (the shard's columns of `x` start at multiples of it).
#[tpu_kernel(
    grid = (F / block_f, ROWS / block_t),
    require(
        SHARD_ROWS * devices.size::<A>() == K,
        "w holds {SHARD_ROWS} rows on each of {} devices but x has K = {K} columns; each \
         device holds K / devices rows of the weight",
        devices.size::<A>()
    ),
    require(
        block_t > 0 && ROWS % block_t == 0,
        "block_t = {block_t} does not divide x's {ROWS} rows; choose one that does"
    ),
    require(
        block_f > 0 && F % block_f == 0,
        "block_f = {block_f} does not divide w's {F} columns; choose one that does"
    )
)]
pub fn all_gather_matmul<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    #[shape(ROWS, K)]
    #[block((block_t, K), |f, t| (t, 0))]
    x: Ref<T>,
    #[shape(SHARD_ROWS, F)] w: Hbm<T>,
    #[shape(ROWS, F)]
    #[block((block_t, block_f), |f, t| (t, f))]
    out: RefMut<T>,
    #[scratch(devices.size::<A>(), SHARD_ROWS, block_f)] mut shards: Vmem<T>,
    local: DmaSem,
    send: DmaSem,
    recv: DmaSem,
    #[scratch(block_t, block_f)] acc: Scratch<f32>,
    devices: Devices<M>,
    #[comptime] block_t: usize,
    #[comptime] block_f: usize,
) {
    let (f, t) = (program_id(0), program_id(1));
    let n = devices.size::<A>() as i32;
    let me = devices.index::<A>();
    // Shard `j`'s slot of the buffer, and its product with its columns of `x`.
    let slot = |j: Value| [ds(j, 1), all(), all()];
    let partial = |shards: &Vmem<T>, j: Value| {
        let cols = x.at(&[all(), ds(j * SHARD_ROWS as i32, SHARD_ROWS)]).load();
        let wj = shards.at(&slot(j)).load().reshape(&[SHARD_ROWS, block_f]);
        dot(cols, wj)
    };
    acc.store(0.0);
    when(t.eq(0), || {
        if n > 1 {
            meet::<M, A>(&devices);
        }
        let cols = [all(), ds(f * block_f as i32, block_f)];
        async_copy(w.at(&cols), shards.at_mut(&slot(me)), &local).wait();
        let next = devices.next::<A>();
        fori_loop(0, n, (), |step, ()| {
            let j = (me - step + n) % n;
            let last = step.eq(n - 1);
            when(!last, || {
                remote_copy_within(&mut shards, &slot(j), &slot(j), &send, &recv, next).detach();
            });
            acc.store(acc.load() + partial(&shards, j));
            when(!last, || {
                let arriving = slot((j - 1 + n) % n);
                wait_copy_within(&mut shards, &slot(j), &slot(j), &send);
                wait_copy_within(&mut shards, &arriving, &arriving, &recv);
            });
        });
    });
    when(t.gt(0), || {
        fori_loop(0, n, (), |j, ()| {
            acc.store(acc.load() + partial(&shards, j))
        });
    });
    out.store(acc.load().cast(T::DTYPE));
}

/// The f64 reference of [`all_gather_matmul`]: `x [T, K]` times the weight whose rows are
/// `w_shards` in axis order.
pub fn all_gather_matmul_reference(x: &HostArray, w_shards: &[HostArray]) -> Vec<f64> {
    let (t, k) = (x.shape()[0], x.shape()[1]);
    let f = w_shards[0].shape()[1];
    let w: Vec<f64> = w_shards.iter().flat_map(|s| s.to_f64_vec()).collect();
    let x = x.to_f64_vec();
    let mut out = vec![0.0; t * f];
    for i in 0..t {
        for kk in 0..k {
            let a = x[i * k + kk];
            for j in 0..f {
                out[i * f + j] += a * w[kk * f + j];
            }
        }
    }
    out
}

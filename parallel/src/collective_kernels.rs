//! Collectives inside kernels: an all-gather over a mesh axis as a ring of remote copies
//! (JAX's `ops/tpu/all_gather.py`), and an all-gather matmul whose remote copy of each
//! weight shard overlaps the matmul of the shard before it (a collective matmul).
//!
//! Both run on any mesh `M` over one of its axes `A`: device `i` of the axis is at position
//! `i`, the others of the mesh take part in their own rings.

use tessera_dsl::__private::{ArgDecl, BlockDim, DimSemantics, Loc, OperandRole, Param};
use tessera_dsl::prelude::*;
use tessera_dsl::{
    wait_copy_within, HasAxis, HostArray, IntoIndex, KernelDef, MeshAxis, MeshShape,
};

fn arg(name: &'static str, dtype: DType, rank: usize) -> ArgDecl {
    ArgDecl::new(name, OperandRole::Input, dtype, rank)
}

fn param(name: &str, value: impl ToString) -> Param {
    Param {
        name: name.into(),
        value: value.to_string(),
    }
}

/// Every device signals its two neighbours along `A` on the barrier semaphore and waits for
/// theirs: no remote copy lands in a device that has not reached this point.
fn meet<M: MeshShape + HasAxis<A>, A: MeshAxis>(devices: &Devices<M>) {
    let barrier = devices.barrier();
    barrier.signal_to(1, devices.prev::<A>());
    barrier.signal_to(1, devices.next::<A>());
    barrier.wait(2);
}

/// `out = concat(x of every device along A)` on every device (JAX's `all_gather`): `x [S,
/// C]` and `out [N S, C]` in HBM. Each device copies its shard into its own slot of `out`,
/// meets its neighbours at the barrier, then for `N - 1` steps sends the upper half of the
/// slot it received last (its own first) to the next device and the lower half of another
/// to the previous one, into the same slots there: the two halves travel the ring in
/// opposite directions, so after `N - 1` steps every slot has reached every device. `S` must
/// be even.
#[track_caller]
pub fn all_gather<M: MeshShape + HasAxis<A>, A: MeshAxis>() -> KernelDef {
    let loc = Loc::caller();
    let params = vec![param("axis", A::NAME)];
    KernelDef::__new(
        "all_gather",
        params,
        vec![arg("x", DType::F32, 2)],
        loc,
        move |b| {
            let shape = b.__arg("x", DType::F32, 2)?;
            b.__require(
                shape[0] % 2 == 0,
                "x",
                format!(
                    "{} rows do not split in two halves; the halves travel the ring in opposite \
                 directions",
                    shape[0]
                ),
            )?;
            b.__grid(&[1], &[DimSemantics::Arbitrary])?;
            let devices = b.__devices::<M>()?;
            let n = devices.size::<A>();
            let x = b.__hbm::<f32>("x", shape.clone(), loc);
            let out = b.__hbm_out::<f32>("out", vec![n * shape[0], shape[1]], loc);
            let send = b.__dma_sems("send", vec![2], loc);
            let recv = b.__dma_sems("recv", vec![2], loc);
            all_gather_body::<M, A>(x, out, send, recv, devices);
            Ok(())
        },
    )
}

fn all_gather_body<M: MeshShape + HasAxis<A>, A: MeshAxis>(
    x: Hbm<f32>,
    mut out: HbmMut<f32>,
    send: DmaSem,
    recv: DmaSem,
    devices: Devices<M>,
) {
    let rows = x.shape()[0];
    let half = rows / 2;
    let n = devices.size::<A>() as i32;
    let me = devices.index::<A>();
    async_copy(
        &x,
        out.at_mut(&[ds(me * rows as i32, rows), all()]),
        recv.at(0),
    )
    .wait();
    if n == 1 {
        return;
    }
    meet::<M, A>(&devices);
    let (next, prev) = (devices.next::<A>(), devices.prev::<A>());
    // Rows `[slot * S + offset, + S/2)` of `out`.
    let part = |slot: Value, offset: usize| [ds(slot * rows as i32 + offset as i32, half), all()];
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

/// The reference of [`all_gather`]: every device gets the shards in device order along the
/// axis (one ring: `per_device` in axis order).
pub fn all_gather_reference(per_device: &[HostArray]) -> HostArray {
    let cols = per_device[0].shape()[1];
    let rows: usize = per_device.iter().map(|a| a.shape()[0]).sum();
    let data: Vec<f32> = per_device.iter().flat_map(|a| a.to_f32_vec()).collect();
    HostArray::f32([rows, cols], data).expect("the shards fill the array")
}

/// `out = x @ all_gather(w)` over axis `A` (a collective matmul): `x [T, K]` (blocks of
/// `BT` rows), `w [K / N, F]` this device's rows of the weight (left in HBM), `out [T, F]`
/// (blocks of `BF` columns). The grid walks column blocks `f` (outer) and row blocks `t`. At
/// `t == 0` the devices meet at the barrier, copy their own shard's column block into its
/// slot of a VMEM buffer of every shard's block (`[N, K / N, BF]`), and for `N` steps
/// multiply the shard of the step while the remote copy of that shard to the next device is
/// in flight: step `s` computes with shard `me - s`, which the previous device sent at step
/// `s - 1`. Later row blocks reuse the gathered column block. `K / N` must be a multiple of
/// 128 for Mosaic (the shard's columns of `x` start at multiples of it).
#[track_caller]
pub fn all_gather_matmul<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    block_t: usize,
    block_f: usize,
) -> KernelDef {
    let loc = Loc::caller();
    let params = vec![
        param("axis", A::NAME),
        param("BT", block_t),
        param("BF", block_f),
    ];
    let args = vec![arg("x", T::DTYPE, 2), arg("w", T::DTYPE, 2)];
    KernelDef::__new("all_gather_matmul", params, args, loc, move |b| {
        let xs = b.__arg("x", T::DTYPE, 2)?;
        let ws = b.__arg("w", T::DTYPE, 2)?;
        let devices = b.__devices::<M>()?;
        let n = devices.size::<A>();
        let (t, k, f) = (xs[0], xs[1], ws[1]);
        b.__dim_eq("w", 0, ws[0] * n, "K (x's dim 1)", k)?;
        for (what, size, block) in [("x", t, block_t), ("w", f, block_f)] {
            b.__require(
                block > 0 && size % block == 0,
                what,
                format!("block {block} does not divide the dim {size}; choose one that does"),
            )?;
        }
        b.__grid(
            &[f / block_f, t / block_t],
            &[DimSemantics::Arbitrary, DimSemantics::Arbitrary],
        )?;
        let rows = |i: &[Value]| vec![i[1], 0i32.into_index()];
        let tile = |i: &[Value]| vec![i[1], i[0]];
        let sized = |a, b| vec![BlockDim::Sized(a), BlockDim::Sized(b)];
        let x = b.__input::<T>("x", xs, sized(block_t, k), &rows, loc);
        let w = b.__hbm::<T>("w", ws.clone(), loc);
        let out = b.__output::<T>("out", vec![t, f], sized(block_t, block_f), &tile, loc);
        let parts = MatmulParts {
            x,
            w,
            out,
            shards: b.__vmem::<T>("shards", vec![n, ws[0], block_f], loc),
            local: b.__dma_sems("local", vec![], loc),
            send: b.__dma_sems("send", vec![], loc),
            recv: b.__dma_sems("recv", vec![], loc),
            acc: b.__scratch::<f32>("acc", vec![block_t, block_f], loc),
            devices,
        };
        all_gather_matmul_body::<T, M, A>(parts);
        Ok(())
    })
}

struct MatmulParts<T: Element, M> {
    x: Ref<T>,
    w: Hbm<T>,
    out: RefMut<T>,
    shards: Vmem<T>,
    local: DmaSem,
    send: DmaSem,
    recv: DmaSem,
    acc: Scratch<f32>,
    devices: Devices<M>,
}

fn all_gather_matmul_body<T: Element, M: MeshShape + HasAxis<A>, A: MeshAxis>(
    p: MatmulParts<T, M>,
) {
    let MatmulParts {
        x,
        w,
        out,
        mut shards,
        local,
        send,
        recv,
        acc,
        devices,
    } = p;
    let (f, t) = (program_id(0), program_id(1));
    let rows = w.shape()[0];
    let block_f = shards.shape()[2];
    let n = devices.size::<A>() as i32;
    let me = devices.index::<A>();
    // Shard `j`'s slot of the buffer, and its product with its columns of `x`.
    let slot = |j: Value| [ds(j, 1), all(), all()];
    let partial = |shards: &Vmem<T>, j: Value| {
        let cols = x.at(&[all(), ds(j * rows as i32, rows)]).load();
        let wj = shards.at(&slot(j)).load().reshape(&[rows, block_f]);
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

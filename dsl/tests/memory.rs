//! Kernels that move their own data, on the interpreter: a double-buffered gather from an
//! HBM operand, a ring shift over 4 devices with remote copies, and each protocol error the
//! types cannot see, read from its message (the compile errors are in tests/ui/memory/).
//!
//! The kernels are written against the builder the `#[tpu_kernel]` expansion calls, until
//! the macro declares HBM operands, VMEM buffers, semaphores and meshes itself.

use tessera_dsl::__private::{ArgDecl, Builder, DimSemantics, Loc, OperandRole, Stop};
use tessera_dsl::axes::Context;
use tessera_dsl::interpret::{run, run_on_devices, InterpretOptions};
use tessera_dsl::prelude::*;
use tessera_dsl::{
    mesh, ArgSpec, DeviceAxis, HostArray, KernelDef, KernelError, ProblemKind, TargetRules,
};

mesh!(Ring = [Context]);

/// A kernel definition from a build closure (what `#[tpu_kernel]` generates).
fn def(
    name: &'static str,
    args: &[(&'static str, OperandRole, DType, usize)],
    build: impl Fn(&mut Builder) -> Result<(), Stop> + Send + Sync + 'static,
) -> KernelDef {
    let args = args
        .iter()
        .map(|&(name, role, dtype, rank)| ArgDecl {
            name,
            role,
            dtype,
            rank,
        })
        .collect();
    KernelDef::__new(name, Vec::new(), args, Loc::caller(), build)
}

#[track_caller]
fn here() -> Loc {
    Loc::caller()
}

fn ring(n: usize) -> Vec<DeviceAxis> {
    vec![DeviceAxis::new("context", n)]
}

fn rows(n: usize, cols: usize, seed: usize) -> HostArray {
    let v: Vec<f32> = (0..n * cols)
        .map(|i| ((i * 7 + seed * 13) % 101) as f32 - 50.0)
        .collect();
    HostArray::f32([n, cols], v).unwrap()
}

/// The message of the only problem of `e`, with its line.
fn only(e: &KernelError) -> (ProblemKind, u32, String) {
    assert_eq!(e.problems.len(), 1, "{e}");
    let p = &e.problems[0];
    (p.kind, p.loc.map_or(0, |l| l.line), p.message.clone())
}

// ---------------------------------------------------------------------------------------
// A double-buffered gather: `out[g] = 2 * x[tiles[g]]`, 8 x 128 tiles of an HBM array. Step
// `g` starts the copy of tile `g + 1` into the other buffer (detached: the next step waits
// it) and waits its own tile, started by the step before (or by itself at `g == 0`).

fn gather_body(tiles: Smem<i32>, x: Hbm<f32>, out: RefMut<f32>, mut buf: Vmem<f32>, sems: DmaSem) {
    let g = program_id(0);
    let n = num_programs(0);
    let tile = |i: Value| ds(tiles.get([i]) * 8, 8);
    when(g.eq(0), || {
        async_copy(
            x.at(&[tile(g), all()]),
            buf.at_mut(&[ds(0usize, 1), all(), all()]),
            sems.at(0),
        )
        .detach();
    });
    let next = g + 1;
    when(next.lt(n), || {
        let slot = next % 2;
        async_copy(
            x.at(&[tile(next), all()]),
            buf.at_mut(&[ds(slot, 1), all(), all()]),
            sems.at(slot),
        )
        .detach();
    });
    let slot = g % 2;
    wait_copy(
        x.at(&[ds(0usize, 8), all()]),
        buf.at_mut(&[ds(slot, 1), all(), all()]),
        sems.at(slot),
    );
    let v = buf.at(&[ds(slot, 1), all(), all()]).load().reshape(&[8, 128]);
    out.store(v * 2.0);
}

fn gather() -> KernelDef {
    def(
        "gather",
        &[
            ("tiles", OperandRole::ScalarPrefetch, DType::I32, 1),
            ("x", OperandRole::Input, DType::F32, 2),
        ],
        |b| {
            let loc = here();
            let ts = b.__arg("tiles", DType::I32, 1)?;
            let xs = b.__arg("x", DType::F32, 2)?;
            let g = ts[0];
            b.__grid(&[g], &[DimSemantics::Arbitrary])?;
            let tiles = b.__prefetch::<i32>("tiles", ts, loc);
            let x = b.__hbm::<f32>("x", xs, loc);
            let block = vec![
                tessera_dsl::__private::BlockDim::Sized(8),
                tessera_dsl::__private::BlockDim::Sized(128),
            ];
            let out = b.__output::<f32>("out", vec![g * 8, 128], block, &|i| vec![i[0], 0i32.into_index()], loc);
            let buf = b.__vmem::<f32>("buf", vec![2, 8, 128], loc);
            let sems = b.__dma_sems("sems", vec![2], loc);
            gather_body(tiles, x, out, buf, sems);
            Ok(())
        },
    )
}

#[test]
fn double_buffered_gather_matches_the_reference() {
    let x = rows(64, 128, 1);
    let order = [5i32, 0, 7, 7, 2, 3];
    let tiles = HostArray::i32([order.len()], order.to_vec()).unwrap();
    let xs = x.to_f32_vec();
    let want: Vec<f32> = order
        .iter()
        .flat_map(|&t| xs[t as usize * 8 * 128..(t as usize + 1) * 8 * 128].to_vec())
        .map(|v| 2.0 * v)
        .collect();
    for options in [
        InterpretOptions::default(),
        InterpretOptions {
            copy_landing: Some(7),
            ..Default::default()
        },
    ] {
        let out = run(&gather(), &[tiles.clone(), x.clone()], &options).unwrap();
        assert_eq!(out[0].to_f32_vec(), want);
    }
    let k = gather()
        .instantiate(
            &[ArgSpec::of(&tiles), ArgSpec::of(&x)],
            &TargetRules::tpu(),
        )
        .unwrap();
    let text = k.to_text();
    assert!(text.contains("async_copy x["), "{text}");
    assert!(text.contains("wait_copy"), "{text}");
}

use tessera_dsl::IntoIndex;

// ---------------------------------------------------------------------------------------
// A ring shift over the devices of a `context` axis: device d's `out` is device d-1's `x`.

fn ring_shift(barrier: bool) -> KernelDef {
    def(
        if barrier { "ring_shift" } else { "ring_shift_no_barrier" },
        &[("x", OperandRole::Input, DType::F32, 2)],
        move |b| {
            let loc = here();
            let xs = b.__arg("x", DType::F32, 2)?;
            b.__grid(&[1], &[DimSemantics::Arbitrary])?;
            let x = b.__hbm::<f32>("x", xs.clone(), loc);
            let mut out = b.__hbm_out::<f32>("out", xs, loc);
            let send = b.__dma_sems("send", vec![], loc);
            let recv = b.__dma_sems("recv", vec![], loc);
            let dev = b.__devices::<Ring>()?;
            if barrier {
                let sem = dev.barrier();
                sem.signal_to(1, dev.prev::<Context>());
                sem.signal_to(1, dev.next::<Context>());
                sem.wait(2);
            }
            remote_copy(&x, &mut out, &send, &recv, dev.next::<Context>()).wait();
            Ok(())
        },
    )
}

fn per_device(n: usize) -> Vec<Vec<HostArray>> {
    (0..n).map(|d| vec![rows(8, 128, d)]).collect()
}

#[test]
fn ring_shift_over_four_devices_matches_the_reference() {
    let args = per_device(4);
    for options in [
        InterpretOptions::default(),
        InterpretOptions {
            copy_landing: Some(3),
            schedule_seed: Some(11),
            ..Default::default()
        },
    ] {
        let out = run_on_devices(&ring_shift(true), &ring(4), &args, &options).unwrap();
        for d in 0..4 {
            assert_eq!(out[d][0], args[(d + 3) % 4][0], "device {d}");
        }
    }
}

#[test]
fn a_remote_copy_without_the_barrier_is_a_race_with_the_receiver_entering() {
    let e = run_on_devices(&ring_shift(false), &ring(4), &per_device(4), &InterpretOptions::default())
        .unwrap_err();
    let (kind, _, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    assert!(message.starts_with("race on `out`[0, 0] on device"), "{message}");
    assert!(message.contains("the kernel's entry on device"), "{message}");
    assert!(message.contains("barrier"), "{message}");
}

#[test]
fn a_multi_device_kernel_needs_its_mesh() {
    let e = ring_shift(true)
        .instantiate(&[ArgSpec::new(DType::F32, [8, 128])], &TargetRules::tpu())
        .unwrap_err();
    assert!(e.to_string().contains("runs on a mesh with axes [\"context\"]"), "{e}");
}

// ---------------------------------------------------------------------------------------
// Protocol errors found by the interleaved interpreter.

/// Every device waits for the copy from its neighbour before starting its own: each waits
/// on the others, a deadlock no static count shows (the counts balance).
#[test]
fn waiting_to_receive_before_sending_deadlocks_the_ring() {
    let line = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let l = line.clone();
    let k = def("ring_deadlock", &[("x", OperandRole::Input, DType::F32, 2)], move |b| {
        let loc = here();
        let xs = b.__arg("x", DType::F32, 2)?;
        b.__grid(&[1], &[DimSemantics::Arbitrary])?;
        let x = b.__hbm::<f32>("x", xs.clone(), loc);
        let mut out = b.__hbm_out::<f32>("out", xs, loc);
        let send = b.__dma_sems("send", vec![], loc);
        let recv = b.__dma_sems("recv", vec![], loc);
        let dev = b.__devices::<Ring>()?;
        let sem = dev.barrier();
        sem.signal_to(1, dev.prev::<Context>());
        sem.signal_to(1, dev.next::<Context>());
        sem.wait(2);
        l.store(here().line + 1, std::sync::atomic::Ordering::Relaxed);
        wait_copy(&x, &mut out, &recv);
        let copy = remote_copy(&x, &mut out, &send, &recv, dev.next::<Context>());
        copy.wait_send().detach();
        Ok(())
    });
    let e = run_on_devices(&k, &ring(4), &per_device(4), &InterpretOptions::default()).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    let wait_line = line.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(at, wait_line, "{message}");
    assert!(message.starts_with("deadlock: device 0 at line"), "{message}");
    for d in 0..4 {
        assert!(message.contains(&format!("device {d} at line {wait_line} waits on `recv`")), "{message}");
    }
}

/// A one-step kernel on one device with an HBM input `x` [8, 128], an HBM output `out` and
/// the body `f(x, out, buf [2, 8, 128], sems [2])`; the line numbers it reports are read
/// from `lines`.
fn local(
    name: &'static str,
    f: impl Fn(Hbm<f32>, HbmMut<f32>, Vmem<f32>, DmaSem) + Send + Sync + 'static,
) -> KernelDef {
    def(name, &[("x", OperandRole::Input, DType::F32, 2)], move |b| {
        let loc = here();
        let xs = b.__arg("x", DType::F32, 2)?;
        b.__grid(&[1], &[DimSemantics::Arbitrary])?;
        let x = b.__hbm::<f32>("x", xs.clone(), loc);
        let out = b.__hbm_out::<f32>("out", xs, loc);
        let buf = b.__vmem::<f32>("buf", vec![2, 8, 128], loc);
        let sems = b.__dma_sems("sems", vec![2], loc);
        f(x, out, buf, sems);
        Ok(())
    })
}

fn run_local(k: &KernelDef) -> Result<Vec<HostArray>, KernelError> {
    run(k, &[rows(8, 128, 0)], &InterpretOptions::default())
}

type Lines = std::sync::Arc<std::sync::Mutex<Vec<u32>>>;

fn lines() -> Lines {
    Default::default()
}

#[track_caller]
fn mark(l: &Lines) {
    l.lock().unwrap().push(Loc::caller().line + 1);
}

fn slot(i: usize) -> [tessera_dsl::Idx; 3] {
    [ds(i, 1), all(), all()]
}

#[test]
fn a_copy_round_trip_through_vmem_is_exact() {
    let k = local("round_trip", |x, mut out, mut buf, sems| {
        async_copy(&x, buf.at_mut(&slot(1)), sems.at(1)).wait();
        let v = buf.at(&slot(1)).load();
        buf.at_mut(&slot(0)).store(v + 1.0);
        async_copy(buf.at(&slot(0)), &mut out, sems.at(0)).wait();
    });
    let x = rows(8, 128, 0);
    let out = run(&k, &[x.clone()], &InterpretOptions::default()).unwrap();
    let want: Vec<f32> = x.to_f32_vec().iter().map(|v| v + 1.0).collect();
    assert_eq!(out[0].to_f32_vec(), want);
}

#[test]
fn reading_a_detached_copys_destination_before_its_wait_is_a_race() {
    let l = lines();
    let m = l.clone();
    let k = local("early_read", move |x, _out, mut buf, sems| {
        mark(&m);
        async_copy(&x, buf.at_mut(&slot(0)), sems.at(0)).detach();
        mark(&m);
        let _early = buf.at(&slot(0)).load();
        wait_copy(&x, buf.at_mut(&slot(0)), sems.at(0));
    });
    let e = run_local(&k).unwrap_err();
    let (kind, at, message) = only(&e);
    let l = l.lock().unwrap();
    assert_eq!(kind, ProblemKind::Protocol);
    // Reported where the second of the two accesses happens: the copy lands at its wait.
    assert_eq!(at, l[0], "{e}");
    assert!(message.starts_with("race on `buf`[0, 0, 0]"), "{message}");
    assert!(
        message.contains(&format!("the copy started at line {} (writing it)", l[0])),
        "{message}"
    );
    assert!(message.contains(&format!("the load at line {}", l[1])), "{message}");
    assert!(message.contains("wait the copy before touching its destination"), "{message}");
}

#[test]
fn two_copies_in_flight_into_the_same_buffer_are_an_error() {
    let l = lines();
    let m = l.clone();
    let k = local("overlap", move |x, _out, mut buf, sems| {
        mark(&m);
        async_copy(&x, buf.at_mut(&slot(0)), sems.at(0)).detach();
        mark(&m);
        async_copy(&x, buf.at_mut(&slot(0)), sems.at(1)).detach();
        wait_copy(&x, buf.at_mut(&slot(0)), sems.at(0));
        wait_copy(&x, buf.at_mut(&slot(0)), sems.at(1));
    });
    let e = run_local(&k).unwrap_err();
    let (_, at, message) = only(&e);
    let l = l.lock().unwrap();
    assert_eq!(at, l[1], "{e}");
    assert!(
        message.contains(&format!("that the copy started at line {} is still writing", l[0])),
        "{message}"
    );
}

#[test]
fn a_semaphore_left_non_zero_by_data_is_reported_at_exit() {
    // The number of signals comes from SMEM: only the interpreter can count them.
    let l = lines();
    let m = l.clone();
    let k = def(
        "unbalanced",
        &[("n", OperandRole::ScalarPrefetch, DType::I32, 1)],
        move |b| {
            let loc = here();
            let ns = b.__arg("n", DType::I32, 1)?;
            b.__grid(&[2], &[DimSemantics::Arbitrary])?;
            let n = b.__prefetch::<i32>("n", ns, loc);
            let sem = b.__sems("sem", vec![], loc);
            mark(&m);
            sem.signal(n.get([0]));
            sem.wait(1);
            Ok(())
        },
    );
    let ok = HostArray::i32([1], vec![1]).unwrap();
    let bad = HostArray::i32([1], vec![2]).unwrap();
    run(&k, &[ok], &InterpretOptions::default()).unwrap();
    let e = run(&k, &[bad], &InterpretOptions::default()).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    assert_eq!(at, l.lock().unwrap()[0], "{e}");
    assert!(
        message.starts_with("`sem` is 2 signals at the end of the kernel, not zero"),
        "{message}"
    );
}

/// With the barrier, the remote copy may land; but every device reads its own `buf` before
/// waiting for the copy that its neighbour sends into it.
#[test]
fn reading_before_the_remote_copy_is_received_is_a_cross_device_race() {
    let l = lines();
    let m = l.clone();
    let k = def("ring_early_read", &[("x", OperandRole::Input, DType::F32, 2)], move |b| {
        let loc = here();
        let xs = b.__arg("x", DType::F32, 2)?;
        b.__grid(&[1], &[DimSemantics::Arbitrary])?;
        let x = b.__hbm::<f32>("x", xs.clone(), loc);
        let mut out = b.__hbm_out::<f32>("out", xs, loc);
        let mut buf = b.__vmem::<f32>("buf", vec![8, 128], loc);
        let send = b.__dma_sems("send", vec![], loc);
        let recv = b.__dma_sems("recv", vec![], loc);
        let dev = b.__devices::<Ring>()?;
        let sem = dev.barrier();
        sem.signal_to(1, dev.prev::<Context>());
        sem.signal_to(1, dev.next::<Context>());
        sem.wait(2);
        mark(&m);
        let copy = remote_copy(&x, &mut buf, &send, &recv, dev.next::<Context>());
        copy.wait_send().detach();
        mark(&m);
        let early = buf.load();
        wait_copy(&x, &mut buf, &recv);
        buf.store(early);
        async_copy(&buf, &mut out, &send).wait();
        Ok(())
    });
    let e = run_on_devices(&k, &ring(4), &per_device(4), &InterpretOptions::default()).unwrap_err();
    let (kind, at, message) = only(&e);
    let l = l.lock().unwrap();
    assert_eq!(kind, ProblemKind::Protocol);
    assert!(message.starts_with("race on `buf`[0, 0] on device"), "{message}");
    assert!(message.contains(&format!("line {}", l[1])), "{message}");
    assert!(
        message.contains(&format!("the copy started at line {} on device", l[0])),
        "{message}"
    );
    assert!([l[0], l[1]].contains(&at), "{e}");
}

// ---------------------------------------------------------------------------------------
// Protocol errors found when the kernel is traced or instantiated.

#[test]
fn a_copy_token_dropped_unwaited_is_reported_at_its_start() {
    let l = lines();
    let m = l.clone();
    let k = local("dropped", move |x, _out, mut buf, sems| {
        mark(&m);
        let _copy = async_copy(&x, buf.at_mut(&slot(0)), sems.at(0));
    });
    let e = run_local(&k).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Trace);
    assert_eq!(at, l.lock().unwrap()[0], "{e}");
    assert!(message.starts_with("this async_copy is never waited"), "{message}");
}

#[test]
fn a_wait_inside_a_when_for_a_copy_started_outside_is_reported() {
    let l = lines();
    let m = l.clone();
    let k = local("conditional_wait", move |x, _out, mut buf, sems| {
        let copy = async_copy(&x, buf.at_mut(&slot(0)), sems.at(0));
        when(program_id(0).eq(0), || {
            mark(&m);
            copy.wait();
        });
    });
    let e = run_local(&k).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Trace);
    assert_eq!(at, l.lock().unwrap()[0], "{e}");
    assert!(message.contains("from inside a `when`, loop or scope that did not start it"), "{message}");
}

#[test]
fn a_copy_nothing_waits_is_found_at_instantiation() {
    let l = lines();
    let m = l.clone();
    let k = local("never_waited", move |x, _out, mut buf, sems| {
        mark(&m);
        async_copy(&x, buf.at_mut(&slot(0)), sems.at(0)).detach();
    });
    let e = run_local(&k).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    assert_eq!(at, l.lock().unwrap()[0], "{e}");
    assert!(message.contains("nothing ever waits on `sems`"), "{message}");
}

#[test]
fn counts_that_do_not_balance_over_the_grid_are_found_at_instantiation() {
    // Every step starts a copy into slot `g % 2`, but only even steps wait theirs.
    let l = lines();
    let m = l.clone();
    let k = def("unbalanced_grid", &[("x", OperandRole::Input, DType::F32, 2)], move |b| {
        let loc = here();
        let xs = b.__arg("x", DType::F32, 2)?;
        b.__grid(&[4], &[DimSemantics::Arbitrary])?;
        let x = b.__hbm::<f32>("x", xs, loc);
        let mut buf = b.__vmem::<f32>("buf", vec![2, 8, 128], loc);
        let sems = b.__dma_sems("sems", vec![2], loc);
        let g = program_id(0);
        let s = g % 2;
        mark(&m);
        async_copy(&x, buf.at_mut(&[ds(s, 1), all(), all()]), sems.at(s)).detach();
        when((g % 2).eq(0), || {
            mark(&m);
            wait_copy(&x, buf.at_mut(&[ds(s, 1), all(), all()]), sems.at(s));
        });
        Ok(())
    });
    let e = k
        .instantiate(&[ArgSpec::new(DType::F32, [8, 128])], &TargetRules::tpu())
        .unwrap_err();
    let (kind, at, message) = only(&e);
    let l = l.lock().unwrap();
    assert_eq!(kind, ProblemKind::Protocol);
    assert_eq!(at, l[0], "{e}");
    assert!(
        message.starts_with(&format!(
            "`sems`[1] is not zero at the end of the kernel: 8192 bytes more arrive than are \
             waited for (incremented at lines [{}], waited at lines [{}])",
            l[0], l[1]
        )),
        "{message}"
    );
}

#[test]
fn a_wait_before_its_copy_starts_is_a_deadlock_found_at_instantiation() {
    let l = lines();
    let m = l.clone();
    let k = local("wait_first", move |x, _out, mut buf, sems| {
        mark(&m);
        wait_copy(&x, buf.at_mut(&slot(0)), sems.at(0));
        async_copy(&x, buf.at_mut(&slot(0)), sems.at(0)).detach();
    });
    let e = run_local(&k).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    assert_eq!(at, l.lock().unwrap()[0], "{e}");
    assert!(
        message.starts_with("deadlock: this waits for 4096 bytes on `sems`[0] at grid step [0]"),
        "{message}"
    );
}

#[test]
fn a_scoped_buffer_used_outside_its_scope_is_reported() {
    let l = lines();
    let m = l.clone();
    let k = local("escaped", move |x, mut out, _buf, _sems| {
        let mut kept = None;
        run_scoped(|s| {
            let mut tmp = s.vmem::<f32>("tmp", &[8, 128]);
            let sem = s.dma_sems("sem", &[]);
            async_copy(&x, &mut tmp, &sem).wait();
            async_copy(&tmp, &mut out, &sem).wait();
            kept = Some(tmp);
        });
        mark(&m);
        let _v = kept.expect("set").load();
    });
    let e = run_local(&k).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Trace);
    assert_eq!(at, l.lock().unwrap()[0], "{e}");
    assert!(
        message.contains("`tmp@scope1` was allocated by a `run_scoped` region and is used outside it"),
        "{message}"
    );
}

#[test]
fn run_scoped_allocates_per_region() {
    let k = local("scoped", |x, mut out, _buf, _sems| {
        run_scoped(|s| {
            let mut tmp = s.vmem::<f32>("tmp", &[8, 128]);
            let sem = s.dma_sems("sem", &[]);
            async_copy(&x, &mut tmp, &sem).wait();
            let v = tmp.load();
            tmp.store(v * 3.0);
            async_copy(&tmp, &mut out, &sem).wait();
        });
    });
    let x = rows(8, 128, 2);
    let out = run(&k, &[x.clone()], &InterpretOptions::default()).unwrap();
    let want: Vec<f32> = x.to_f32_vec().iter().map(|v| v * 3.0).collect();
    assert_eq!(out[0].to_f32_vec(), want);
}

//! Kernels that move their own data: each protocol error the types cannot see, found when the
//! kernel is traced or instantiated or by the (interleaved, multi-device) interpreter, read
//! from its message; the compile errors are in tests/ui/memory/, the kernels that pass on
//! every backend in tests/memory_backends.rs.
//!
//! The kernels are written against the builder the `#[tpu_kernel]` expansion calls, until
//! the macro declares HBM operands, VMEM buffers, semaphores and meshes itself.

use tessera_dsl::__private::{ArgDecl, Builder, DimSemantics, Loc, OperandRole, Stop};
use tessera_dsl::axes::Context;
use tessera_dsl::interpret::{run, run_on_devices, InterpretOptions};
use tessera_dsl::prelude::*;
use tessera_dsl::{
    mesh, ArgSpec, DeviceAxis, HostArray, KernelDef, KernelError, KernelRules, ProblemKind,
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
        .map(|&(name, role, dtype, rank)| ArgDecl::new(name, role, dtype, rank))
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
// A ring shift over the devices of a `context` axis: device d's `out` is device d-1's `x`.

/// The operands of the ring kernels below: `x` and `out` `[8, 128]` in HBM, a `Vmem` buffer
/// of that shape, send and receive DMA semaphores, a regular semaphore and the mesh.
struct RingParts {
    x: Hbm<f32>,
    out: HbmMut<f32>,
    buf: Vmem<f32>,
    send: DmaSem,
    recv: DmaSem,
    sem: Sem,
    dev: Devices<Ring>,
}

/// A kernel on the `Ring` mesh with a grid of `steps`, whose body is `f`.
fn ring_kernel(
    name: &'static str,
    steps: usize,
    f: impl Fn(RingParts) + Send + Sync + 'static,
) -> KernelDef {
    def(
        name,
        &[("x", OperandRole::Input, DType::F32, 2)],
        move |b| {
            let loc = here();
            let xs = b.__arg("x", DType::F32, 2)?;
            b.__grid(&[steps], &[DimSemantics::Arbitrary])?;
            f(RingParts {
                x: b.__hbm::<f32>("x", xs.clone(), loc),
                out: b.__hbm_out::<f32>("out", xs.clone(), loc),
                buf: b.__vmem::<f32>("buf", xs, loc),
                send: b.__dma_sems("send", vec![], loc),
                recv: b.__dma_sems("recv", vec![], loc),
                sem: b.__sems("sem", vec![], loc),
                dev: b.__devices::<Ring>()?,
            });
            Ok(())
        },
    )
}

/// Every device signals both neighbours on the barrier semaphore and waits for theirs.
fn meet(dev: &Devices<Ring>) {
    let barrier = dev.barrier();
    barrier.signal_to(1, dev.prev::<Context>());
    barrier.signal_to(1, dev.next::<Context>());
    barrier.wait(2);
}

/// A ring shift whose devices do not meet at the barrier before the remote copy (the
/// correct kernel is `tessera::collective_kernels::memory::ring_shift`).
fn ring_shift_no_barrier() -> KernelDef {
    ring_kernel("ring_shift_no_barrier", 1, |p| {
        let mut out = p.out;
        remote_copy(&p.x, &mut out, &p.send, &p.recv, p.dev.next::<Context>()).wait();
    })
}

fn per_device(n: usize) -> Vec<Vec<HostArray>> {
    (0..n).map(|d| vec![rows(8, 128, d)]).collect()
}

/// Refused at instantiation, where the grid and the devices are static (the interpreter's
/// own check, for orders that depend on data, is tests/distributed_tutorial.rs's).
#[test]
fn a_remote_copy_without_the_barrier_is_refused_at_its_line() {
    let e = run_on_devices(
        &ring_shift_no_barrier(),
        &ring(4),
        &per_device(4),
        &InterpretOptions::default(),
    )
    .unwrap_err();
    let (kind, _, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    assert!(
        message.starts_with(
            "writes into device 1 (at grid step [0] on device 0) before this device has met"
        ),
        "{message}"
    );
    assert!(
        message.contains("devices.barrier().signal_to(1, ..)"),
        "{message}"
    );
    assert_eq!(
        e.problems[0].loc.map(|l| l.file),
        Some("dsl/tests/memory.rs")
    );
}

#[test]
fn a_multi_device_kernel_needs_its_mesh() {
    let e = ring_shift_no_barrier()
        .instantiate(&[ArgSpec::new(DType::F32, [8, 128])], &KernelRules::tpu())
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("runs on a mesh with axes [\"context\"]"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------
// Protocol errors found by the interleaved interpreter.

/// Every device waits for the copy from its neighbour before starting its own: each waits
/// on the others, a deadlock no static count shows (the counts balance).
#[test]
fn waiting_to_receive_before_sending_deadlocks_the_ring() {
    let l = lines();
    let m = l.clone();
    let k = ring_kernel("ring_deadlock", 1, move |p| {
        let (x, mut out) = (p.x, p.out);
        meet(&p.dev);
        mark(&m);
        wait_copy(&x, &mut out, &p.recv);
        let copy = remote_copy(&x, &mut out, &p.send, &p.recv, p.dev.next::<Context>());
        copy.wait_send().detach();
    });
    let e = run_on_devices(&k, &ring(4), &per_device(4), &InterpretOptions::default()).unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    let wait_line = l.lock().unwrap()[0];
    assert_eq!(at, wait_line, "{message}");
    assert!(
        message.starts_with("deadlock: device 0 at line"),
        "{message}"
    );
    for d in 0..4 {
        assert!(
            message.contains(&format!("device {d} at line {wait_line} waits on `recv`")),
            "{message}"
        );
    }
}

/// A one-step kernel on one device with an HBM input `x` [8, 128], an HBM output `out` and
/// the body `f(x, out, buf [2, 8, 128], sems [2])`; the line numbers it reports are read
/// from `lines`.
fn local(
    name: &'static str,
    f: impl Fn(Hbm<f32>, HbmMut<f32>, Vmem<f32>, DmaSem) + Send + Sync + 'static,
) -> KernelDef {
    def(
        name,
        &[("x", OperandRole::Input, DType::F32, 2)],
        move |b| {
            let loc = here();
            let xs = b.__arg("x", DType::F32, 2)?;
            b.__grid(&[1], &[DimSemantics::Arbitrary])?;
            let x = b.__hbm::<f32>("x", xs.clone(), loc);
            let out = b.__hbm_out::<f32>("out", xs, loc);
            let buf = b.__vmem::<f32>("buf", vec![2, 8, 128], loc);
            let sems = b.__dma_sems("sems", vec![2], loc);
            f(x, out, buf, sems);
            Ok(())
        },
    )
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
    let out = run(&k, std::slice::from_ref(&x), &InterpretOptions::default()).unwrap();
    let want: Vec<f32> = x.to_f32_vec().iter().map(|v| v + 1.0).collect();
    assert_eq!(out[0].to_f32_vec(), want);
}

/// Found before the kernel runs: the abstract run of the protocol check follows the copies a
/// device started (the interpreter's vector clocks find the same race at run time where
/// offsets depend on data, and across devices:
/// `reading_before_the_remote_copy_is_received_is_a_cross_device_race`).
#[test]
fn reading_a_detached_copys_destination_before_its_wait_is_found_at_instantiation() {
    let l = lines();
    let m = l.clone();
    let k = local("early_read", move |x, _out, mut buf, sems| {
        mark(&m);
        async_copy(&x, buf.at_mut(&slot(0)), sems.at(0)).detach();
        mark(&m);
        let _early = buf.at(&slot(0)).load();
        // The other slot is not in flight: no problem there.
        let _other = buf.at(&slot(1)).load();
        wait_copy(&x, buf.at_mut(&slot(0)), sems.at(0));
    });
    let e = k
        .instantiate(&[ArgSpec::new(DType::F32, [8, 128])], &KernelRules::tpu())
        .unwrap_err();
    let (kind, at, message) = only(&e);
    let l = l.lock().unwrap();
    assert_eq!(kind, ProblemKind::Protocol);
    assert_eq!(at, l[1], "{e}");
    assert!(
        message.starts_with(&format!(
            "this reads `buf` at grid step [0] while the copy into it started at line {} may \
             still be in flight (it ends at a wait on `sems`[0])",
            l[0]
        )),
        "{message}"
    );
}

/// A copy descriptor started in one grid step and waited in the next (Pallas' double
/// buffering) leaves the protocol to the check: a step that reads the slot before waiting is
/// reported with the step.
#[test]
fn a_descriptor_read_before_its_wait_in_a_later_step_is_found_at_instantiation() {
    let l = lines();
    let m = l.clone();
    let k = def(
        "pipelined",
        &[("x", OperandRole::Input, DType::F32, 2)],
        move |b| {
            let loc = here();
            let xs = b.__arg("x", DType::F32, 2)?;
            b.__grid(&[3], &[DimSemantics::Arbitrary])?;
            let x = b.__hbm::<f32>("x", xs, loc);
            let mut buf = b.__vmem::<f32>("buf", vec![2, 8, 128], loc);
            let sems = b.__dma_sems("sems", vec![2], loc);
            let g = program_id(0);
            let fetch = |buf: &mut Vmem<f32>, step: Value| {
                let s = step % 2;
                make_async_copy(&x, buf.at_mut(&[ds(s, 1), all(), all()]), sems.at(s))
            };
            when(g.eq(0), || fetch(&mut buf, g).start());
            when((g + 1).lt(3), || fetch(&mut buf, g + 1).start());
            mark(&m);
            let _early = buf.at(&[ds(g % 2, 1), all(), all()]).load();
            fetch(&mut buf, g).wait();
            Ok(())
        },
    );
    let e = k
        .instantiate(&[ArgSpec::new(DType::F32, [8, 128])], &KernelRules::tpu())
        .unwrap_err();
    let (kind, at, message) = only(&e);
    assert_eq!(kind, ProblemKind::Protocol);
    assert_eq!(at, l.lock().unwrap()[0], "{e}");
    assert!(
        message.starts_with("this reads `buf` at grid step [0]"),
        "{message}"
    );
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
        message.contains(&format!(
            "that the copy started at line {} is still writing",
            l[0]
        )),
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
    let k = ring_kernel("ring_early_read", 1, move |p| {
        let (x, mut out, mut buf) = (p.x, p.out, p.buf);
        meet(&p.dev);
        mark(&m);
        let copy = remote_copy(&x, &mut buf, &p.send, &p.recv, p.dev.next::<Context>());
        copy.wait_send().detach();
        mark(&m);
        let early = buf.load();
        wait_copy(&x, &mut buf, &p.recv);
        buf.store(early);
        async_copy(&buf, &mut out, &p.recv).wait();
    });
    let e = run_on_devices(&k, &ring(4), &per_device(4), &InterpretOptions::default()).unwrap_err();
    let (kind, at, message) = only(&e);
    let l = l.lock().unwrap();
    assert_eq!(kind, ProblemKind::Protocol, "{message}");
    assert!(
        message.starts_with("race on `buf`[0, 0] on device"),
        "{message}"
    );
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
    assert!(
        message.starts_with("this async_copy is never waited"),
        "{message}"
    );
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
    assert!(
        message.contains("from inside a `when`, loop or scope that did not start it"),
        "{message}"
    );
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
    assert!(
        message.contains("nothing ever waits on `sems`"),
        "{message}"
    );
}

#[test]
fn counts_that_do_not_balance_over_the_grid_are_found_at_instantiation() {
    // Every step starts a copy into slot `g % 2`, but only even steps wait theirs.
    let l = lines();
    let m = l.clone();
    let k = def(
        "unbalanced_grid",
        &[("x", OperandRole::Input, DType::F32, 2)],
        move |b| {
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
        },
    );
    let e = k
        .instantiate(&[ArgSpec::new(DType::F32, [8, 128])], &KernelRules::tpu())
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
        message
            .contains("`tmp@scope1` was allocated by a `run_scoped` region and is used outside it"),
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
    let out = run(&k, std::slice::from_ref(&x), &InterpretOptions::default()).unwrap();
    let want: Vec<f32> = x.to_f32_vec().iter().map(|v| v * 3.0).collect();
    assert_eq!(out[0].to_f32_vec(), want);
}

// ---------------------------------------------------------------------------------------
// Remote-copy patterns the StableHLO lowering refuses, each with its sentence.

fn spmd_error(k: &KernelDef) -> String {
    let kernel = k
        .instantiate_on(
            &[ArgSpec::new(DType::F32, [8, 128])],
            &ring(4),
            &KernelRules::tpu(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let e = tessera_dsl::stablehlo::lower_module_spmd(&kernel).unwrap_err();
    let (kind, _, message) = only(&e);
    assert_eq!(kind, ProblemKind::Lower);
    message
}

/// A ring kernel over 4 grid steps whose copy target and condition are `f(devices)`.
fn ring_variant(
    name: &'static str,
    f: impl Fn(&Devices<Ring>) -> (tessera_dsl::DeviceId<Ring>, Value) + Send + Sync + 'static,
) -> KernelDef {
    ring_kernel(name, 4, move |p| {
        let (x, mut out) = (p.x, p.out);
        meet(&p.dev);
        let (to, cond) = f(&p.dev);
        when(cond, || {
            remote_copy(&x, &mut out, &p.send, &p.recv, to).wait()
        });
    })
}

#[test]
fn a_ring_lowers_to_one_collective_permute_per_copy() {
    let k = ring_variant("ring", |d| (d.next::<Context>(), program_id(0).ge(0)));
    let kernel = k
        .instantiate_on(
            &[ArgSpec::new(DType::F32, [8, 128])],
            &ring(4),
            &KernelRules::tpu(),
        )
        .unwrap();
    let text = tessera_dsl::stablehlo::lower_module_spmd(&kernel)
        .unwrap()
        .to_mlir();
    assert!(text.contains("stablehlo.partition_id"), "{text}");
    assert!(
        text.contains("source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]>"),
        "{text}"
    );
}

#[test]
fn a_target_that_depends_on_the_grid_step_is_not_lowered_to_stablehlo() {
    let k = ring_variant("ring_by_step", |d| {
        let step = program_id(0);
        (
            d.at::<Context>((d.index::<Context>() + step + 1) % 4),
            step.ge(0),
        )
    });
    let message = spmd_error(&k);
    assert!(
        message.starts_with("for the StableHLO lowering, the target device of a remote copy"),
        "{message}"
    );
}

#[test]
fn a_remote_copy_under_a_device_dependent_condition_is_not_lowered_to_stablehlo() {
    let k = ring_variant("ring_when_device", |d| {
        (d.next::<Context>(), d.index::<Context>().ge(0))
    });
    let message = spmd_error(&k);
    assert!(
        message.starts_with("a remote copy or signal under a `when` whose condition may differ"),
        "{message}"
    );
}

#[test]
fn several_devices_signalling_one_is_not_lowered_to_stablehlo() {
    let k = ring_kernel("fan_in", 1, |p| {
        // Every device meets every other at the barrier (the first fan-in of the kernel).
        let barrier = p.dev.barrier();
        for d in 0..4 {
            barrier.signal_to(1, p.dev.at::<Context>(d));
        }
        barrier.wait(4);
        p.sem.signal_to(1, p.dev.at::<Context>(0));
        when(p.dev.index::<Context>().eq(0), || p.sem.wait(4));
    });
    // The interpreter runs it; StableHLO's collective_permute cannot express it.
    run_on_devices(&k, &ring(4), &per_device(4), &InterpretOptions::default()).unwrap();
    let message = spmd_error(&k);
    assert!(
        message.starts_with("several devices target device 0"),
        "{message}"
    );
}

//! The kernels of JAX's "Distributed computing in Pallas for TPUs" tutorial
//! (`examples/distributed/kernels.rs`: right permute, ring all-gather, all-reduce with
//! flow-control semaphores, bidirectional reduce-scatter, and a double-buffered pipeline over
//! an HBM operand), each checked against its f64 reference on the interpreter (4 interleaved
//! devices, also with copies landing at random points and shuffled device schedules) and on
//! every backend (4 CPU devices: one SPMD program); the Mosaic lowering run by mosaic-eval
//! equals the interpreter bit for bit, and libtpu compiles every kernel for `v5p:2x2x1`.

mod common;

#[path = "../examples/distributed/kernels.rs"]
mod kernels;

use tessera::backend::{self, Backend};
use tessera::dsl::axes::Context;
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::Lowering;
use tessera::dsl::{mosaic, ArgSpec, DeviceAxis, HostArray, Kernel, KernelDef, KernelRules};
use tessera::prelude::*;
use tessera::runtime::{CompileOptions, Plugin};

use kernels::*;

/// Devices of the ring.
const N: usize = 4;

/// f32 sums of at most 8 terms against f64.
const TOL: f64 = 1e-5;

/// A kernel with its mesh (empty: one device), each device's arguments and each device's
/// expected first output.
struct Case {
    name: &'static str,
    def: KernelDef,
    mesh: Vec<DeviceAxis>,
    per_device: Vec<Vec<HostArray>>,
    want: Vec<Vec<f64>>,
}

/// `[8, 128]` f32 shards, one per device.
fn shards() -> Vec<HostArray> {
    (0..N)
        .map(|d| HostArray::random(DType::F32, [8, 128], d as u64))
        .collect()
}

fn one_each(arrays: &[HostArray]) -> Vec<Vec<HostArray>> {
    arrays.iter().map(|a| vec![a.clone()]).collect()
}

fn right_permute_case() -> Case {
    let x = shards();
    Case {
        name: "right_permute",
        def: right_permute(),
        mesh: ring_mesh(N),
        per_device: one_each(&x),
        want: right_permute_reference(&x),
    }
}

fn all_gather_case() -> Case {
    let x = shards();
    Case {
        name: "all_gather",
        def: all_gather(),
        mesh: ring_mesh(N),
        per_device: one_each(&x),
        want: vec![all_gather_reference(&x); N],
    }
}

fn all_reduce_case() -> Case {
    let x = shards();
    Case {
        name: "all_reduce",
        def: all_reduce(),
        mesh: ring_mesh(N),
        per_device: one_each(&x),
        want: vec![all_reduce_reference(&x); N],
    }
}

fn reduce_scatter_case() -> Case {
    // One [16, 128] block per device: halves of 8 rows travel each way.
    let x: Vec<HostArray> = (0..N)
        .map(|d| HostArray::random(DType::F32, [N, 16, 128], 10 + d as u64))
        .collect();
    Case {
        name: "reduce_scatter",
        def: reduce_scatter(),
        mesh: ring_mesh(N),
        per_device: one_each(&x),
        want: reduce_scatter_reference(&x),
    }
}

fn double_buffered_sum_case() -> Case {
    // 8 windows of [8, 256].
    let x = HostArray::random(DType::F32, [64, 256], 99);
    Case {
        name: "double_buffered_sum",
        def: double_buffered_sum(),
        mesh: vec![],
        want: vec![double_buffered_sum_reference(&x)],
        per_device: vec![vec![x]],
    }
}

fn cases() -> Vec<Case> {
    vec![
        right_permute_case(),
        all_gather_case(),
        all_reduce_case(),
        reduce_scatter_case(),
        double_buffered_sum_case(),
    ]
}

/// Asserts every device's first output is within `TOL` of `want` (NaN fails).
#[track_caller]
fn assert_matches(case: &Case, outs: &[Vec<HostArray>], what: &str) {
    assert_eq!(outs.len(), case.want.len(), "{} {what}: devices", case.name);
    for (d, (out, want)) in outs.iter().zip(&case.want).enumerate() {
        common::assert_close(
            &out[0].to_f64_vec(),
            want,
            TOL,
            &format!("{} {what}, device {d}", case.name),
        );
    }
}

#[test]
fn every_kernel_matches_its_reference_on_the_interpreter() {
    for case in cases() {
        let outs = interpret::run_on_devices(
            &case.def,
            &case.mesh,
            &case.per_device,
            &InterpretOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        assert_matches(&case, &outs, "interpreted");
    }
}

/// Copies landing anywhere between their start and their wait, and other interleavings of
/// the devices, find no race or deadlock and change nothing.
#[test]
fn landing_points_and_interleavings_do_not_change_the_results() {
    for case in cases() {
        let want = interpret::run_on_devices(
            &case.def,
            &case.mesh,
            &case.per_device,
            &InterpretOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        for seed in 0..8 {
            let options = InterpretOptions {
                copy_landing: Some(seed),
                schedule_seed: Some(seed + 100),
                ..Default::default()
            };
            let got = interpret::run_on_devices(&case.def, &case.mesh, &case.per_device, &options)
                .unwrap_or_else(|e| panic!("{} seed {seed}: {e}", case.name));
            assert_eq!(got, want, "{} seed {seed}", case.name);
            assert_matches(&case, &got, &format!("seed {seed}"));
        }
    }
}

#[test]
fn every_kernel_matches_its_reference_on_every_backend() {
    for case in cases() {
        for b in Backend::everywhere() {
            let outs = backend::run_on_devices(
                &case.def,
                &case.mesh,
                &case.per_device,
                b,
                &KernelRules::tpu(),
            )
            .unwrap_or_else(|e| panic!("{} on {b}: {e}", case.name));
            assert_matches(&case, &outs, &format!("on {b}"));
        }
    }
}

/// The Mosaic lowering of each kernel, run by the evaluator (4 devices for the collectives,
/// each on two cores), equals the interpreter bit for bit.
#[test]
fn mosaic_eval_on_four_devices_agrees_with_the_interpreter() {
    for case in cases() {
        let want = interpret::run_on_devices(
            &case.def,
            &case.mesh,
            &case.per_device,
            &InterpretOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{}: {e}", case.name));
        let got = common::mosaic_eval_on_mesh(&case.def, &case.mesh, &case.per_device);
        assert_eq!(got, want, "{}", case.name);
        assert_matches(&case, &got, "by mosaic-eval");
    }
}

/// The preconditions refuse what the kernels cannot do, with their sentences.
#[test]
fn preconditions_refuse_mismatched_shapes() {
    let rules = KernelRules::tpu();
    let f32s = |s: &[usize]| ArgSpec::new(DType::F32, s.to_vec());
    let refusals = [
        (
            reduce_scatter(),
            f32s(&[3, 16, 128]),
            ring_mesh(N),
            "x holds 3 blocks but the ring has 4 devices",
        ),
        (
            reduce_scatter(),
            f32s(&[4, 9, 128]),
            ring_mesh(N),
            "blocks of 9 rows do not split in two halves",
        ),
        (
            all_gather(),
            f32s(&[8, 128]),
            ring_mesh(1),
            "the ring has 1 device; an all-gather needs at least 2",
        ),
        (
            all_reduce(),
            f32s(&[8, 128]),
            ring_mesh(1),
            "the ring has 1 device; an all-reduce needs at least 2",
        ),
        (
            double_buffered_sum(),
            f32s(&[12, 128]),
            vec![],
            "12 rows are not whole windows of 8 rows",
        ),
    ];
    for (def, spec, mesh, sentence) in refusals {
        let e = def
            .instantiate_on(std::slice::from_ref(&spec), &mesh, &rules)
            .expect_err(sentence);
        assert!(e.to_string().contains(sentence), "{e}");
    }
}

fn libtpu() -> Plugin {
    Plugin::libtpu().unwrap_or_else(|e| panic!("libtpu is needed for the TPU compile tests: {e}"))
}

/// Compiles `k` for `v5p:2x2x1`: alone, or over its mesh's devices (one partition per chip);
/// on failure the message and the Mosaic text.
fn compile(plugin: &Plugin, k: &Kernel) -> Result<(), String> {
    let topology = plugin.topology("v5p:2x2x1").expect("topology");
    let n = k.num_devices();
    let module = if n > 1 {
        Lowering::tpu().lower_module_spmd(k)
    } else {
        Lowering::tpu().lower_module(k)
    }
    .map_err(|e| e.to_string())?;
    let text = module.to_mlir();
    if !text.contains("tpu_custom_call") {
        return Err(format!(
            "{}: no Mosaic call in the program:\n{text}",
            k.name
        ));
    }
    let options = CompileOptions::manual_partitions(n).expect("partitions");
    topology.compile(&text, &options).map(|_| ()).map_err(|e| {
        let text = mosaic::lower(k).map(|m| m.text).unwrap_or_default();
        format!("{}: {e}\n{text}", k.name)
    })
}

#[test]
fn every_kernel_compiles_for_v5p() {
    let plugin = libtpu();
    let failures: Vec<String> = cases()
        .iter()
        .filter_map(|case| {
            let specs: Vec<ArgSpec> = case.per_device[0].iter().map(ArgSpec::of).collect();
            let k = case
                .def
                .instantiate_on(&specs, &case.mesh, &KernelRules::tpu())
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(k.num_devices(), case.want.len(), "{}", case.name);
            println!("compiling {} on {} chips", case.name, k.num_devices());
            compile(&plugin, &k).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// [`all_reduce`] without its flow control (no `capacity` semaphore): a left neighbour a
/// step ahead may overwrite the working slot this device is still adding and sending.
#[tpu_kernel(grid = devices.size::<Context>())]
fn all_reduce_without_flow_control(
    #[shape(S, C)] x: Hbm<f32>,
    #[shape(S, C)] out: RefMut<f32>,
    #[scratch(2, S, C)] mut buf: Vmem<f32>,
    local: DmaSem,
    send: DmaSem,
    recv: DmaSem,
    devices: Devices<RingMesh>,
) {
    let step = program_id(0);
    let n = devices.size::<Context>() as i32;
    let slot = |j: Value| [ds(j, 1), all(), all()];
    let working = slot(step % 2);
    let receiving = slot((step + 1) % 2);
    when(step.eq(0), || {
        let barrier = devices.barrier();
        barrier.signal_to(1, devices.prev::<Context>());
        barrier.signal_to(1, devices.next::<Context>());
        barrier.wait(2);
        async_copy(&x, buf.at_mut(&working), &local).wait();
        out.store(0.0);
    });
    let sends = step.lt(n - 1);
    when(sends, || {
        let next = devices.next::<Context>();
        remote_copy_within(&mut buf, &working, &receiving, &send, &recv, next).detach();
    });
    out.store(out.load() + buf.at(&working).load().reshape(&[S, C]));
    when(sends, || {
        wait_copy_within(&mut buf, &working, &receiving, &send);
        wait_copy_within(&mut buf, &working, &receiving, &recv);
    });
}

/// [`right_permute`] without the barrier: a copy may land in a device that has not entered
/// the kernel.
#[tpu_kernel(grid = 1)]
fn right_permute_without_barrier(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] mut out: HbmMut<f32>,
    send: DmaSem,
    recv: DmaSem,
    devices: Devices<RingMesh>,
) {
    remote_copy(&x, &mut out, &send, &recv, devices.next::<Context>()).wait();
}

/// What the semaphores of the tutorial's kernels are for: without the flow control the
/// all-reduce races (the interpreter finds it), without the barrier the permute writes into
/// a device that may not have entered the kernel (the protocol check refuses it at
/// instantiation, naming the copy's line).
#[test]
fn what_the_semaphores_prevent_is_refused_without_them() {
    let x = one_each(&shards());
    let cases = [
        (
            all_reduce_without_flow_control(),
            "flow control",
            "race on `buf`",
        ),
        (
            right_permute_without_barrier(),
            "barrier",
            // Refused at instantiation, where the grid and the devices are static.
            "before this device has met the devices it writes into at the barrier",
        ),
    ];
    for (def, what, sentence) in cases {
        // Races are found by happens-before (vector clocks), whatever the interleaving.
        let options = (0..8).map(|seed| InterpretOptions {
            copy_landing: Some(seed),
            schedule_seed: Some(seed + 100),
            ..Default::default()
        });
        for options in std::iter::once(InterpretOptions::default()).chain(options) {
            match interpret::run_on_devices(&def, &ring_mesh(N), &x, &options) {
                Ok(_) => panic!("without the {what}, a run with {options:?} was not refused"),
                Err(e) => assert!(e.to_string().contains(sentence), "without the {what}: {e}"),
            }
        }
    }
}

/// [`right_permute_without_barrier`] with its copy under a condition read from SMEM: the
/// protocol check cannot follow it at instantiation, and the interpreter refuses the run.
#[tpu_kernel(grid = 1)]
fn right_permute_without_barrier_if(
    #[shape(1)] go: Smem<i32>,
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] mut out: HbmMut<f32>,
    send: DmaSem,
    recv: DmaSem,
    devices: Devices<RingMesh>,
) {
    when(go.get([0]).eq(1), || {
        remote_copy(&x, &mut out, &send, &recv, devices.next::<Context>()).wait();
    });
}

#[test]
fn the_interpreter_refuses_a_copy_into_a_device_not_known_to_have_entered() {
    let args: Vec<Vec<HostArray>> = shards()
        .into_iter()
        .map(|x| vec![HostArray::i32([1], vec![1]).unwrap(), x])
        .collect();
    let def = right_permute_without_barrier_if();
    let e = interpret::run_on_devices(&def, &ring_mesh(N), &args, &InterpretOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("a remote copy may land only in a device known to have entered the kernel"),
        "{e}"
    );
}

//! Kernels that move their own data, lowered to Mosaic and compiled by libtpu for v5p
//! (compile-only): one-device kernels alone in a program, collective kernels in a program of
//! one partition per chip of `v5p:2x2x1`, where each device's call talks to the others.

use tessera::collective_kernels::collective::{
    all_gather, all_gather_matmul, all_gather_of, all_to_all, all_to_all_of,
};
use tessera::collective_kernels::memory::RingMesh;
use tessera::collective_kernels::memory::{gather_tiles, ring_all_gather, ring_mesh, ring_shift};
use tessera::collective_kernels::memory::{gather_tiles_of, ring_all_gather_of, ring_shift_of};
use tessera::dsl::axes::Context;
use tessera::dsl::prelude::*;
use tessera::dsl::{mosaic, ArgSpec, DType, Kernel, KernelDef, KernelRules, Lowering, ProblemKind};
use tessera::paged::paged_attention;
use tessera::runtime::{CompileOptions, Plugin};

fn libtpu() -> Plugin {
    Plugin::libtpu().unwrap_or_else(|e| panic!("libtpu is needed for the TPU compile tests: {e}"))
}

/// Compiles `k` for `v5p:2x2x1`: alone, or over its mesh's devices; on failure the message
/// and the Mosaic text.
fn compile(k: &Kernel) -> Result<(), String> {
    let plugin = libtpu();
    let topology = plugin.topology("v5p:2x2x1").expect("topology");
    let n = k.num_devices();
    let module = if n > 1 {
        Lowering::tpu().lower_module_spmd(k)
    } else {
        Lowering::tpu().lower_module(k)
    }
    .map_err(|e| e.to_string())?;
    let options = CompileOptions::manual_partitions(n).expect("partitions");
    topology
        .compile(&module.to_mlir(), &options)
        .map(|_| ())
        .map_err(|e| {
            let text = mosaic::lower(k).map(|m| m.text).unwrap_or_default();
            format!("{}: {e}\n{text}", k.name)
        })
}

fn instantiate(def: &KernelDef, args: &[ArgSpec], devices: usize) -> std::sync::Arc<Kernel> {
    let mesh = if devices > 1 {
        ring_mesh(devices)
    } else {
        vec![]
    };
    def.instantiate_on(args, &mesh, &KernelRules::tpu())
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn memory_kernels_compile_for_v5p() {
    let f32s = |s: &[usize]| ArgSpec::new(DType::F32, s.to_vec());
    let cases = [
        instantiate(
            &gather_tiles(),
            &[ArgSpec::new(DType::I32, [7]), f32s(&[128, 256])],
            1,
        ),
        instantiate(&ring_shift(), &[f32s(&[8, 128])], 4),
        instantiate(&ring_all_gather(), &[f32s(&[8, 128])], 4),
    ];
    let mut cases = cases.to_vec();
    // Paged attention: MHA and GQA, f32 and bf16 (B 4, H 8, D 128, 64 pages of 16 rows, 8
    // per sequence, 4 per copy block).
    for kv_heads in [8, 2] {
        for dtype in [DType::F32, DType::BF16] {
            let def = match dtype {
                DType::BF16 => paged_attention::<half::bf16>(4),
                _ => paged_attention::<f32>(4),
            };
            let args = [
                ArgSpec::new(dtype, [4, 8, 128]),
                ArgSpec::new(dtype, [kv_heads, 64, 16, 128]),
                ArgSpec::new(dtype, [kv_heads, 64, 16, 128]),
                ArgSpec::new(DType::I32, [4]),
                ArgSpec::new(DType::I32, [4, 8]),
            ];
            cases.push(instantiate(&def, &args, 1));
        }
    }
    // The collectives over the 4 chips: x [256, 128] shards; x [512, 1024] and w shards
    // [256, 1024] (K / N = 256) in 256 x 512 blocks.
    cases.push(instantiate(
        &all_gather::<RingMesh, Context>(),
        &[f32s(&[256, 128])],
        4,
    ));
    // The all-to-all: chunks of 8 f32 rows (one tile) and of 256 rows.
    for rows in [32, 1024] {
        cases.push(instantiate(
            &all_to_all::<RingMesh, Context>(),
            &[f32s(&[rows, 128])],
            4,
        ));
    }
    for dtype in [DType::F32, DType::BF16] {
        let def = match dtype {
            DType::BF16 => all_gather_matmul::<half::bf16, RingMesh, Context>(256, 512),
            _ => all_gather_matmul::<f32, RingMesh, Context>(256, 512),
        };
        let args = [
            ArgSpec::new(dtype, [512, 1024]),
            ArgSpec::new(dtype, [256, 1024]),
        ];
        cases.push(instantiate(&def, &args, 4));
    }
    // The kernels that only copy in bf16, i32 and i8 (bf16 with slots and halves of 8 rows,
    // half its (16, 128) tile; gather_tiles in tiles of 16 rows of bf16); 8-bit gather_tiles
    // is refused by the TPU rules (its tile's reshape).
    let table = ArgSpec::new(DType::I32, [7]);
    for dtype in [DType::BF16, DType::I32, DType::I8] {
        let x = |s: &[usize]| ArgSpec::new(dtype, s.to_vec());
        let (gather, shift, ring, all, to_all) = match dtype {
            DType::BF16 => (
                Some(gather_tiles_of::<half::bf16>()),
                ring_shift_of::<half::bf16>(),
                ring_all_gather_of::<half::bf16>(),
                all_gather_of::<half::bf16, RingMesh, Context>(),
                all_to_all_of::<half::bf16, RingMesh, Context>(),
            ),
            DType::I32 => (
                Some(gather_tiles_of::<i32>()),
                ring_shift_of::<i32>(),
                ring_all_gather_of::<i32>(),
                all_gather_of::<i32, RingMesh, Context>(),
                all_to_all_of::<i32, RingMesh, Context>(),
            ),
            _ => (
                None,
                ring_shift_of::<i8>(),
                ring_all_gather_of::<i8>(),
                all_gather_of::<i8, RingMesh, Context>(),
                all_to_all_of::<i8, RingMesh, Context>(),
            ),
        };
        if let Some(gather) = gather {
            cases.push(instantiate(&gather, &[table.clone(), x(&[128, 256])], 1));
        }
        cases.push(instantiate(&shift, &[x(&[8, 128])], 4));
        cases.push(instantiate(&ring, &[x(&[8, 128])], 4));
        cases.push(instantiate(&all, &[x(&[16, 128])], 4));
        cases.push(instantiate(&all, &[x(&[256, 128])], 4));
        cases.push(instantiate(&to_all, &[x(&[128, 128])], 4));
    }
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|k| {
            println!("compiling {}", k.name);
            compile(k).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// What a copy kernel below does with its operands.
type CopyBody = fn(Hbm<f32>, HbmMut<f32>, Vmem<f32>, DmaSem);

/// A kernel copying windows of `x` (HBM, `[R, C]`) through a VMEM buffer of `buf_shape` into
/// `out` (HBM, `[R, C]`) with `body`.
#[tpu_kernel(grid = 1)]
fn copies_2d(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] out: HbmMut<f32>,
    #[scratch(buf_shape[0], buf_shape[1])] buf: Vmem<f32>,
    sem: DmaSem,
    #[comptime] buf_shape: [usize; 2],
    #[comptime] body: CopyBody,
) {
    body(x, out, buf, sem);
}

/// [`copies_2d`] for a rank-1 `x` of `[N]`.
#[tpu_kernel(grid = 1)]
fn copies_1d(
    #[shape(N)] x: Hbm<f32>,
    #[shape(N)] out: HbmMut<f32>,
    #[scratch(buf_len)] buf: Vmem<f32>,
    sem: DmaSem,
    #[comptime] buf_len: usize,
    #[comptime] body: CopyBody,
) {
    body(x, out, buf, sem);
}

/// A named copy case: its kernel and the spec of its `x`.
fn copies(
    name: &'static str,
    shape: &[usize],
    buf: &[usize],
    body: CopyBody,
) -> (&'static str, KernelDef, ArgSpec) {
    let def = match *buf {
        [len] => copies_1d(len, body),
        [rows, cols] => copies_2d([rows, cols], body),
        _ => panic!("copy cases are of rank 1 or 2"),
    };
    (name, def, ArgSpec::new(DType::F32, shape.to_vec()))
}

/// Copies whose windows break the lane rule of `KernelRules::tpu()`: each is refused by the
/// rules with its sentence, and by libtpu when instantiated without them.
#[test]
fn copies_breaking_the_lane_rule_are_refused_by_the_rules_and_by_libtpu() {
    let cases = [
        copies("lane_offset", &[8, 256], &[8, 256], |x, mut o, mut b, s| {
            async_copy(
                x.at(&[all(), ds(64, 64)]),
                b.at_mut(&[all(), ds(64, 64)]),
                &s,
            )
            .wait();
            async_copy(
                b.at(&[all(), ds(64, 64)]),
                o.at_mut(&[all(), ds(0, 64)]),
                &s,
            )
            .wait();
        }),
        copies("lane_width", &[8, 256], &[8, 64], |x, mut o, mut b, s| {
            async_copy(x.at(&[all(), ds(0, 64)]), &mut b, &s).wait();
            async_copy(&b, o.at_mut(&[all(), ds(0, 64)]), &s).wait();
        }),
        copies("one_d_offset", &[1024], &[200], |x, mut o, mut b, s| {
            async_copy(x.at(&[ds(100, 200)]), &mut b, &s).wait();
            async_copy(&b, o.at_mut(&[ds(300, 200)]), &s).wait();
        }),
        copies(
            "lane_width_192",
            &[8, 512],
            &[8, 192],
            |x, mut o, mut b, s| {
                async_copy(x.at(&[all(), ds(128, 192)]), &mut b, &s).wait();
                async_copy(&b, o.at_mut(&[all(), ds(0, 192)]), &s).wait();
            },
        ),
    ];
    let plugin = libtpu();
    let topology = plugin.topology("v5p:2x2x1").expect("topology");
    for (name, def, spec) in &cases {
        let e = def
            .instantiate(std::slice::from_ref(spec), &KernelRules::tpu())
            .expect_err(name);
        assert!(e.has(ProblemKind::TpuOp), "{name}: {e}");
        assert!(
            e.to_string().contains("Mosaic copies whole 128-lane tiles"),
            "{name}: {e}"
        );
        let k = def
            .instantiate(std::slice::from_ref(spec), &KernelRules::portable())
            .unwrap_or_else(|e| panic!("{e}"));
        let module = Lowering::tpu().lower_module(&k).unwrap();
        let options = CompileOptions::manual_partitions(1).unwrap();
        let r = topology.compile(&module.to_mlir(), &options);
        assert!(r.is_err(), "libtpu compiled {name}");
    }
}

/// The public call for a kernel on a device mesh: `TpuTopology::compile_kernel_on` compiles
/// the ring all-gather over the 4 chips of `v5p:2x2x1`, and refuses a mesh larger than the
/// topology with the compiler's sentence.
#[test]
fn a_mesh_kernel_compiles_through_the_public_call() {
    let topology = tessera::tpu::TpuTopology::parse("tpu:v5p:2x2x1").unwrap();
    let args = [ArgSpec::new(DType::F32, [8, 128])];
    let report = topology
        .compile_kernel_on(&ring_all_gather(), &args, &ring_mesh(4))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(report.kernels, ["ring_all_gather"]);
    let e = topology
        .compile_kernel_on(&ring_all_gather(), &args, &ring_mesh(8))
        .unwrap_err()
        .to_string();
    assert!(e.contains('8') && e.contains('4'), "{e}");
}

/// Two kernels that meet at the barrier semaphore in one SPMD program (a ring shift, then a
/// ring all-gather of its result, and the shift again): the program numbers their `collective_id`s, one
/// per distinct kernel (the repeated call keeps its kernel's), and libtpu compiles it.
#[test]
fn kernels_at_a_barrier_get_a_collective_id_each_per_program() {
    let f32s = |s: &[usize]| ArgSpec::new(DType::F32, s.to_vec());
    let shift = instantiate(&ring_shift(), &[f32s(&[8, 128])], 4);
    let gather = instantiate(&ring_all_gather(), &[f32s(&[8, 128])], 4);
    let mut module = tessera::hlo::Module::new("two_collectives");
    module.set_num_partitions(4).unwrap();
    let mut f = module.func("main");
    let x = f
        .arg_with_sharding(
            tessera::hlo::TensorType::new(vec![8, 128], DType::F32),
            tessera::hlo::Sharding::Manual,
        )
        .unwrap();
    let lowering = Lowering::tpu();
    let shifted = lowering.lower_into_spmd(&shift, &mut f, &[x]).unwrap();
    let gathered = lowering.lower_into_spmd(&gather, &mut f, &shifted).unwrap();
    let again = lowering.lower_into_spmd(&shift, &mut f, &shifted).unwrap();
    f.finish_with_shardings(&[
        (gathered[0], Some(tessera::hlo::Sharding::Manual)),
        (again[0], Some(tessera::hlo::Sharding::Manual)),
    ])
    .unwrap();
    let text = module.to_mlir();
    // Each call's backend config, escaped JSON inside the MLIR text: `collective_id\": N`.
    let ids: Vec<&str> = text
        .split("collective_id\\\": ")
        .skip(1)
        .map(|rest| rest.split(',').next().unwrap())
        .collect();
    assert_eq!(ids, ["0", "1", "0"]);
    let options = CompileOptions::manual_partitions(4).unwrap();
    libtpu()
        .topology("v5p:2x2x1")
        .unwrap()
        .compile(&text, &options)
        .unwrap_or_else(|e| panic!("{e}"));
}

/// A run-time lane offset Mosaic cannot prove aligned: the all-gather matmul with K = 500
/// over 4 devices loads each 125-row shard's columns of `x` at `j * 125`. The TPU rules refuse
/// it with the kernel line, once; libtpu refuses the same kernel instantiated without them
/// (E2003, "cannot statically prove that index in dimension 1 is a multiple of 128").
#[test]
fn an_unaligned_lane_offset_is_refused_by_the_rules_and_by_libtpu() {
    let def = all_gather_matmul::<f32, RingMesh, Context>(16, 128);
    let args = [
        ArgSpec::new(DType::F32, [32, 500]),
        ArgSpec::new(DType::F32, [125, 256]),
    ];
    let mesh = ring_mesh(4);
    let e = def
        .instantiate_on(&args, &mesh, &KernelRules::tpu())
        .expect_err("K = 500 under the TPU rules");
    let text = e.to_string();
    assert!(e.has(ProblemKind::TpuOp), "{text}");
    assert!(
        text.contains("collective.rs:")
            && text.contains(
                "`x` is loaded at a run-time offset along its last dim that Mosaic cannot \
                 prove a multiple of 128"
            ),
        "{text}"
    );
    assert_eq!(text.matches("cannot prove").count(), 1, "{text}");
    let k = def
        .instantiate_on(&args, &mesh, &KernelRules::portable())
        .unwrap_or_else(|e| panic!("{e}"));
    let err = compile(&k).expect_err("libtpu compiled K = 500");
    assert!(err.contains("E2003"), "{err}");
}

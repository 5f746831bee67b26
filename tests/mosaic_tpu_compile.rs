//! Every registered kernel, and the splash kernels over more configurations, lowered to
//! Mosaic and compiled by the real TPU compiler (libtpu, compile-only: no TPU needed),
//! embedded in a StableHLO `tpu_custom_call` as `notes/tpu-aot.md` describes.
//!
//! libtpu is provisioned on first use like the CPU plugin (`TESSERA_LIBTPU` names a library
//! to use instead); the tests fail, never skip, when it cannot be had.

use std::collections::HashMap;

mod illegal_kernels;

use tessera::backend::Backend;
use tessera::dsl::mosaic;
use tessera::dsl::{ArgSpec, DType, HostArray, Kernel, KernelDef, KernelRules, Lowering};
use tessera::runtime::{CompileOptions, Plugin, Topology};
use tessera::splash::{
    BlockSizes, Dims, Executor, Inputs, Mask, SegmentIds, SplashAttention, SplashError,
    SplashOptions,
};

/// A StableHLO module whose `main` is the kernel as one `tpu_custom_call`, built by the
/// path every TPU program takes ([`Lowering::tpu`]).
fn custom_call_module(k: &Kernel) -> Result<String, String> {
    Lowering::tpu()
        .lower_module(k)
        .map(|m| m.to_mlir())
        .map_err(|e| e.to_string())
}

fn libtpu() -> Plugin {
    Plugin::libtpu().unwrap_or_else(|e| panic!("libtpu is needed for the TPU compile tests: {e}"))
}

const TOPOLOGIES: [&str; 2] = ["v5p:2x2x1", "v5e:2x2"];

/// Compiles `k`'s Mosaic module for `topology`, or returns the compiler's message.
fn compile(topology: &Topology, def: &KernelDef, specs: &[ArgSpec]) -> Result<(), String> {
    let k = def
        .instantiate(specs, &KernelRules::tpu())
        .map_err(|e| e.to_string())?;
    compile_kernel(topology, &k)
}

/// Compiles the instantiated kernel `k` for `topology`: alone in a program, or for a kernel
/// on a device mesh in a program of one partition per device (each chip's call talking to
/// the others); on failure the compiler's message (the Mosaic text is written to
/// `$TESSERA_MOSAIC_DUMP` when set).
fn compile_kernel(topology: &Topology, k: &Kernel) -> Result<(), String> {
    let n = k.num_devices();
    let program = if n > 1 {
        Lowering::tpu()
            .lower_module_spmd(k)
            .map(|m| m.to_mlir())
            .map_err(|e| e.to_string())?
    } else {
        custom_call_module(k)?
    };
    let options = CompileOptions::manual_partitions(n).expect("partitions");
    topology
        .compile(&program, &options)
        .map(|_| ())
        .map_err(|e| {
            if let Ok(dir) = std::env::var("TESSERA_MOSAIC_DUMP") {
                if let Ok(m) = mosaic::lower(k) {
                    let _ = std::fs::write(format!("{dir}/{}.mlir", m.name), &m.text);
                }
            }
            format!("{}: {e}", k.name)
        })
}

/// Every registered kernel at each of its cases (`tessera::registry::KERNELS`): adding a
/// kernel to the registry adds it here. A kernel on a device mesh compiles for as many chips
/// of the topology (both have 4).
#[test]
fn registered_kernels_compile_for_tpu() {
    let plugin = libtpu();
    let mut failures = Vec::new();
    let mut compiled = 0;
    for name in TOPOLOGIES {
        let topology = plugin.topology(name).expect("topology");
        for info in tessera::registry::KERNELS {
            for case in info.cases {
                let instance = info
                    .instance(&case.given())
                    .unwrap_or_else(|e| panic!("{}: {e}", info.name));
                let k = instance
                    .instantiate(&KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{} {}: {e}", info.name, instance.label()));
                match compile_kernel(&topology, &k) {
                    Ok(()) => compiled += 1,
                    Err(e) => {
                        failures.push(format!("{name}: {} {}: {e}", info.name, instance.label()))
                    }
                }
            }
        }
    }
    println!("{compiled} kernels compiled");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Compiles every kernel a plan runs, running the interpreter to give later stages their
/// inputs.
struct CompileEach<'a> {
    topologies: Vec<(&'static str, Topology)>,
    failures: &'a std::cell::RefCell<Vec<String>>,
    compiled: &'a std::cell::RefCell<HashMap<String, usize>>,
}

impl Executor for CompileEach<'_> {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &KernelRules,
    ) -> Result<Vec<HostArray>, SplashError> {
        let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
        for (name, t) in &self.topologies {
            match compile(t, def, &specs) {
                Ok(()) => {
                    *self
                        .compiled
                        .borrow_mut()
                        .entry(def.name().to_string())
                        .or_default() += 1
                }
                Err(e) => self.failures.borrow_mut().push(format!("{name}: {e}")),
            }
        }
        Backend::Interpret.run(def, args, rules)
    }
}

fn splash_case(
    exec: &CompileEach<'_>,
    dtype: DType,
    (bq, bkv): (usize, usize),
    mask: Mask,
    segmented: bool,
    fused: bool,
) {
    let (b, h, s, d) = (1, 2, 1024, 128);
    let dims = Dims {
        batch: b,
        heads: h,
        kv_heads: h,
        q_len: s,
        kv_len: s,
        head_dim: d,
        head_dim_v: d,
    };
    let attn = SplashAttention::new(
        mask,
        dims,
        dtype,
        BlockSizes::uniform(bq, bkv).with_fused_bwd(fused),
        SplashOptions::default(),
        KernelRules::tpu(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let x = |seed| HostArray::random(dtype, [b, h, s, d], seed);
    let (q, k, v, dout) = (x(1), x(2), x(3), x(4));
    let seg = HostArray::i32([b, s], (0..s as i32).map(|i| i / 300).collect()).unwrap();
    let inputs = Inputs {
        segment_ids: segmented.then_some(SegmentIds { q: &seg, kv: &seg }),
        ..Inputs::new(&q, &k, &v)
    };
    let fwd = attn
        .forward(exec, &inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    attn.backward(exec, &inputs, &fwd, &dout)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn splash_kernels_compile_for_tpu() {
    let plugin = libtpu();
    let failures = Default::default();
    let compiled = Default::default();
    let exec = CompileEach {
        topologies: TOPOLOGIES
            .iter()
            .map(|n| (*n, plugin.topology(n).expect("topology")))
            .collect(),
        failures: &failures,
        compiled: &compiled,
    };
    let blocks: Vec<(usize, usize)> = std::env::var("TESSERA_SPLASH_BLOCKS")
        .map(|v| {
            v.split(',')
                .map(|b| {
                    let (q, kv) = b.split_once('/').expect("BQ/BKV");
                    (q.parse().unwrap(), kv.parse().unwrap())
                })
                .collect()
        })
        .unwrap_or_else(|_| vec![(128, 128), (512, 512), (512, 1024)]);
    for dtype in [DType::BF16, DType::F32] {
        for &bs in &blocks {
            splash_case(&exec, dtype, bs, Mask::causal(), false, false);
            splash_case(&exec, dtype, bs, Mask::local(256, 0), true, true);
        }
    }
    let failures = failures.into_inner();
    println!("compiled: {:?}", compiled.into_inner());
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Each kernel our TPU rules refuse is refused by libtpu too (instantiated without the
/// rules), except exactly those the case lists as compiled by this libtpu: the rules are what
/// Mosaic enforces in every libtpu tessera supports (0.0.42.1 refuses every case), not
/// guesses, and a newer compiler's relaxations show up here by name.
#[test]
fn kernels_breaking_a_tpu_rule_do_not_compile() {
    let plugin = libtpu();
    let wheel = tessera::runtime::libtpu_wheel().expect("the libtpu wheel");
    let version = wheel.version();
    let topology = plugin.topology("v5e:2x2").expect("topology");
    let mut accepted = Vec::new();
    let mut expected = Vec::new();
    for case in illegal_kernels::all() {
        if case.compiled_by.contains(&version) {
            expected.push(case.name);
        }
        let k = case
            .def
            .instantiate(&case.args, &KernelRules::portable())
            .unwrap_or_else(|e| panic!("{e}"));
        let program = custom_call_module(&k).unwrap_or_else(|e| panic!("{e}"));
        let options = CompileOptions::manual_partitions(1).expect("one partition");
        match topology.compile(&program, &options) {
            Ok(_) => accepted.push(case.name),
            Err(e) => println!(
                "{}: libtpu refuses it: {}",
                case.name,
                e.to_string().lines().next().unwrap_or("")
            ),
        }
    }
    assert_eq!(
        accepted, expected,
        "libtpu {version} compiled {accepted:?}; the cases say it compiles {expected:?}"
    );
}

/// The TPU rules never refuse semaphores libtpu would take: 513 semaphores (2052 bytes, the
/// fewest the rules refuse) and 600 libtpu refuses too ("sflag", 2 KiB on v5p and v5e);
/// 64 it compiles. libtpu's own use of the 2 KiB grows with the kernel (about 300 bytes
/// beside 480 semaphores and their copies), so it refuses somewhat fewer than the rules do,
/// with its own message.
#[test]
fn semaphore_memory_is_what_libtpu_has() {
    let plugin = libtpu();
    for name in TOPOLOGIES {
        let topology = plugin.topology(name).expect("topology");
        for (k, compiles) in [(600, false), (513, false), (64, true)] {
            let (def, args) = illegal_kernels::semaphores(k);
            let kernel = def.instantiate(&args, &KernelRules::portable()).unwrap();
            match compile_kernel(&topology, &kernel) {
                Ok(()) => assert!(compiles, "{name}: libtpu compiled {k} semaphores"),
                Err(e) => assert!(
                    !compiles && e.contains("sflag"),
                    "{name}, {k} semaphores: {e}"
                ),
            }
        }
    }
}

/// A [1, 1] window read as a scalar (`vector.extract`) and used as a dynamic slice start,
/// which the TPU rules allow.
#[test]
fn one_element_read_as_a_scalar_compiles() {
    use tessera::dsl::prelude::*;
    #[tpu_kernel(grid = (1,))]
    fn shifted(
        #[shape(8, 128)] x: Ref<f32>,
        #[shape(8, 128)] shift: Ref<i32>,
        #[shape(8, 128)] out: RefMut<f32>,
    ) {
        let start = shift.at(&[ds(0, 1), ds(0, 1)]).load().reshape(&[]);
        out.at(&[ds(0, 1), all()])
            .store(x.at(&[ds(start, 1), all()]).load());
        out.at(&[ds(1, 7), all()]).store(0.0);
    }
    let plugin = libtpu();
    for t in TOPOLOGIES {
        let topology = plugin.topology(t).unwrap();
        compile(
            &topology,
            &shifted(),
            &[
                ArgSpec::new(DType::F32, [8, 128]),
                ArgSpec::new(DType::I32, [8, 128]),
            ],
        )
        .unwrap();
    }
}

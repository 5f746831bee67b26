//! Every example and splash kernel lowered to Mosaic and compiled by the real TPU compiler
//! (libtpu, compile-only: no TPU needed), embedded in a StableHLO `tpu_custom_call` as
//! `notes/tpu-aot.md` describes.
//!
//! libtpu (~690 MB) is not downloaded by the test suite: these tests are ignored by default.
//! Run them with `TESSERA_LIBTPU=/path/to/libtpu.so cargo test --test mosaic_tpu_compile --
//! --ignored` (the PyPI wheel `libtpu` ships it); without the variable they fail.

use std::collections::HashMap;

mod illegal_kernels;

use base64::Engine as _;
use tessera::dsl::mosaic::{self, MosaicKernel};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelDef, TargetRules};
use tessera::kernels::{flash_attention, matmul, row_softmax};
use tessera::runtime::{CompileOptions, Plugin, Topology};
use tessera::splash::{
    BlockSizes, Dims, Executor, Inputs, Interpreter, Mask, SegmentIds, SplashAttention,
    SplashError, SplashOptions,
};

/// A StableHLO module whose `main` is the kernel as one `tpu_custom_call`.
fn custom_call_module(m: &MosaicKernel) -> String {
    let tensor = |o: &mosaic::MosaicOperand| {
        let dims: Vec<String> = o.shape.iter().map(|d| d.to_string()).collect();
        format!("tensor<{}x{}>", dims.join("x"), o.dtype.mlir_name())
    };
    let layout = |o: &mosaic::MosaicOperand| {
        let minor: Vec<String> = (0..o.shape.len()).rev().map(|d| d.to_string()).collect();
        format!(
            "dense<[{}]> : tensor<{}xindex>",
            minor.join(", "),
            o.shape.len()
        )
    };
    let body = base64::engine::general_purpose::STANDARD.encode(m.text.as_bytes());
    // The scoped VMEM limit the kernel runs under: its blocks and scratch plus room for
    // the intermediates Mosaic keeps in VMEM (at least libtpu's default).
    let vmem_limit = m.vmem_limit_bytes;
    let config = format!(
        "{{\\22custom_call_config\\22: {{\\22body\\22: \\22{body}\\22, \\22needs_layout_passes\\22: true}}, \\22scoped_memory_configs\\22: [{{\\22memory_space\\22: 1, \\22offset\\22: 0, \\22size\\22: {vmem_limit}}}]}}"
    );
    let args: Vec<String> = m
        .operands
        .iter()
        .enumerate()
        .map(|(i, o)| format!("%arg{i}: {}", tensor(o)))
        .collect();
    let names: Vec<String> = (0..m.operands.len()).map(|i| format!("%arg{i}")).collect();
    let in_types: Vec<String> = m.operands.iter().map(tensor).collect();
    let out_types: Vec<String> = m.results.iter().map(tensor).collect();
    let n = m.results.len();
    let results: Vec<String> = (0..n).map(|i| format!("%0#{i}")).collect();
    format!(
        "module @kernel attributes {{mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32}} {{\n\
         func.func public @main({}) -> ({}) {{\n\
         %0:{n} = stablehlo.custom_call @tpu_custom_call({}) {{backend_config = \"{config}\", \
         kernel_name = \"{}\", operand_layouts = [{}], result_layouts = [{}]}} : ({}) -> ({})\n\
         return {} : {}\n}}\n}}\n",
        args.join(", "),
        out_types.join(", "),
        names.join(", "),
        m.name,
        m.operands.iter().map(layout).collect::<Vec<_>>().join(", "),
        m.results.iter().map(layout).collect::<Vec<_>>().join(", "),
        in_types.join(", "),
        out_types.join(", "),
        results.join(", "),
        out_types.join(", "),
    )
}

fn libtpu() -> Plugin {
    let path = std::env::var_os("TESSERA_LIBTPU")
        .filter(|v| !v.is_empty())
        .expect("set TESSERA_LIBTPU to libtpu.so (from the PyPI wheel `libtpu`) to run this test");
    Plugin::load(path).expect("libtpu loads")
}

const TOPOLOGIES: [&str; 2] = ["v5p:2x2x1", "v5e:2x2"];

/// Compiles `k`'s Mosaic module for `topology`, or returns the compiler's message.
fn compile(topology: &Topology, def: &KernelDef, specs: &[ArgSpec]) -> Result<(), String> {
    let k = def
        .instantiate(specs, &TargetRules::tpu())
        .map_err(|e| e.to_string())?;
    let m = mosaic::lower(&k).map_err(|e| e.to_string())?;
    let program = custom_call_module(&m);
    let options = CompileOptions::manual_partitions(1).expect("one partition");
    topology
        .compile(&program, &options)
        .map(|_| ())
        .map_err(|e| {
            if let Ok(dir) = std::env::var("TESSERA_MOSAIC_DUMP") {
                let _ = std::fs::write(format!("{dir}/{}.mlir", m.name), &m.text);
            }
            format!("{}: {e}", m.name)
        })
}

#[test]
#[ignore = "needs libtpu: set TESSERA_LIBTPU and run with --ignored"]
fn example_kernels_compile_for_tpu() {
    let plugin = libtpu();
    let f32s = |shapes: &[&[usize]]| -> Vec<ArgSpec> {
        shapes
            .iter()
            .map(|s| ArgSpec::new(DType::F32, s.to_vec()))
            .collect()
    };
    let bf16s = |shapes: &[&[usize]]| -> Vec<ArgSpec> {
        shapes
            .iter()
            .map(|s| ArgSpec::new(DType::BF16, s.to_vec()))
            .collect()
    };
    let cases: Vec<(KernelDef, Vec<ArgSpec>)> = vec![
        (
            matmul::<f32, 128, 128, 128>(),
            f32s(&[&[256, 512], &[512, 256]]),
        ),
        (
            matmul::<half::bf16, 128, 128, 256>(),
            bf16s(&[&[256, 512], &[512, 256]]),
        ),
        (row_softmax::<f32, 8>(), f32s(&[&[64, 256]])),
        (row_softmax::<half::bf16, 16>(), bf16s(&[&[64, 256]])),
        (
            flash_attention::<f32, 128, 128>(false),
            f32s(&[&[512, 64], &[512, 64], &[512, 64]]),
        ),
        (
            flash_attention::<half::bf16, 128, 128>(true),
            bf16s(&[&[512, 128], &[512, 128], &[512, 128]]),
        ),
    ];
    let mut failures = Vec::new();
    for name in TOPOLOGIES {
        let topology = plugin.topology(name).expect("topology");
        for (def, specs) in &cases {
            if let Err(e) = compile(&topology, def, specs) {
                failures.push(format!("{name}: {e}"));
            }
        }
    }
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
        rules: &TargetRules,
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
        Interpreter.run(def, args, rules)
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
        TargetRules::tpu(),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let x = |seed| HostArray::random(dtype, [b, h, s, d], seed);
    let (q, k, v, dout) = (x(1), x(2), x(3), x(4));
    let seg = HostArray::i32([b, s], (0..s as i32).map(|i| i / 300).collect()).unwrap();
    let inputs = Inputs {
        q: &q,
        k: &k,
        v: &v,
        segment_ids: segmented.then_some(SegmentIds { q: &seg, kv: &seg }),
        sinks: None,
    };
    let fwd = attn
        .forward(exec, &inputs)
        .unwrap_or_else(|e| panic!("{e}"));
    attn.backward(exec, &inputs, &fwd, &dout)
        .unwrap_or_else(|e| panic!("{e}"));
}

#[test]
#[ignore = "needs libtpu: set TESSERA_LIBTPU and run with --ignored"]
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
/// rules): the rules are what Mosaic enforces, not stricter guesses.
#[test]
#[ignore = "needs libtpu: set TESSERA_LIBTPU and run with --ignored"]
fn kernels_breaking_a_tpu_rule_do_not_compile() {
    let plugin = libtpu();
    let topology = plugin.topology("v5e:2x2").expect("topology");
    let mut accepted = Vec::new();
    for case in illegal_kernels::all() {
        let k = case
            .def
            .instantiate(&case.args, &TargetRules::portable())
            .unwrap_or_else(|e| panic!("{e}"));
        let m = mosaic::lower(&k).unwrap_or_else(|e| panic!("{e}"));
        let options = CompileOptions::manual_partitions(1).expect("one partition");
        match topology.compile(&custom_call_module(&m), &options) {
            Ok(_) => accepted.push(case.name),
            Err(e) => println!(
                "{}: libtpu refuses it: {}",
                case.name,
                e.to_string().lines().next().unwrap_or("")
            ),
        }
    }
    assert!(accepted.is_empty(), "libtpu compiled {accepted:?}");
}

/// A [1, 1] window read as a scalar (`vector.extract`) and used as a dynamic slice start,
/// which the TPU rules allow.
#[test]
#[ignore = "needs libtpu: set TESSERA_LIBTPU and run with --ignored"]
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

//! A hand-written Mosaic kernel inside a `tpu_custom_call`, compiled by the TPU compiler
//! (libtpu, compile-only, provisioned like the CPU plugin): the custom-call plumbing checked
//! on its own, independent of tessera's Mosaic lowering.

use tessera::hlo::{DType, Module, Sharding, TensorType, TpuCustomCall};
use tessera::runtime::{CompileOptions, Plugin};
use tessera::tpu::{TpuCompileError, TpuTopology};

/// `out = 2 * x` over a grid of two `[8, 128]` f32 blocks of a `[16, 128]` array.
const DOUBLE: &str = r#"module attributes {stable_mosaic.version = 11 : i64} {
  func.func @double(%i: i32, %x: memref<8x128xf32, #tpu.memory_space<vmem>>, %o: memref<8x128xf32, #tpu.memory_space<vmem>>) attributes {dimension_semantics = [#tpu.dimension_semantics<parallel>], iteration_bounds = array<i64: 2>, scalar_prefetch = 0 : i64, scratch_operands = 0 : i64, tpu.core_type = #tpu.core_type<tc>, window_params = [{transform_indices = @block, window_bounds = array<i64: 8, 128>}, {transform_indices = @block, window_bounds = array<i64: 8, 128>}]} {
    %c0 = arith.constant 0 : index
    %v = vector.load %x[%c0, %c0] : memref<8x128xf32, #tpu.memory_space<vmem>>, vector<8x128xf32>
    %y = arith.addf %v, %v : vector<8x128xf32>
    vector.store %y, %o[%c0, %c0] : memref<8x128xf32, #tpu.memory_space<vmem>>, vector<8x128xf32>
    return
  }
  func.func @block(%i: i32) -> (i32, i32) {
    %c0 = arith.constant 0 : i32
    return %i, %c0 : i32, i32
  }
}
"#;

fn libtpu() -> Plugin {
    Plugin::libtpu().unwrap_or_else(|e| panic!("libtpu is needed for the TPU compile tests: {e}"))
}

/// `main(x) = kernels[n-1](..kernels[0](x))` on `devices` manual partitions, `x` a
/// `[16, 128]` f32 shard; each kernel `(name, Mosaic text)`.
fn program(kernels: &[(&str, &str)], devices: u32) -> Module {
    let mut m = Module::new("doubles");
    m.set_num_partitions(devices).unwrap();
    let mut f = m.func("main");
    let t = TensorType::new([16, 128], DType::F32);
    let mut x = f.arg_with_sharding(t.clone(), Sharding::Manual).unwrap();
    for (name, mosaic) in kernels {
        let call = TpuCustomCall::new(*name, *mosaic);
        x = f
            .tpu_custom_call(&call, &[x], std::slice::from_ref(&t))
            .unwrap()[0];
    }
    f.finish_with_shardings(&[(x, Some(Sharding::Manual))])
        .unwrap();
    m
}

#[test]
fn a_mosaic_kernel_compiles_inside_a_manual_sharded_program() {
    let topology = libtpu().topology("v5p:2x2x1").unwrap();
    let text = program(&[("double", DOUBLE)], 4).to_mlir();
    let exe = topology
        .compile(&text, &CompileOptions::manual_partitions(4).unwrap())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let stats = exe.memory_stats().unwrap().unwrap();
    assert_eq!(stats.argument_bytes, 16 * 128 * 4);
    assert_eq!(stats.output_bytes, 16 * 128 * 4);
}

#[test]
fn the_compilers_message_comes_with_the_kernels_name() {
    let broken = DOUBLE.replace("arith.addf %v, %v", "arith.addi %v, %v");
    let module = program(&[("double", DOUBLE), ("broken_double", &broken)], 4);
    let err = TpuTopology::parse("tpu:v5p:2x2x1")
        .unwrap()
        .compile(&module)
        .unwrap_err();
    let TpuCompileError::Compiler {
        culprit,
        message,
        full_message,
    } = &err
    else {
        panic!("{err}")
    };
    assert_eq!(culprit, "kernel `broken_double`");
    // The compiler's words, verbatim.
    assert!(
        message
            .contains("'arith.addi' op operand #0 must be signless-non-zero-bitwidth-integer-like"),
        "{message}"
    );
    // Shown short: the compiler's first line, and where its whole message was written.
    let shown = err.to_string();
    assert!(
        shown.starts_with("the TPU compiler rejected kernel `broken_double`"),
        "{shown}"
    );
    assert!(shown.lines().count() <= 2, "{shown}");
    if let Some(path) = full_message {
        assert!(shown.contains(&path.display().to_string()), "{shown}");
        assert_eq!(&std::fs::read_to_string(path).unwrap(), message);
        std::fs::remove_file(path).unwrap();
    }
}

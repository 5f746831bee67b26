//! A hand-written Mosaic kernel inside a `tpu_custom_call`, compiled by the TPU compiler
//! (libtpu, compile-only, provisioned like the CPU plugin): the custom-call plumbing checked
//! on its own, independent of tessera's Mosaic lowering.

use tessera::hlo::{DType, Module, Sharding, TensorType, TpuCustomCall};
use tessera::runtime::{CompileOptions, Error, Plugin};

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

/// `main(x [16*devices, 128] sharded) = double(x)` on `devices` manual partitions.
fn program(mosaic: &str, devices: u32) -> Module {
    let mut m = Module::new("double");
    m.set_num_partitions(devices).unwrap();
    let mut f = m.func("main");
    let t = TensorType::new([16, 128], DType::F32);
    let x = f.arg_with_sharding(t.clone(), Sharding::Manual).unwrap();
    let call = TpuCustomCall::new("double", mosaic);
    let y = f.tpu_custom_call(&call, &[x], &[t]).unwrap();
    f.finish_with_shardings(&[(y[0], Some(Sharding::Manual))])
        .unwrap();
    m
}

#[test]
fn a_mosaic_kernel_compiles_inside_a_manual_sharded_program() {
    let topology = libtpu().topology("v5p:2x2x1").unwrap();
    let text = program(DOUBLE, 4).to_mlir();
    let exe = topology
        .compile(&text, &CompileOptions::manual_partitions(4).unwrap())
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    let stats = exe.memory_stats().unwrap().unwrap();
    assert_eq!(stats.argument_bytes, 16 * 128 * 4);
    assert_eq!(stats.output_bytes, 16 * 128 * 4);
}

#[test]
fn the_compiler_names_a_broken_kernel() {
    let topology = libtpu().topology("v5p:2x2x1").unwrap();
    let broken = DOUBLE.replace("arith.addf %v, %v", "arith.addi %v, %v");
    let err = topology
        .compile(
            &program(&broken, 4).to_mlir(),
            &CompileOptions::manual_partitions(4).unwrap(),
        )
        .unwrap_err();
    let Error::Pjrt { message, .. } = &err else {
        panic!("{err}")
    };
    println!("{message}");
    assert!(message.contains("arith.addi"), "{message}");
}

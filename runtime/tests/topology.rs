//! Compile-only for a topology with no client (`PJRT_TopologyDescription_Create` +
//! `PJRT_Compile`), the path that compiles for TPU with libtpu (see `notes/tpu-aot.md`).
//!
//! libtpu is provisioned like the CPU plugin (the pinned wheel, or `TESSERA_LIBTPU`); the tests
//! that need it fail when it cannot be provisioned. The CPU plugin, which has no topologies,
//! is checked for a clear error on the same calls.

mod common;

use tessera_runtime::{CompileOptions, Error, NamedValue, Plugin};

const A2A: &str = r#"module @a2a attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%x: tensor<1x8x8x128xf32> {mhlo.sharding = "{manual}"}) -> (tensor<1x2x32x128xf32> {mhlo.sharding = "{manual}"}) {
    %0 = "stablehlo.all_to_all"(%x) {split_dimension = 1 : i64, concat_dimension = 2 : i64, split_count = 4 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>} : (tensor<1x8x8x128xf32>) -> tensor<1x2x32x128xf32>
    return %0 : tensor<1x2x32x128xf32>
  }
}"#;

#[test]
fn cpu_plugin_topology_compile_or_clear_error() {
    let plugin = common::client(1).plugin();
    match plugin.topology("cpu") {
        Ok(topology) => {
            let ids = topology.device_ids().unwrap();
            println!("cpu topology: {:?} {ids:?}", topology.platform_name());
            let options = CompileOptions::manual_partitions(4).unwrap();
            match topology.compile(A2A, &options) {
                Ok(exe) => {
                    assert_eq!(exe.num_outputs().unwrap(), 1);
                    let bytes = exe.serialize().unwrap();
                    assert!(!bytes.is_empty());
                }
                Err(e) => assert!(matches!(e, Error::Pjrt { .. }), "{e}"),
            }
        }
        Err(e) => {
            println!("cpu plugin topology: {e}");
            assert!(
                matches!(e, Error::Pjrt { .. } | Error::MissingFunction { .. }),
                "{e}"
            );
        }
    }
}

/// libtpu, provisioned (or `TESSERA_LIBTPU`). A machine that cannot provision it fails here:
/// compile-only for TPU is part of the suite, not an optional extra.
fn libtpu() -> Plugin {
    Plugin::libtpu().unwrap_or_else(|e| panic!("libtpu is needed for the TPU compile tests: {e}"))
}

#[test]
fn libtpu_compiles_for_a_v5p_topology_and_reports_its_costs() {
    let plugin = libtpu();
    let topology = plugin.topology("v5p:2x2x1").unwrap();
    assert_eq!(topology.platform_name().unwrap(), "tpu");
    assert_eq!(topology.device_ids().unwrap().len(), 4);
    let exe = topology
        .compile(A2A, &CompileOptions::manual_partitions(4).unwrap())
        .unwrap();
    assert_eq!(exe.num_partitions().unwrap(), 4);
    assert!(!exe.serialize().unwrap().is_empty());
    let stats = exe
        .memory_stats()
        .unwrap()
        .expect("libtpu reports memory stats");
    println!("{stats:?}");
    // One device's shard: 1x8x8x128 f32 in, 1x2x32x128 f32 out.
    assert_eq!(stats.argument_bytes, 8 * 8 * 128 * 4);
    assert_eq!(stats.output_bytes, 2 * 32 * 128 * 4);
    let costs = exe.cost_analysis().unwrap();
    let bytes = costs.iter().find(|(n, _)| n == "bytes accessed");
    assert!(
        matches!(bytes, Some((_, NamedValue::Float(b))) if *b > 0.0),
        "{costs:?}"
    );
    assert!(exe.generated_code_size().unwrap().is_some_and(|b| b > 0));
    assert!(exe.optimized_program().unwrap().is_some());
}

#[test]
fn libtpu_rejects_a_bad_program_with_the_compilers_message() {
    let plugin = libtpu();
    let topology = plugin.topology("v5p:2x2x1").unwrap();
    let err = topology.compile("func.func @main() -> () { }", &CompileOptions::default());
    let Err(Error::Pjrt { message, .. }) = err else {
        panic!("{err:?}")
    };
    assert!(
        message.contains("expected non-empty function body"),
        "{message}"
    );
}

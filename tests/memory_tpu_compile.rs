//! Kernels that move their own data, lowered to Mosaic and compiled by libtpu for v5p
//! (compile-only): one-device kernels alone in a program, collective kernels in a program of
//! one partition per chip of `v5p:2x2x1`, where each device's call talks to the others.

use tessera::dsl::{mosaic, ArgSpec, DType, Kernel, KernelDef, Target, TargetRules};
use tessera::kernels::memory::{gather_tiles, ring_all_gather, ring_mesh, ring_shift};
use tessera::kernels::paged_attention;
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
        Target::tpu().lower_module_spmd(k)
    } else {
        Target::tpu().lower_module(k)
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
    def.instantiate_on(args, &mesh, &TargetRules::tpu())
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
    let failures: Vec<String> = cases
        .iter()
        .filter_map(|k| {
            println!("compiling {}", k.name);
            compile(k).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

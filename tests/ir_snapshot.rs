//! The IR text form is stable and readable: snapshot tests of instantiated example kernels.
//! Set `TESSERA_UPDATE_SNAPSHOTS=1` to rewrite a snapshot after an intended change.

use std::path::PathBuf;

use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::kernels::{flash_attention, matmul};

fn check_snapshot(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/snapshots")
        .join(name);
    if std::env::var_os("TESSERA_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; run with TESSERA_UPDATE_SNAPSHOTS=1",
            path.display()
        )
    });
    if expected != actual {
        panic!(
            "IR text of {name} changed.\n--- expected ({})\n{expected}\n--- actual\n{actual}\n\
             If the change is intended, rerun with TESSERA_UPDATE_SNAPSHOTS=1.",
            path.display()
        );
    }
}

#[test]
fn matmul_ir_text() {
    let k = matmul::<f32, 128, 128, 128>()
        .instantiate(
            &[
                ArgSpec::new(DType::F32, [256, 512]),
                ArgSpec::new(DType::F32, [512, 384]),
            ],
            &KernelRules::tpu(),
        )
        .unwrap();
    check_snapshot("matmul_f32_128.ir", &k.to_text());
}

#[test]
fn causal_flash_attention_ir_text() {
    let k = flash_attention::<half::bf16, 128, 128>(true)
        .instantiate(
            &vec![ArgSpec::new(DType::BF16, [512, 64]); 3],
            &KernelRules::tpu(),
        )
        .unwrap();
    check_snapshot("flash_attention_causal_bf16.ir", &k.to_text());
}

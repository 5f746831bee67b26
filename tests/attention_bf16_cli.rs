//! `tessera attention --dtype bf16`: float32 inputs rounded to bf16, or uint16 files of raw
//! bf16 bits, give exactly what the library computes in bf16.

use std::process::Command;

use npyz::WriterBuilder;

use tessera::backend::Backend;
use tessera::dsl::{DType, HostArray, KernelRules};
use tessera::npy::{read_npy, write_npy};
use tessera::reference::random;
use tessera::splash::{BlockSizes, Dims, Inputs, Mask, SplashAttention};

#[test]
fn bf16_attention_from_float32_and_from_bits() {
    let dir = std::env::temp_dir().join(format!("tessera-bf16-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let shape = [1, 2, 256, 128];
    let f32s: Vec<HostArray> = (0..3).map(|i| random(DType::F32, &shape, 7 + i)).collect();
    let bf16s: Vec<HostArray> = f32s
        .iter()
        .map(|a| HostArray::from_f64(DType::BF16, shape.to_vec(), &a.to_f64_vec()).unwrap())
        .collect();
    let dims = Dims::of(&shape, &shape, &shape).unwrap();
    let attn = SplashAttention::new(
        Mask::causal(),
        dims,
        DType::BF16,
        BlockSizes::uniform(128, 128),
        Default::default(),
        KernelRules::tpu(),
    )
    .unwrap();
    let x = Inputs::new(&bf16s[0], &bf16s[1], &bf16s[2]);
    let expected = attn.forward(&Backend::Interpret, &x).unwrap();
    let expected_out: Vec<f64> = expected.out.to_f64_vec();

    for (kind, arrays) in [("f32", &f32s), ("bits", &bf16s)] {
        let mut paths = Vec::new();
        for (name, a) in ["q", "k", "v"].iter().zip(arrays.iter()) {
            let p = dir.join(format!("{kind}-{name}.npy"));
            if kind == "bits" {
                write_bits(&p, a);
            } else {
                write_npy(&p, a).unwrap();
            }
            paths.push(p);
        }
        let out = dir.join(format!("{kind}-out.npy"));
        let status = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["attention", "--dtype", "bf16", "--mask", "causal"])
            .args(["--block-q", "128", "--block-kv", "128"])
            .arg("--q")
            .arg(&paths[0])
            .arg("--k")
            .arg(&paths[1])
            .arg("--v")
            .arg(&paths[2])
            .arg("--out")
            .arg(&out)
            .output()
            .unwrap();
        assert!(status.status.success(), "{status:?}");
        let got = read_npy(&out).unwrap();
        assert_eq!(got.dtype(), DType::F32);
        assert_eq!(got.to_f64_vec(), expected_out, "{kind}");
    }
    // Bits without --dtype bf16 are refused with the fix.
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["attention", "--q"])
        .arg(dir.join("bits-q.npy"))
        .arg("--k")
        .arg(dir.join("bits-k.npy"))
        .arg("--v")
        .arg(dir.join("bits-v.npy"))
        .arg("--out")
        .arg(dir.join("x.npy"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("needs --dtype bf16"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Writes a bf16 array as a uint16 `.npy` of its bits.
fn write_bits(path: &std::path::Path, a: &HostArray) {
    let tessera::dsl::array::ArrayData::BF16(v) = a.data() else {
        panic!("bf16 expected")
    };
    let shape: Vec<u64> = a.shape().iter().map(|&d| d as u64).collect();
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut w = npyz::WriteOptions::<u16>::new()
        .default_dtype()
        .shape(&shape)
        .writer(file)
        .begin_nd()
        .unwrap();
    w.extend(v.iter().map(|x| x.to_bits())).unwrap();
    w.finish().unwrap();
}

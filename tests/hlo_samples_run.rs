//! Every StableHLO op kind tessera-hlo emits compiles on the XLA CPU plugin, and the samples
//! with host-computed expectations produce them (collectives on up to 4 devices included).

use tessera::hlo::testing::sample_modules;
use tessera::hlo::{bf16_bits_to_f32, Elements, Literal};
use tessera::runtime::{Client, CompileOptions, HostBuffer};

fn to_host(l: &Literal) -> HostBuffer {
    let dims = l.dims().to_vec();
    let b = match l.elements() {
        Elements::F32(v) => HostBuffer::from_slice(&dims, v),
        Elements::BF16(v) => {
            let v: Vec<half::bf16> = v.iter().map(|&bits| half::bf16::from_bits(bits)).collect();
            HostBuffer::from_slice(&dims, &v)
        }
        Elements::I32(v) => HostBuffer::from_slice(&dims, v),
        Elements::I8(v) => HostBuffer::from_slice(&dims, v),
        Elements::Bool(v) => HostBuffer::from_slice(&dims, v),
    };
    b.expect("literal dims match its elements")
}

fn values(b: &HostBuffer, like: &Literal) -> Vec<f64> {
    match like.elements() {
        Elements::F32(_) => b
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        Elements::BF16(_) => b
            .to_vec::<half::bf16>()
            .unwrap()
            .into_iter()
            .map(|x| f64::from(bf16_bits_to_f32(x.to_bits())))
            .collect(),
        Elements::I32(_) => b
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        Elements::I8(_) => b
            .to_vec::<i8>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        Elements::Bool(_) => b
            .to_vec::<bool>()
            .unwrap()
            .into_iter()
            .map(|x| f64::from(u8::from(x)))
            .collect(),
    }
}

#[test]
fn every_sample_compiles_and_computes_its_expected_values() {
    let samples = sample_modules().expect("samples build");
    assert!(samples.len() >= 30, "one sample per op kind");
    for s in &samples {
        let n = s.num_devices();
        let client = Client::cpu_shared(n).unwrap_or_else(|e| panic!("{}: client: {e}", s.name));
        let (replicas, partitions) = (
            s.module.num_replicas() as usize,
            s.module.num_partitions() as usize,
        );
        let options = if partitions > 1 && replicas > 1 {
            let mut o = CompileOptions::manual_partitions(partitions).unwrap();
            o.num_replicas = replicas;
            o.device_assignment =
                Some(tessera::runtime::DeviceAssignment::sequential(replicas, partitions).unwrap());
            o
        } else if partitions > 1 {
            CompileOptions::manual_partitions(partitions).unwrap()
        } else if replicas > 1 {
            CompileOptions::replicated(replicas).unwrap()
        } else {
            CompileOptions::single_device()
        };
        let text = s.module.to_mlir();
        let exe = client
            .compile(&text, &options)
            .unwrap_or_else(|e| panic!("{}: {e}\n{text}", s.name));
        let Some(check) = &s.check else { continue };
        let inputs: Vec<Vec<HostBuffer>> = check
            .inputs
            .iter()
            .map(|dev| dev.iter().map(to_host).collect())
            .collect();
        let outputs = exe
            .execute_host(&inputs)
            .unwrap_or_else(|e| panic!("{}: {e}", s.name));
        for (d, (got, want)) in outputs.iter().zip(&check.outputs).enumerate() {
            assert_eq!(got.len(), want.len(), "{}: device {d} output count", s.name);
            for (k, (g, w)) in got.iter().zip(want).enumerate() {
                assert_eq!(g.dims(), w.dims(), "{}: device {d} output {k} dims", s.name);
                let (g, w_vals) = (values(g, w), w.to_f64_vec());
                let rtol = if matches!(w.elements(), Elements::BF16(_)) {
                    1e-2
                } else {
                    2e-6
                };
                for (i, (a, b)) in g.iter().zip(&w_vals).enumerate() {
                    let ok = (a.is_nan() && b.is_nan())
                        || a == b
                        || (a - b).abs() <= 1e-6 + rtol * b.abs();
                    assert!(
                        ok,
                        "{}: device {d} output {k}[{i}]: got {a}, want {b}",
                        s.name
                    );
                }
            }
        }
    }
}

//! Every StableHLO op kind tessera-hlo emits compiles on the XLA CPU plugin, and the samples
//! with host-computed expectations produce them (collectives on up to 4 devices included).
//!
//! With `TESSERA_HLO_DUMP_DIR` set, each sample's text and numeric check are also written
//! there (`NAME.mlir`, `NAME.json`), for validating the text with an external StableHLO
//! consumer.

mod samples;

use std::fmt::Write as _;

use samples::{sample_modules, Sample};
use tessera_hlo::{DType, HostArray};
use tessera_runtime::{Client, CompileOptions, DeviceAssignment};

/// How `s` compiles; `shardy` for a module printed in Shardy's form.
fn compile_options(s: &Sample, shardy: bool) -> CompileOptions {
    let (replicas, partitions) = (
        s.module.num_replicas() as usize,
        s.module.num_partitions() as usize,
    );
    if partitions > 1 && replicas > 1 {
        let mut o = CompileOptions::manual_partitions(partitions).unwrap();
        o.num_replicas = replicas;
        o.device_assignment = Some(DeviceAssignment::sequential(replicas, partitions).unwrap());
        o
    } else if partitions > 1 {
        CompileOptions::manual_partitions(partitions)
            .unwrap()
            .with_shardy(shardy)
    } else if replicas > 1 {
        CompileOptions::replicated(replicas).unwrap()
    } else {
        CompileOptions::single_device()
    }
}

#[test]
fn every_sample_compiles_and_computes_its_expected_values() {
    let samples = sample_modules().expect("samples build");
    assert!(samples.len() >= 30, "one sample per op kind");
    let dump = std::env::var("TESSERA_HLO_DUMP_DIR").ok();
    let mut checked = 0;
    for s in &samples {
        if let Some(dir) = &dump {
            write_dump(dir, s);
        }
        let client = Client::cpu_shared(s.num_devices())
            .unwrap_or_else(|e| panic!("{}: client: {e}", s.name));
        // A module with a mesh prints Shardy's form by default; its GSPMD form must compute
        // the same.
        let mut forms = vec![(s.module.to_mlir(), !s.module.mesh().is_empty())];
        if !s.module.mesh().is_empty() {
            forms.push((s.module.to_mlir_gspmd(), false));
        }
        for (text, shardy) in forms {
            let exe = client
                .compile(&text, &compile_options(s, shardy))
                .unwrap_or_else(|e| panic!("{}: {e}\n{text}", s.name));
            if let Some(check) = &s.check {
                let outputs = exe
                    .execute_arrays(&check.inputs)
                    .unwrap_or_else(|e| panic!("{}: {e}\n{text}", s.name));
                compare(s, &outputs, &check.outputs);
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 30,
        "only {checked} samples were checked numerically"
    );
}

/// Asserts that `outputs` (per device) match `expected` within the dtype's tolerance.
fn compare(s: &Sample, outputs: &[Vec<HostArray>], expected: &[Vec<HostArray>]) {
    assert_eq!(outputs.len(), expected.len(), "{}: devices", s.name);
    for (d, (got, want)) in outputs.iter().zip(expected).enumerate() {
        assert_eq!(got.len(), want.len(), "{}: device {d} output count", s.name);
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.shape(), w.shape(), "{}: device {d} output {k}", s.name);
            assert_eq!(g.dtype(), w.dtype(), "{}: device {d} output {k}", s.name);
            let rtol = if w.dtype() == DType::BF16 { 1e-2 } else { 2e-6 };
            for (i, (a, b)) in g.to_f64_vec().iter().zip(w.to_f64_vec()).enumerate() {
                let ok =
                    (a.is_nan() && b.is_nan()) || *a == b || (a - b).abs() <= 1e-6 + rtol * b.abs();
                assert!(
                    ok,
                    "{}: device {d} output {k}[{i}]: got {a}, want {b}",
                    s.name
                );
            }
        }
    }
}

fn write_dump(dir: &str, s: &Sample) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(format!("{dir}/{}.mlir", s.name), s.module.to_mlir()).unwrap();
    let mut json = format!(
        "{{\"name\": \"{}\", \"num_partitions\": {}, \"num_replicas\": {}",
        s.name,
        s.module.num_partitions(),
        s.module.num_replicas()
    );
    if let Some(c) = &s.check {
        let _ = write!(
            json,
            ", \"inputs\": {}, \"outputs\": {}",
            per_device_json(&c.inputs),
            per_device_json(&c.outputs)
        );
    }
    json.push_str("}\n");
    std::fs::write(format!("{dir}/{}.json", s.name), json).unwrap();
}

fn per_device_json(lists: &[Vec<HostArray>]) -> String {
    let devices: Vec<String> = lists
        .iter()
        .map(|arrays| {
            let arrays: Vec<String> = arrays.iter().map(array_json).collect();
            format!("[{}]", arrays.join(", "))
        })
        .collect();
    format!("[{}]", devices.join(", "))
}

fn array_json(a: &HostArray) -> String {
    let data: Vec<String> = a
        .to_f64_vec()
        .iter()
        .map(|v| match v {
            v if v.is_nan() => "\"nan\"".to_string(),
            v if v.is_infinite() && *v > 0.0 => "\"inf\"".to_string(),
            v if v.is_infinite() => "\"-inf\"".to_string(),
            v => format!("{v:?}"),
        })
        .collect();
    format!(
        "{{\"dtype\": \"{}\", \"dims\": {:?}, \"data\": [{}]}}",
        a.dtype().name(),
        a.shape(),
        data.join(", ")
    )
}

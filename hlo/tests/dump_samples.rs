//! Writes every sample module (and its numeric check) to `$TESSERA_HLO_DUMP_DIR`, for
//! validating the text with an external StableHLO consumer. Does nothing when unset.

use std::fmt::Write as _;

use tessera_hlo::testing::sample_modules;
use tessera_hlo::Literal;

fn literal_json(l: &Literal) -> String {
    let data: Vec<String> = l
        .to_f64_vec()
        .iter()
        .map(|v| {
            if v.is_nan() {
                "\"nan\"".to_string()
            } else if v.is_infinite() {
                if *v > 0.0 { "\"inf\"" } else { "\"-inf\"" }.to_string()
            } else {
                format!("{v:?}")
            }
        })
        .collect();
    format!(
        "{{\"dtype\": \"{}\", \"dims\": {:?}, \"data\": [{}]}}",
        l.dtype().name(),
        l.dims(),
        data.join(", ")
    )
}

fn per_device(lists: &[Vec<Literal>]) -> String {
    let devs: Vec<String> = lists
        .iter()
        .map(|ls| {
            format!(
                "[{}]",
                ls.iter().map(literal_json).collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    format!("[{}]", devs.join(", "))
}

#[test]
fn dump_samples() {
    let Ok(dir) = std::env::var("TESSERA_HLO_DUMP_DIR") else {
        return;
    };
    std::fs::create_dir_all(&dir).unwrap();
    for s in sample_modules().unwrap() {
        std::fs::write(format!("{dir}/{}.mlir", s.name), s.module.to_mlir()).unwrap();
        let mut json = String::new();
        write!(
            json,
            "{{\"name\": \"{}\", \"num_partitions\": {}, \"num_replicas\": {}",
            s.name,
            s.module.num_partitions(),
            s.module.num_replicas()
        )
        .unwrap();
        if let Some(c) = &s.check {
            write!(
                json,
                ", \"inputs\": {}, \"outputs\": {}",
                per_device(&c.inputs),
                per_device(&c.outputs)
            )
            .unwrap();
        }
        json.push_str("}\n");
        std::fs::write(format!("{dir}/{}.json", s.name), json).unwrap();
    }
}

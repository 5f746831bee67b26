//! mosaic-eval against someone else's Mosaic: JAX Pallas kernels (small ones of ours and JAX's
//! own splash attention forward, dkv and dq), lowered by JAX 0.10.2 for a TPU, run through the
//! evaluator and compared with what Pallas' interpret mode computed for the same inputs. The
//! corpus (tests/pallas_corpus/) is generated once by scripts/gen_pallas_corpus.py and checked
//! in; this test needs neither Python nor JAX.
//!
//! Tolerance, per element, with `max` the largest |want| of the output:
//! - bf16 outputs: one bf16 ulp of the wanted value, or 2^-16 max where that is larger. The
//!   second term is for sums whose terms cancel (splash's dq and dk): the evaluator sums a
//!   matmul in index order, XLA's CPU dot in its own, and the f32 rounding of the two orders
//!   differs by far less than the terms but more than the tiny result (measured: 2^-18.4 max).
//! - f32 outputs: 2^-19 max (16 f32 ulps of the largest element); measured 2^-20.5 (softmax:
//!   the host's `exp` against XLA's, and the order of the row sum).

use std::path::{Path, PathBuf};

use tessera::dsl::{DType, HostArray};
use tessera::npy::read_npy;
use tessera_mosaic_eval::{EvalError, Module, OutputSpec};

fn corpus() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/pallas_corpus")
}

/// One unit in the last place of a bf16 near `x` (8 significant bits), normal range.
fn bf16_ulp(x: f64) -> f64 {
    let e = if x == 0.0 {
        -126
    } else {
        (x.abs().log2().floor() as i32).max(-126)
    };
    2f64.powi(e - 7)
}

/// Checks `got` against `want` at the tolerance above; returns the number of elements and the
/// largest error relative to the largest |want|.
fn agree(what: &str, got: &HostArray, want: &HostArray) -> (usize, f64) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes differ");
    assert_eq!(got.dtype(), want.dtype(), "{what}: dtypes differ");
    let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
    let max = w.iter().fold(0f64, |m, x| m.max(x.abs()));
    let mut worst = 0f64;
    let mut bad = Vec::new();
    for i in 0..g.len() {
        if g[i].is_nan() && w[i].is_nan() {
            continue;
        }
        let err = (g[i] - w[i]).abs();
        let tol = match want.dtype() {
            DType::BF16 => bf16_ulp(w[i]).max(max * 2f64.powi(-16)),
            _ => max * 2f64.powi(-19),
        };
        // One side NaN fails.
        if err.is_nan() || err > tol {
            bad.push(i);
        }
        if max > 0.0 {
            worst = worst.max(err / max);
        }
    }
    if let Some(&i) = bad.first() {
        panic!(
            "{what}: {} of {} elements differ from Pallas' interpret mode beyond the tolerance; \
             first at flat index {i}: mosaic-eval {} vs interpret {} (largest |want| {max})",
            bad.len(),
            g.len(),
            g[i],
            w[i]
        );
    }
    (g.len(), worst)
}

#[test]
fn jax_pallas_kernels_agree_with_pallas_interpret_mode() {
    let dir = corpus();
    let manifest: toml::Table = std::fs::read_to_string(dir.join("corpus.toml"))
        .expect("tests/pallas_corpus/corpus.toml")
        .parse()
        .expect("corpus.toml parses");
    let kernels = manifest["kernel"].as_array().expect("[[kernel]] entries");
    let mut texts = String::new();
    let mut compared = 0;
    for k in kernels {
        let field = |f: &str| {
            k.get(f)
                .unwrap_or_else(|| panic!("corpus.toml: a kernel has no `{f}`"))
        };
        let name = field("name").as_str().expect("name is a string");
        let count = |f: &str| field(f).as_integer().expect("a count") as usize;
        let dead: Vec<usize> = field("dead_outputs")
            .as_array()
            .expect("dead_outputs is a list")
            .iter()
            .map(|i| i.as_integer().expect("an output index") as usize)
            .collect();
        let d = dir.join(name);
        let read = |f: String| read_npy(&d.join(f)).unwrap_or_else(|e| panic!("{e}"));
        let args: Vec<HostArray> = (0..count("args"))
            .map(|i| read(format!("arg{i}.npy")))
            .collect();
        let want: Vec<HostArray> = (0..count("outputs"))
            .map(|i| read(format!("out{i}.npy")))
            .collect();
        let text = std::fs::read_to_string(d.join("kernel.mlir")).expect("kernel.mlir");
        let module = Module::parse(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let specs: Vec<OutputSpec> = want
            .iter()
            .map(|w| OutputSpec {
                dtype: w.dtype(),
                shape: w.shape().to_vec(),
                aliases: None,
            })
            .collect();
        let got = module
            .run(&args, &specs)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(got.len(), want.len(), "{name}: number of outputs");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            if dead.contains(&i) {
                continue;
            }
            let (n, worst) = agree(&format!("{name} output {i}"), g, w);
            compared += n;
            println!(
                "{name} output {i} ({} {:?}): largest error 2^{:.1} of the largest element",
                w.dtype(),
                w.shape(),
                worst.log2()
            );
        }
        texts.push_str(&text);
    }
    assert!(
        kernels.len() >= 7,
        "the corpus holds {} kernels",
        kernels.len()
    );
    // The forms tessera's own lowering does not print, which the corpus is here to cover.
    for form in [
        "} else {",
        "pipeline_mode",
        "tpu.concatenate",
        "memref.load",
    ] {
        assert!(texts.contains(form), "no corpus kernel uses `{form}`");
    }
    println!(
        "{} kernels, {compared} output elements agree",
        kernels.len()
    );
}

/// JAX's matmul with its accumulation dim marked `parallel` instead of `arbitrary`: mosaic-eval
/// refuses the load of the accumulator (the scratch a step of another `kk` stored) at its line
/// of the Mosaic text.
#[test]
fn jax_matmul_with_a_wrongly_parallel_dim_is_refused() {
    let d = corpus().join("matmul");
    let text = std::fs::read_to_string(d.join("kernel.mlir")).expect("matmul/kernel.mlir");
    let right = "#tpu.dimension_semantics<parallel>, #tpu.dimension_semantics<parallel>, \
                 #tpu.dimension_semantics<arbitrary>";
    assert!(
        text.contains(right),
        "the corpus matmul is (parallel, parallel, arbitrary)"
    );
    let wrong = text.replace(right, &right.replace("arbitrary", "parallel"));
    let args: Vec<HostArray> = (0..2)
        .map(|i| read_npy(&d.join(format!("arg{i}.npy"))).unwrap())
        .collect();
    let out = read_npy(&d.join("out0.npy")).unwrap();
    let spec = OutputSpec {
        dtype: out.dtype(),
        shape: out.shape().to_vec(),
        aliases: None,
    };
    let e = Module::parse(&wrong)
        .unwrap()
        .run(&args, &[spec])
        .unwrap_err();
    // The accumulator's load outside the `pl.when`s (the one inside the first is dead).
    let line = wrong
        .lines()
        .position(|l| l.contains("= vector.load %arg6") && !l.starts_with("      "))
        .expect("the accumulator load")
        + 1;
    match &e {
        EvalError::Run { loc, message } => {
            assert_eq!(loc, &format!("line {line} of the module"), "{e}");
            assert!(
                message.contains("scratch operand %arg6")
                    && message.contains("parallel dim 2 is 0 there, 1 here"),
                "{e}"
            );
        }
        other => panic!("expected a run error at the accumulator's load, got {other}"),
    }
}

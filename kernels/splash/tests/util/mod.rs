//! Shared helpers of the splash attention tests: random problems, the f64 reference, and
//! checks with the tolerances (outputs and lse within 2e-4 absolute, gradients
//! within 1e-3 of the largest reference gradient).
#![allow(dead_code)]

use tessera_backend::Backend;
use tessera_dsl::interpret::{self, InterpretOptions};
use tessera_dsl::{DType, HostArray, KernelDef, KernelRules};
use tessera_splash::reference::{self, RefInputs};
use tessera_splash::{
    BlockSizes, Dims, Executor, Inputs, MultiHeadMask, SegmentIds, SplashAttention, SplashError,
    SplashOptions,
};

fn random(dtype: DType, shape: &[usize], seed: u64) -> HostArray {
    HostArray::random(dtype, shape, seed)
}

/// Absolute tolerance of outputs and lse.
pub const OUT_TOL: f64 = 2e-4;
/// Gradient tolerance, relative to the largest reference gradient.
pub const GRAD_TOL: f64 = 1e-3;

/// One test problem.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: &'static str,
    pub dims: Dims,
    pub mask: MultiHeadMask,
    pub blocks: BlockSizes,
    pub options: SplashOptions,
    /// Segment ids of every position (shared by queries and keys).
    pub segments: Option<Vec<i32>>,
    pub sinks: Option<Vec<f32>>,
    pub backward: bool,
}

impl Case {
    pub fn new(name: &'static str, dims: Dims, mask: impl Into<MultiHeadMask>) -> Self {
        Case {
            name,
            dims,
            mask: mask.into(),
            blocks: BlockSizes::uniform(128, 128),
            options: SplashOptions::default(),
            segments: None,
            sinks: None,
            backward: true,
        }
    }
}

/// `[B, H, S, D]` dims with equal q/kv lengths and head dims.
pub fn dims(batch: usize, heads: usize, kv_heads: usize, seq: usize, d: usize) -> Dims {
    Dims {
        batch,
        heads,
        kv_heads,
        q_len: seq,
        kv_len: seq,
        head_dim: d,
        head_dim_v: d,
    }
}

/// Segments of the given lengths, repeated over the batch (ids 0, 1, 2, ...).
pub fn segments(batch: usize, lengths: &[usize]) -> Vec<i32> {
    let one: Vec<i32> = lengths
        .iter()
        .enumerate()
        .flat_map(|(i, &n)| std::iter::repeat_n(i as i32, n))
        .collect();
    one.repeat(batch)
}

/// The interpreter with `parallel` grid dims shuffled: a kernel that carries state across
/// parallel steps gives different results.
#[derive(Debug, Clone, Copy)]
pub struct ShuffledInterpreter(pub u64);

impl Executor for ShuffledInterpreter {
    fn run(
        &self,
        def: &KernelDef,
        args: &[HostArray],
        rules: &KernelRules,
    ) -> Result<Vec<HostArray>, SplashError> {
        let options = InterpretOptions {
            rules: rules.clone(),
            ..InterpretOptions::shuffled(self.0)
        };
        Ok(interpret::run(def, args, &options)?)
    }
}

/// Largest |got - want|, with equal infinities counting as equal and NaN as infinitely far.
pub fn max_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(g, w)| {
            if g == w {
                0.0
            } else if g.is_nan() || w.is_nan() {
                f64::INFINITY
            } else {
                (g - w).abs()
            }
        })
        .fold(0.0, f64::max)
}

/// The largest absolute value.
pub fn max_abs(x: &[f64]) -> f64 {
    x.iter().map(|v| v.abs()).fold(0.0, f64::max)
}

/// Measured errors of one run.
#[derive(Debug, Clone, Copy, Default)]
pub struct Errors {
    pub out: f64,
    pub lse: f64,
    /// Max over dq, dk, dv (and dsinks) of the error relative to the largest reference
    /// gradient of that array.
    pub grad_rel: f64,
}

/// The (f32, TPU-rules) attention of `case`.
pub fn attention(case: &Case) -> SplashAttention {
    SplashAttention::new(
        case.mask.clone(),
        case.dims,
        DType::F32,
        case.blocks,
        case.options,
        KernelRules::tpu(),
    )
    .unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

/// Runs `case` on `exec` and checks it against the reference; returns the errors.
pub fn check(case: &Case, exec: &dyn Executor, what: &str) -> Errors {
    let d = case.dims;
    let attn = attention(case);
    let q = random(DType::F32, &[d.batch, d.heads, d.q_len, d.head_dim], 11);
    let k = random(DType::F32, &[d.batch, d.kv_heads, d.kv_len, d.head_dim], 12);
    let v = random(
        DType::F32,
        &[d.batch, d.kv_heads, d.kv_len, d.head_dim_v],
        13,
    );
    // Larger logits than uniform [-1, 1) inputs give, so the softmax is not nearly flat.
    let q = scale(&q, 3.0);
    let dout = random(DType::F32, &[d.batch, d.heads, d.q_len, d.head_dim_v], 14);
    let seg = case
        .segments
        .as_ref()
        .map(|s| HostArray::i32([d.batch, d.q_len], s.clone()).unwrap());
    let sinks = case
        .sinks
        .as_ref()
        .map(|s| HostArray::f32([d.heads], s.clone()).unwrap());
    let x = Inputs {
        segment_ids: seg.as_ref().map(|s| SegmentIds { q: s, kv: s }),
        sinks: sinks.as_ref(),
        ..Inputs::new(&q, &k, &v)
    };
    let ctx = format!("{} on {what}", case.name);
    let fwd = attn
        .forward(exec, &x)
        .unwrap_or_else(|e| panic!("{ctx}: forward: {e}"));
    let (qf, kf, vf) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
    let sinks64: Option<Vec<f64>> = case
        .sinks
        .as_ref()
        .map(|s| s.iter().map(|&x| x as f64).collect());
    let r = RefInputs {
        q_segment_ids: case.segments.as_deref(),
        kv_segment_ids: case.segments.as_deref(),
        sinks: sinks64.as_deref(),
        offsets: case.options.offsets,
        soft_cap: case.options.soft_cap.map(|c| c as f64),
        ..RefInputs::new(d, (&qf, &kf, &vf), &case.mask, attn.scale() as f64)
    };
    let want = reference::forward(&r);
    let mut errors = Errors {
        out: max_err(&fwd.out.to_f64_vec(), &want.out),
        lse: max_err(&fwd.lse.to_f64_vec(), &want.lse),
        grad_rel: 0.0,
    };
    assert!(
        errors.out <= OUT_TOL && errors.lse <= OUT_TOL,
        "{ctx}: forward errors out {:e}, lse {:e} exceed {OUT_TOL:e}",
        errors.out,
        errors.lse
    );
    // The forward without its residual (queries scaled once per row below blocks of 2048).
    let out = attn
        .inference(exec, &x)
        .unwrap_or_else(|e| panic!("{ctx}: inference: {e}"));
    let inference_err = max_err(&out.to_f64_vec(), &want.out);
    assert!(
        inference_err <= OUT_TOL,
        "{ctx}: inference error {inference_err:e} exceeds {OUT_TOL:e}"
    );
    errors.out = errors.out.max(inference_err);
    if case.backward {
        let g = attn
            .backward(exec, &x, &fwd, &dout)
            .unwrap_or_else(|e| panic!("{ctx}: backward: {e}"));
        let rg = reference::backward(&r, &dout.to_f64_vec());
        let mut pairs = vec![
            ("dq", g.dq.to_f64_vec(), rg.dq),
            ("dk", g.dk.to_f64_vec(), rg.dk),
            ("dv", g.dv.to_f64_vec(), rg.dv),
        ];
        if let (Some(got), Some(want)) = (&g.dsinks, rg.dsinks) {
            pairs.push(("dsinks", got.to_f64_vec(), want));
        }
        for (name, got, want) in pairs {
            let rel = max_err(&got, &want) / max_abs(&want).max(1e-30);
            assert!(
                rel <= GRAD_TOL,
                "{ctx}: {name} error {rel:e} (relative to max |{name}| {:e}) exceeds {GRAD_TOL:e}",
                max_abs(&want)
            );
            errors.grad_rel = errors.grad_rel.max(rel);
        }
    }
    errors
}

fn scale(a: &HostArray, s: f64) -> HostArray {
    let v: Vec<f64> = a.to_f64_vec().iter().map(|x| x * s).collect();
    HostArray::from_f64(a.dtype(), a.shape().to_vec(), &v).unwrap()
}

/// Runs `case` on every backend (interpreter and PJRT CPU) and prints the errors.
pub fn check_all(case: &Case) {
    let backends: [(&dyn Executor, &str); 2] =
        [(&Backend::Interpret, "interpret"), (&Backend::CPU, "cpu")];
    for (exec, name) in backends {
        let e = check(case, exec, name);
        eprintln!(
            "{:<28} {:<9} out {:.1e} lse {:.1e} grads(rel) {:.1e}",
            case.name, name, e.out, e.lse, e.grad_rel
        );
    }
}

//! Splash attention's kernels, built as the splash plans build them: a [`SplashAttention`]
//! configured from the parameters and the stage of its forward or backward plan that runs
//! the kernel (so the block-sparsity tables are the real ones); the residuals its backward
//! kernels take, its f64 reference, flop counts, cases, bench sets and entries.

use std::collections::HashMap;

use tessera_dsl::{DType, HostArray, KernelRules};
use tessera_registry::{
    expect_inputs, Built, Case, KernelInfo, ParamInfo, Params, Reference, RegistryError, BKV, BQ,
    DTYPE,
};

use crate::reference::{self as splash_reference, RefInputs};
use crate::{
    stage_specs, BlockSizes, Dims, Features, Mask, SplashAttention, SplashError, SplashOptions,
    Stage, StageArg, Tensor,
};

/// A splash kernel as its plan runs it: the attention configured from the parameters, the
/// features it uses and the stage that runs `kernel`.
struct SplashSetup {
    attn: SplashAttention,
    features: Features,
    stage: Stage,
}

/// The stage named `kernel` of the plans of a [`SplashAttention`] configured from the
/// parameters (portable rules: `tessera ir --rules` checks the target's).
fn splash_setup(p: &Params, kernel: &str) -> Result<SplashSetup, RegistryError> {
    let dtype = p.dtype()?;
    let (bq, bkv) = (p.usize("BQ")?, p.usize("BKV")?);
    let bkv_compute = p.usize_or_same_as("BKVC", "BKV")?;
    // The mask's own message names the mask and the forms it takes.
    let mask = Mask::parse(p.get("mask"))?;
    let soft_cap = match p.get("soft_cap") {
        "none" => None,
        v => match v.parse::<f32>() {
            Ok(c) if c.is_finite() && c > 0.0 => Some(c),
            _ => return Err(p.bad("soft_cap", "none or a positive number")),
        },
    };
    let dims = Dims {
        batch: p.usize("B")?,
        heads: p.usize("H")?,
        kv_heads: p.usize("KVH")?,
        q_len: p.usize("SQ")?,
        kv_len: p.usize("SKV")?,
        head_dim: p.usize("D")?,
        head_dim_v: p.usize("D")?,
    };
    let fused = matches!(kernel, "splash_bwd_fused" | "splash_dq_reduce");
    let mut blocks = BlockSizes::uniform(bq, bkv).with_fused_bwd(fused);
    blocks.block_kv_compute = bkv_compute;
    blocks.block_kv_dkv_compute = bkv_compute;
    // dQ's own default split stands unless BKVC is given.
    if p.get("BKVC") != "BKV" {
        blocks.block_kv_dq_compute = Some(bkv_compute);
    }
    let options = SplashOptions {
        soft_cap,
        ..SplashOptions::default()
    };
    let attn = SplashAttention::new(mask, dims, dtype, blocks, options, KernelRules::portable())?;
    let features = Features {
        segmented: p.bool("segmented")?,
        sinks: p.bool("sinks")?,
    };
    let stage = attn
        .forward_plan(features)
        .into_iter()
        .chain(attn.backward_plan(features))
        .find(|s| s.def.name() == kernel)
        .ok_or_else(|| RegistryError::NoSplashStage {
            kernel: kernel.to_string(),
        })?;
    Ok(SplashSetup {
        attn,
        features,
        stage,
    })
}

fn build_splash(p: &Params, kernel: &str) -> Result<Built, RegistryError> {
    let SplashSetup { attn, stage, .. } = splash_setup(p, kernel)?;
    let args = stage_specs(&stage, |t| attn.tensor_spec(t));
    let fixed = stage
        .args
        .iter()
        .map(|a| match a {
            StageArg::Const(c) => Some(c.clone()),
            StageArg::Zeros(spec) => Some(HostArray::zeros(spec.dtype, spec.shape.clone())),
            _ => None,
        })
        .collect();
    Ok(Built {
        def: stage.def,
        args,
        fixed,
        mesh: Vec::new(),
    })
}

/// The f64 form of splash's inputs that the reference reads: q, k, v and, where the call
/// uses them, segment ids and sinks.
struct SplashRefData {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    q_segments: Option<Vec<i32>>,
    kv_segments: Option<Vec<i32>>,
    sinks: Option<Vec<f64>>,
}

impl SplashRefData {
    /// From the tensors of a call, when it has q, k and v.
    fn of(env: &HashMap<Tensor, HostArray>) -> Option<Self> {
        let f = |t: Tensor| env.get(&t).map(HostArray::to_f64_vec);
        let ids = |t: Tensor| {
            env.get(&t)
                .map(|a| a.to_f64_vec().iter().map(|&x| x as i32).collect())
        };
        Some(SplashRefData {
            q: f(Tensor::Q)?,
            k: f(Tensor::K)?,
            v: f(Tensor::V)?,
            q_segments: ids(Tensor::QSegments),
            kv_segments: ids(Tensor::KvSegments),
            sinks: f(Tensor::Sinks),
        })
    }

    fn inputs<'a>(&'a self, attn: &'a SplashAttention) -> RefInputs<'a> {
        let options = attn.options();
        RefInputs {
            q_segment_ids: self.q_segments.as_deref(),
            kv_segment_ids: self.kv_segments.as_deref(),
            sinks: self.sinks.as_deref(),
            offsets: options.offsets,
            soft_cap: options.soft_cap.map(f64::from),
            ..RefInputs::new(
                attn.dims(),
                (&self.q, &self.k, &self.v),
                attn.mask(),
                f64::from(attn.scale()),
            )
        }
    }
}

/// `rowsum(out * dout)` per query row, `[B, H, Sq]` flattened.
fn rowsum_product(out: &HostArray, dout: &HostArray) -> Vec<f64> {
    let dv = *out.shape().last().expect("rank 4");
    let (o, g) = (out.to_f64_vec(), dout.to_f64_vec());
    o.chunks(dv)
        .zip(g.chunks(dv))
        .map(|(o, g)| o.iter().zip(g).map(|(a, b)| a * b).sum())
        .collect()
}

/// Values for every tensor a splash kernel may read, consistent as a forward and backward
/// would leave them: random q, k, v, dout, sinks (and the fused backward's dQ partials),
/// three segments, and `out`, `lse`, `di` from the f64 reference (rounded as the kernels
/// store them).
fn splash_inputs(p: &Params, kernel: &str, seed: u64) -> Result<Vec<HostArray>, RegistryError> {
    let SplashSetup {
        attn,
        features,
        stage,
    } = splash_setup(p, kernel)?;
    let (d, dtype) = (attn.dims(), attn.dtype());
    let shape = |t: Tensor| attn.tensor_spec(t).shape;
    let mut env = HashMap::new();
    for (i, t) in [Tensor::Q, Tensor::K, Tensor::V, Tensor::DOut]
        .into_iter()
        .enumerate()
    {
        env.insert(t, HostArray::random(dtype, shape(t), seed + i as u64));
    }
    let thirds = |len: usize| (0..len).map(move |i| (3 * i / len) as i32);
    let q_ids: Vec<i32> = (0..d.batch).flat_map(|_| thirds(d.q_len)).collect();
    let kv_ids: Vec<i32> = (0..d.batch).flat_map(|_| thirds(d.kv_len)).collect();
    let ids = |t: Tensor, v: Vec<i32>| HostArray::i32(shape(t), v).expect("one id per position");
    env.insert(Tensor::QSegments, ids(Tensor::QSegments, q_ids));
    env.insert(Tensor::KvSegments, ids(Tensor::KvSegments, kv_ids));
    env.insert(
        Tensor::Sinks,
        HostArray::random(DType::F32, shape(Tensor::Sinks), seed + 4),
    );
    env.insert(
        Tensor::DqPartial,
        HostArray::random(
            attn.tensor_spec(Tensor::DqPartial).dtype,
            shape(Tensor::DqPartial),
            seed + 5,
        ),
    );
    // What the forward leaves for the backward: segments and sinks count where the call uses
    // them (its stages read placeholders otherwise).
    let used: HashMap<Tensor, HostArray> = env
        .iter()
        .filter(|(t, _)| match t {
            Tensor::QSegments | Tensor::KvSegments => features.segmented,
            Tensor::Sinks => features.sinks,
            _ => true,
        })
        .map(|(t, a)| (*t, a.clone()))
        .collect();
    let data = SplashRefData::of(&used).expect("q, k and v are random");
    let fwd = splash_reference::forward(&data.inputs(&attn));
    let out = HostArray::from_f64(dtype, shape(Tensor::Out), &fwd.out).expect("out's shape");
    let lse = HostArray::from_f64(DType::F32, shape(Tensor::Lse), &fwd.lse).expect("lse's shape");
    let di = rowsum_product(&out, &env[&Tensor::DOut]);
    env.insert(
        Tensor::Di,
        HostArray::from_f64(DType::F32, shape(Tensor::Di), &di).expect("di's shape"),
    );
    env.insert(Tensor::Out, out);
    env.insert(Tensor::Lse, lse);
    stage
        .args
        .iter()
        .map(|a| match a {
            StageArg::Const(c) => Ok(c.clone()),
            StageArg::Zeros(spec) => Ok(HostArray::zeros(spec.dtype, spec.shape.clone())),
            StageArg::Tensor(t) => Ok(env[t].clone()),
            StageArg::PerShard(_) => Err(RegistryError::NoReference {
                kernel: kernel.to_string(),
                reason: "per-shard tables",
            }),
        })
        .collect()
}

/// Each output of the splash stage, from its inputs: the forward's `out` and `lse`, the
/// gradients `dq`, `dk`, `dv` (the fused kernel's dQ per key block) from the f64 reference;
/// `di = rowsum(out * dout)`, the sinks' gradient and dQ's reduction from their definitions.
fn splash_reference_of(
    p: &Params,
    kernel: &str,
    x: &[HostArray],
) -> Result<Vec<Vec<f64>>, RegistryError> {
    let SplashSetup {
        attn,
        features,
        stage,
    } = splash_setup(p, kernel)?;
    expect_inputs(kernel, x, stage.args.len())?;
    let env: HashMap<Tensor, HostArray> = stage
        .args
        .iter()
        .zip(x)
        .filter_map(|(a, x)| match a {
            StageArg::Tensor(t) => Some((*t, x.clone())),
            _ => None,
        })
        .collect();
    // The backward kernels take the sinks only through `lse`: their f64 reference cannot
    // be had from their inputs.
    let reads_sinks = stage
        .args
        .iter()
        .any(|a| matches!(a, StageArg::Tensor(Tensor::Sinks)));
    let data = SplashRefData::of(&env).filter(|_| reads_sinks || !features.sinks);
    let reference = data.as_ref().map(|data| data.inputs(&attn));
    let dout = env.get(&Tensor::DOut).map(HostArray::to_f64_vec);
    let grads = match (&reference, &dout) {
        (Some(r), Some(g)) => Some(splash_reference::backward(r, g)),
        _ => None,
    };
    let missing = || RegistryError::NoReference {
        kernel: kernel.to_string(),
        reason: if features.sinks {
            "its inputs (with sinks, the backward kernels see them only through lse)"
        } else {
            "its inputs"
        },
    };
    let d = attn.dims();
    let mut outputs = Vec::new();
    for t in &stage.outputs {
        outputs.push(match t {
            Tensor::Out => splash_reference::forward(reference.as_ref().ok_or_else(missing)?).out,
            Tensor::Lse => splash_reference::forward(reference.as_ref().ok_or_else(missing)?).lse,
            Tensor::Di => rowsum_product(&env[&Tensor::Out], &env[&Tensor::DOut]),
            Tensor::DSinks => {
                let di = rowsum_product(&env[&Tensor::Out], &env[&Tensor::DOut]);
                let lse = env[&Tensor::Lse].to_f64_vec();
                let mut dsinks = vec![0.0; d.heads];
                if features.sinks {
                    let sinks = env[&Tensor::Sinks].to_f64_vec();
                    for (r, (di, lse)) in di.iter().zip(&lse).enumerate() {
                        let h = (r / d.q_len) % d.heads;
                        dsinks[h] -= (sinks[h] - lse).exp() * di;
                    }
                }
                dsinks
            }
            Tensor::Dq => match env.get(&Tensor::DqPartial) {
                Some(parts) => {
                    let n = parts.shape()[0];
                    let parts = parts.to_f64_vec();
                    let len = parts.len() / n;
                    (0..len)
                        .map(|i| (0..n).map(|b| parts[b * len + i]).sum())
                        .collect()
                }
                None => grads.as_ref().ok_or_else(missing)?.dq.clone(),
            },
            Tensor::Dk => grads.as_ref().ok_or_else(missing)?.dk.clone(),
            Tensor::Dv => grads.as_ref().ok_or_else(missing)?.dv.clone(),
            Tensor::DqPartial => {
                // Key block `j`'s contribution is in partial `j % slots`.
                let per_block = splash_reference::dq_per_key_block(
                    reference.as_ref().ok_or_else(missing)?,
                    dout.as_deref().ok_or_else(missing)?,
                    attn.block_sizes().block_kv_dkv,
                );
                let slots = attn.dq_slots();
                let len = d.batch * d.heads * d.q_len * d.head_dim;
                let mut partials = vec![0.0; slots * len];
                for (j, block) in per_block.chunks(len).enumerate() {
                    let slot = &mut partials[(j % slots) * len..][..len];
                    slot.iter_mut().zip(block).for_each(|(p, x)| *p += x);
                }
                partials
            }
            _ => return Err(missing()),
        });
    }
    Ok(outputs)
}

fn splash_flops(p: &Params, kernel: &str) -> Result<f64, RegistryError> {
    let s = splash_setup(p, kernel)?;
    Ok(s.attn.kernel_flops(kernel, s.attn.visible_pairs()))
}

/// Where every splash kernel is checked: f32 with a local window, segment ids and a soft cap
/// (GQA); bf16 causal (MQA). (Sinks reach the backward kernels only through `lse`, so their
/// references cannot be had from the kernels' inputs: splash's own tests cover them.)
const SPLASH_CASES: &[Case] = &[
    Case {
        params: &[
            ("dtype", "f32"),
            ("mask", "local:60:10"),
            ("segmented", "true"),
            ("soft_cap", "5.0"),
            ("H", "4"),
            ("KVH", "2"),
            ("SQ", "256"),
            ("SKV", "256"),
            ("D", "128"),
        ],
        tol: 1e-4,
    },
    Case {
        params: &[
            ("dtype", "bf16"),
            ("H", "2"),
            ("KVH", "1"),
            ("SQ", "256"),
            ("SKV", "256"),
            ("D", "128"),
        ],
        tol: 3e-2,
    },
];

/// Where every splash kernel is timed.
const SPLASH_BENCH: &[&[(&str, &str)]] = &[&[
    ("BQ", "{block}"),
    ("BKV", "{block}"),
    ("H", "{heads}"),
    ("KVH", "{heads}"),
    ("SQ", "{seq}"),
    ("SKV", "{seq}"),
    ("D", "{head_dim}"),
]];

/// A splash kernel: every one takes [`SPLASH_PARAMS`] and is built, checked and counted by
/// the splash functions.
const fn splash_kernel(name: &'static str, summary: &'static str) -> KernelInfo {
    KernelInfo {
        name,
        summary,
        params: SPLASH_PARAMS,
        build: build_splash,
        reference: Reference::Local(splash_reference_of),
        flops: splash_flops,
        inputs: Some(splash_inputs),
        xla: None,
        check_inputs: None,
        cases: SPLASH_CASES,
        bench: SPLASH_BENCH,
    }
}

/// The parameters every splash kernel takes (each kernel uses the sizes of its arguments).
const SPLASH_PARAMS: &[ParamInfo] = &[
    BQ,
    BKV,
    ParamInfo::compile_time("BKVC", "BKV", "keys per inner compute step (divides BKV)"),
    DTYPE,
    ParamInfo::compile_time(
        "mask",
        "causal",
        "full, causal, causal:OFFSET, local:LEFT:RIGHT or chunked:SIZE",
    ),
    ParamInfo::compile_time(
        "soft_cap",
        "none",
        "logit soft cap c (c * tanh(x / c)), or none",
    ),
    ParamInfo::compile_time("segmented", "false", "segment ids (packed sequences)"),
    ParamInfo::compile_time("sinks", "false", "attention sinks (one logit per head)"),
    ParamInfo::size(
        "B",
        "1",
        "batch",
        &[
            ("q", 0),
            ("k", 0),
            ("v", 0),
            ("q_seg", 0),
            ("kv_seg", 0),
            ("out", 0),
            ("dout", 0),
            ("lse", 0),
            ("di", 0),
            ("dq_partial", 1),
            ("dq_in", 1),
        ],
    ),
    ParamInfo::size(
        "H",
        "4",
        "query heads",
        &[
            ("q", 1),
            ("out", 1),
            ("dout", 1),
            ("lse", 1),
            ("di", 1),
            ("dq_partial", 2),
            ("dq_in", 2),
        ],
    ),
    ParamInfo::size(
        "KVH",
        "2",
        "key/value heads (divides H)",
        &[("k", 1), ("v", 1)],
    ),
    ParamInfo::size(
        "SQ",
        "512",
        "query sequence length",
        &[
            ("q", 2),
            ("q_seg", 1),
            ("out", 2),
            ("dout", 2),
            ("lse", 2),
            ("di", 2),
            ("dq_partial", 3),
            ("dq_in", 3),
        ],
    ),
    ParamInfo::size(
        "SKV",
        "512",
        "key sequence length",
        &[("k", 2), ("v", 2), ("kv_seg", 2)],
    ),
    ParamInfo::size(
        "D",
        "64",
        "head dim",
        &[
            ("q", 3),
            ("k", 3),
            ("v", 3),
            ("out", 3),
            ("dout", 3),
            ("dq_partial", 4),
            ("dq_in", 4),
        ],
    ),
];

/// Splash attention's kernels.
pub const KERNELS: &[KernelInfo] = &[
    splash_kernel(
        "splash_fwd",
        "splash attention forward: out and logsumexp over the mask's non-empty blocks",
    ),
    splash_kernel(
        "splash_bwd_prep",
        "splash backward preprocessing: di = rowsum(out * dout) and the sinks' gradient",
    ),
    splash_kernel(
        "splash_dq",
        "splash backward dQ (separate backward kernels)",
    ),
    splash_kernel(
        "splash_dkv",
        "splash backward dK and dV (separate backward kernels)",
    ),
    splash_kernel(
        "splash_bwd_fused",
        "splash fused backward: dK, dV and dQ per key block in one kernel",
    ),
    splash_kernel(
        "splash_dq_reduce",
        "splash fused backward's dQ reduction over key blocks",
    ),
];

/// A splash error in a registered kernel's parameters (a mask that does not parse, block
/// sizes the rules refuse) is the family's error, kept typed as the source.
impl From<SplashError> for RegistryError {
    fn from(e: SplashError) -> Self {
        RegistryError::Family(Box::new(e))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn entries_are_complete() {
        tessera_registry::check_family(super::KERNELS);
    }
}

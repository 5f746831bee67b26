//! Ulysses with its exchanges inside the attention kernel (`ulysses_fused`): the same split
//! as [`Ulysses`](super::Ulysses) (every device attends `H/U` heads over the whole sequence),
//! but no all-to-all runs as an XLA collective. One kernel per direction
//! ([`ulysses_attention_of`], [`ulysses_attention_bwd_of`]) copies each head's rows of q, k,
//! v from every device by remote copies while the head before is attended, and sends each
//! finished chunk of output rows (of dq, dk, dv in the backward) back to its owner while the
//! next is computed. MaxText runs XLA's all-to-alls around splash instead, and leaves hiding
//! them to the scheduler.
//!
//! The layer's `[b, H, s, D]` blocks enter the kernel as `[b H, s, D]`: any partition of the
//! (sequence, head) pairs into equal groups per device is a valid Ulysses split, and this
//! one needs no transpose. The unit is one custom VJP: the forward kernel writes `out` and
//! `lse`; the backward kernel takes q, k, v, the output's cotangent and the residuals `lse`
//! and `di = rowsum(out * dout)` (which every device computes for its own rows, so only
//! they travel, not `out`); a loss through `lse` is refused.
//!
//! Segment ids (packed sequences) travel with the rows: each device gives the kernels its
//! own rows' ids per head (f32, exact below 2^24), and they are exchanged beside q, k, v.
//! The softmax scale and the soft cap are the configuration's; the mask is one of full,
//! causal, local and chunked causal ([`Visibility`]: the kernels skip the key blocks a query
//! block sees nothing of, as splash does). What the kernels do not do, refused before
//! anything is built ([`ContextStrategy::check`]): masks with an offset, dense masks and
//! their combinations, different head dims for values, block sizes that differ or do not divide the
//! rows a device holds, dtypes other than f32 and bf16. GQA's KV heads are repeated to
//! every query head before the kernel, so the exchange moves `H` heads of K and V (the plain
//! strategy moves `KVH`, or the Ulysses degree).
//! A head's whole sequence is gathered in VMEM where it fits the target's VMEM limit; where
//! it does not (on TPU near 16K tokens at D 128 in bf16), the kernels that stage it in HBM
//! instead ([`ulysses_attention_staged_of`], [`ulysses_attention_bwd_staged_of`]) are used,
//! which fetch it into VMEM block by block.

use std::fmt;
use std::rc::Rc;

use tessera_collective_kernels::ulysses::{
    ulysses_attention_bwd_of, ulysses_attention_bwd_staged_of, ulysses_attention_of,
    ulysses_attention_staged_of, Logits, Visibility,
};
use tessera_collectives::axes::Context;
use tessera_collectives::{CollectiveError, LocalValue, Spmd};
use tessera_dsl::mosaic::scoped_vmem_bytes;
use tessera_dsl::prelude::bf16;
use tessera_dsl::{ArgSpec, DType, DeviceAxis, Kernel, KernelDef, Lowering, ProblemKind};
use tessera_hlo::autodiff::{backward_failed, VjpCall, VjpRule};
use tessera_hlo::{FuncBuilder, HloError, Reducer, Value};
use tessera_splash::{Mask, SeqOffsets};

use super::{Composition, ContextStrategy, Exchange, Fixed, KernelCalls, Listing, Shards};
use crate::context::error::ConfigError;
use crate::context::layout::{kernel_devices, ModelMesh, SeqLseTensor, SeqTensor, WholeSegments};
use crate::context::spmd::{replicate_heads, Segments};
use crate::context::{ContextParallel, CpError};

pub(super) const LISTING: Listing = Listing::fixed::<UlyssesFused>("ulysses_fused (ulysses-fused)");

impl Fixed for UlyssesFused {
    const SPELLINGS: &'static [&'static str] = &["ulysses_fused", "ulysses-fused"];
}

/// Ulysses whose all-to-alls run inside the attention kernels, overlapping the attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UlyssesFused;

/// The unit's name in autodiff messages.
const OP: &str = "fused Ulysses attention";

impl ContextStrategy for UlyssesFused {
    fn name(&self) -> String {
        "ulysses_fused".into()
    }

    fn ulysses_degree(&self, devices: usize) -> usize {
        devices
    }

    fn repeats_kv_heads(&self) -> bool {
        true
    }

    fn local_lengths(&self, s: Shards) -> (usize, usize) {
        (s.seq, s.seq)
    }

    /// Its kernels take blocks of the rows a device holds.
    fn block_lengths(&self, s: Shards) -> (usize, usize) {
        let rows = s.seq / s.devices.max(1);
        (rows, rows)
    }

    /// One call, at the start of the sequence, on every device.
    fn kernel_calls(&self, _s: Shards) -> KernelCalls {
        vec![vec![vec![SeqOffsets::default()]]]
    }

    fn exchange(&self, _devices: usize) -> Exchange {
        Exchange::HeadsInKernel
    }

    fn check(&self, cp: &ContextParallel) -> Result<(), ConfigError> {
        let refuse = |what: String, fix: &str| {
            Err(ConfigError::StrategyLimit {
                strategy: cp.strategy.label(),
                what,
                fix: fix.to_string(),
            })
        };
        let (d, b) = (cp.dims, cp.block_sizes);
        visible_of(cp)?;
        if d.head_dim != d.head_dim_v {
            return refuse(
                format!(
                    "its kernels take one head dim for q, k and v, not {} and {}",
                    d.head_dim, d.head_dim_v
                ),
                "use the same head dim for values, or the ulysses strategy",
            );
        }
        if !matches!(cp.dtype, DType::F32 | DType::BF16) {
            return refuse(
                format!("its kernels run in f32 or bf16, not {}", cp.dtype),
                "use f32 or bf16",
            );
        }
        if b.block_q != b.block_kv {
            return refuse(
                format!(
                    "its kernels take one block for queries and keys, not {} and {}",
                    b.block_q, b.block_kv
                ),
                "use the same block for both",
            );
        }
        Ok(())
    }

    fn compose(&self, cp: &ContextParallel) -> Result<Rc<dyn Composition>, CpError> {
        cp.validate()?;
        Ok(Rc::new(Composed {
            block: cp.block_sizes.block_q,
            visible: visible_of(cp)?,
            logits: Logits::new(cp.options.scale, cp.options.soft_cap),
            kv_repeat: cp.kv_replication(),
            lowering: cp.lowering.clone(),
            keep_residuals: cp.options.keep_residuals,
        }))
    }
}

/// The kernels' [`Visibility`] of the configuration's mask, or its refusal.
fn visible_of(cp: &ContextParallel) -> Result<Visibility, ConfigError> {
    visibility(&cp.mask, cp.dims.q_len).ok_or_else(|| ConfigError::StrategyLimit {
        strategy: cp.strategy.label(),
        what: format!(
            "its kernels take full, causal, local and chunked causal masks without offsets, \
             not {:?}",
            cp.mask
        ),
        fix: "use one of those, or the ulysses strategy (every splash mask)".to_string(),
    })
}

/// The kernels' [`Visibility`] of `mask` over a sequence of `seq` positions (a window or
/// chunk longer than the sequence is the sequence), or `None` where they do not take it.
fn visibility(mask: &Mask, seq: usize) -> Option<Visibility> {
    let length = |n: u64| u32::try_from(n.min(seq as u64)).ok();
    match *mask {
        Mask::Full => Some(Visibility::Full),
        Mask::Causal { offset: 0 } => Some(Visibility::Causal),
        Mask::Local {
            left,
            right,
            offset: 0,
        } => Some(Visibility::Local {
            left: match left {
                Some(l) => Some(length(l)?),
                None => None,
            },
            right: match right {
                Some(r) => Some(length(r)?),
                None => None,
            },
        }),
        Mask::ChunkedCausal { chunk } if chunk > 0 => Some(Visibility::ChunkedCausal {
            chunk: length(chunk)?,
        }),
        _ => None,
    }
}

/// The unit for one configuration: its kernels' block and mask, how often each KV head is
/// repeated, and how the kernels are lowered.
#[derive(Clone)]
struct Composed {
    block: usize,
    visible: Visibility,
    logits: Logits,
    kv_repeat: usize,
    lowering: Lowering,
    /// [`tessera_splash::SplashOptions::keep_residuals`]: the unit's inputs (this device's
    /// q, k, v rows) and outputs are kept for the backward of a loop holding it.
    keep_residuals: bool,
}

impl fmt::Debug for Composed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UlyssesFused")
            .field("block", &self.block)
            .field("visible", &self.visible)
            .field("logits", &self.logits)
            .field("kv_repeat", &self.kv_repeat)
            .field("kernels", &self.lowering.kernels)
            .finish_non_exhaustive()
    }
}

impl Composition for Composed {
    fn attend<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        [q, k, v]: [&SeqTensor<'p>; 3],
        segment_ids: Option<&WholeSegments<'p>>,
    ) -> Result<(SeqTensor<'p>, SeqLseTensor<'p>), CollectiveError> {
        let (k, v) = (
            replicate_heads(k, self.kv_repeat)?,
            replicate_heads(v, self.kv_repeat)?,
        );
        let devices = kernel_devices(p.mesh());
        let me = p.axis_index::<Context>()?;
        let mut inputs: Vec<&dyn LocalValue<ModelMesh>> = vec![q, &k, &v, &me];
        if let Some(ids) = segment_ids {
            inputs.push(ids);
        }
        p.local_results(&inputs, |f, x| {
            let dims = f.value_type(x[0])?.dims.clone();
            let (b, h, s, d) = (dims[0], dims[1], dims[2], dims[3]);
            let merged = x[..3]
                .iter()
                .map(|&t| f.reshape(t, &[b * h, s, d]))
                .collect::<Result<Vec<_>, _>>()?;
            let segments = match x.get(4) {
                Some(&ids) => Some(self.local_segments(f, ids, x[3], h, s)?),
                None => None,
            };
            let unit = Rc::new(Unit {
                composed: self.clone(),
                devices: devices.clone(),
                segments,
            });
            let rule: Rc<dyn VjpRule> = unit.clone();
            let y = f.custom_vjp(rule, &merged, |f, xs| unit.forward(f, xs))?;
            if self.keep_residuals {
                for &v in merged.iter().chain(&y) {
                    f.keep_for_backward(v)?;
                }
            }
            Ok(vec![
                f.reshape(y[0], &[b, h, s, d])?,
                f.reshape(y[1], &[b, h, s])?,
            ])
        })
    }
}

impl Composed {
    /// This device's rows of the whole `[b, S]` segment ids `ids` (its block `me` of `rows`
    /// positions) for each of its `heads` heads, as the kernels take them: f32 (exact below
    /// 2^24), `[b heads, rows / block, 1, block]`.
    fn local_segments(
        &self,
        f: &mut FuncBuilder<'_>,
        ids: Value,
        me: Value,
        heads: i64,
        rows: i64,
    ) -> Result<Value, CollectiveError> {
        let b = f.value_type(ids)?.dims[0];
        let block = self.block as i64;
        let len = f.scalar(rows as f64, DType::I32)?;
        let start = f.mul(me, len)?;
        let mine = Segments { full: ids }.slice(f, Some(start), rows as usize)?;
        let mine = f.convert(mine, DType::F32)?;
        let per_head = f.broadcast_in_dim(mine, &[b, heads, rows], &[0, 1, 2])?;
        Ok(f.reshape(per_head, &[b * heads, rows / block, 1, block])?)
    }
}

/// A direction's two kernels: the one that gathers a head in VMEM, the one that stages it
/// in HBM (for heads that do not fit VMEM), and how many of their outputs are results (the
/// staged kernel's staging buffers follow them).
struct Kernels {
    gathered: KernelDef,
    staged: KernelDef,
    results: usize,
}

/// The custom-VJP unit: the forward kernel, and the backward kernel as its rule; the
/// segment ids the kernels take, if any (no cotangent flows to them).
#[derive(Debug)]
struct Unit {
    composed: Composed,
    devices: Vec<DeviceAxis>,
    segments: Option<Value>,
}

impl Unit {
    /// The kernel `defs` holds for `args` (and the segment ids, if any) on the step's mesh,
    /// lowered into `f`: `defs.gathered`, which gathers a head in VMEM, where it fits the
    /// target's VMEM limit, else `defs.staged`, which stages it in HBM (its staging outputs
    /// are dropped: the first `defs.results` outputs are returned).
    fn lower(
        &self,
        f: &mut FuncBuilder<'_>,
        defs: Kernels,
        args: &[Value],
    ) -> Result<Vec<Value>, CollectiveError> {
        let args = match self.segments {
            Some(ids) => [args, &[ids]].concat(),
            None => args.to_vec(),
        };
        let without_ids = |def: KernelDef| match self.segments {
            Some(_) => Ok(def),
            None => def.without("segment_ids").map_err(CollectiveError::local),
        };
        let specs = args
            .iter()
            .map(|&a| {
                let t = f.value_type(a)?;
                let shape = t.dims.iter().map(|&n| n as usize).collect::<Vec<_>>();
                Ok(ArgSpec::new(t.dtype, shape))
            })
            .collect::<Result<Vec<_>, HloError>>()?;
        let lowering = &self.composed.lowering;
        let instantiate = |def: KernelDef| {
            without_ids(def)?
                .instantiate_on(&specs, &self.devices, &lowering.rules)
                .map_err(CollectiveError::local)
        };
        // A head's whole sequence fits where the kernel's scoped VMEM (its scratch and the
        // room libtpu spills its largest values to) is within the budget: at 32K tokens and
        // blocks 2048 the rules pass the forward's 57 MiB of scratch against 64 MiB, and
        // libtpu then needs 79.6 MiB.
        let fits = |k: &Kernel| {
            lowering
                .rules
                .vmem_limit_bytes
                .is_none_or(|limit| scoped_vmem_bytes(k) <= limit)
        };
        let kernel = match without_ids(defs.gathered)?.instantiate_on(
            &specs,
            &self.devices,
            &lowering.rules,
        ) {
            Ok(kernel) if fits(&kernel) => kernel,
            Ok(_) => instantiate(defs.staged)?,
            // Only VMEM refused it: a head's whole sequence does not fit.
            Err(e) if e.problems.iter().all(|p| p.kind == ProblemKind::Vmem) => {
                instantiate(defs.staged)?
            }
            Err(e) => return Err(CollectiveError::local(e)),
        };
        // Nothing inside a step could read run-time index checks' flags (an extra output,
        // `tessera_dsl::checks`), so a failed check would go unreported. The kernels prove
        // every index they compute when instantiated; one that did not is refused.
        if let Some(site) = kernel.checks.sites.first() {
            return Err(CollectiveError::local(format!(
                "kernel `{}` checks {} at run time ({}), which a step cannot report; the \
                 fused Ulysses kernels must prove their indices in range",
                kernel.name, site.kind, site.loc
            )));
        }
        let mut outputs = lowering
            .lower_into_spmd(&kernel, f, &args)
            .map_err(CollectiveError::local)?;
        outputs.truncate(defs.results);
        Ok(outputs)
    }

    /// `out [bH, s, D]` and `lse [bH, s / block, 1, block]` (row-major `[bH, s]`) of `q, k,
    /// v [bH, s, D]`.
    fn forward(
        &self,
        f: &mut FuncBuilder<'_>,
        qkv: &[Value],
    ) -> Result<Vec<Value>, CollectiveError> {
        let Composed {
            block,
            visible,
            logits,
            ..
        } = self.composed;
        let (gathered, staged) = match f.value_type(qkv[0])?.dtype {
            DType::BF16 => (
                ulysses_attention_of::<bf16, ModelMesh, Context>(block, visible, logits),
                ulysses_attention_staged_of::<bf16, ModelMesh, Context>(block, visible, logits),
            ),
            _ => (
                ulysses_attention_of::<f32, ModelMesh, Context>(block, visible, logits),
                ulysses_attention_staged_of::<f32, ModelMesh, Context>(block, visible, logits),
            ),
        };
        let defs = Kernels {
            gathered,
            staged,
            results: 2,
        };
        self.lower(f, defs, qkv)
    }

    fn backward(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, CollectiveError> {
        if call.cotangents.get(1).is_some_and(Option::is_some) {
            return Err(CollectiveError::local(
                "its backward kernel takes the output's cotangent alone, and this program \
                 differentiates through the lse too; differentiate the output only, or use \
                 the ulysses strategy",
            ));
        }
        let dout = match call.cotangents[0] {
            Some(d) => d,
            None => {
                let t = f.value_type(call.outputs[0])?.clone();
                f.splat(0.0, t)?
            }
        };
        let Composed {
            block,
            visible,
            logits,
            ..
        } = self.composed;
        let (gathered, staged) = match f.value_type(dout)?.dtype {
            DType::BF16 => (
                ulysses_attention_bwd_of::<bf16, ModelMesh, Context>(block, visible, logits),
                ulysses_attention_bwd_staged_of::<bf16, ModelMesh, Context>(block, visible, logits),
            ),
            _ => (
                ulysses_attention_bwd_of::<f32, ModelMesh, Context>(block, visible, logits),
                ulysses_attention_bwd_staged_of::<f32, ModelMesh, Context>(block, visible, logits),
            ),
        };
        let defs = Kernels {
            gathered,
            staged,
            results: 3,
        };
        // The residuals the backward kernel takes: the forward's lse, and di = rowsum(out *
        // dout) of this device's rows (in f32, laid out as the lse).
        let (out, lse) = (call.outputs[0], call.outputs[1]);
        let product = {
            let (out, dout) = (f.convert(out, DType::F32)?, f.convert(dout, DType::F32)?);
            f.mul(out, dout)?
        };
        let di = f.reduce(product, &[2], Reducer::Sum)?;
        let di = f.reshape(di, &f.value_type(lse)?.dims.clone())?;
        let args = [
            call.inputs[0],
            call.inputs[1],
            call.inputs[2],
            dout,
            lse,
            di,
        ];
        let grads = self.lower(f, defs, &args)?;
        Ok(grads.into_iter().map(Some).collect())
    }
}

impl VjpRule for Unit {
    fn name(&self) -> &str {
        OP
    }

    fn vjp(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, HloError> {
        self.backward(f, call).map_err(|e| backward_failed(OP, e))
    }
}

//! `x @ all_gather(w)` over the batch axis as one custom-VJP unit of the SPMD train step
//! (`--collective-matmul`): the forward is the all-gather matmul kernel
//! ([`all_gather_matmul`]: the remote copy of the next weight shard around the ring of the
//! batch axis overlaps the matmul of the current one), lowered into the step as its
//! [`Lowering`] says (inline StableHLO with `collective_permute`s, or one Mosaic
//! `tpu_custom_call` per device on TPU); the backward is plain XLA ops:
//!
//! - `dw = reduce_scatter(x^T dy)` over the batch axis along the weight's rows: each device
//!   gets its shard of the gradient, summed over the batch axis (what the transpose of the
//!   unfused step's all-gather gives);
//! - `dx = dy all_gather(w)^T`: the weight gathered again (the unfused step's backward reads
//!   the gathered weight its forward kept or re-gathered) and one dot. The kernel gathers
//!   row shards, while `w^T`'s shards are column blocks, so it does not apply here.
//!
//! Both collectives of the backward join the program's record of collectives; the
//! kernel's remote copies in the forward do not (they are inside the kernel).

use std::fmt;
use std::rc::Rc;

use tessera_collective_kernels::all_gather_matmul;
use tessera_collectives::axes::Data;
use tessera_collectives::{AxisGroups, Collective, CollectiveError, CollectiveRecorder, Spmd};
use tessera_dsl::prelude::bf16;
use tessera_dsl::{ArgSpec, DeviceAxis, KernelDef, Lowering};
use tessera_hlo::autodiff::{backward_failed, VjpCall, VjpRule};
use tessera_hlo::{DType, DotDims, FuncBuilder, HloError, Value};
use tessera_parallel::{kernel_devices, ModelMesh};

/// The unit's name in autodiff messages.
const OP: &str = "all-gather matmul";

/// The all-gather matmul over the batch axis of a step on [`ModelMesh`].
#[derive(Clone)]
pub(crate) struct CollectiveMatmul {
    lowering: Lowering,
    /// The step's mesh as the kernel's devices (`data x context x ring`).
    devices: Vec<DeviceAxis>,
    /// The batch axis, which the weights' rows are split over.
    data: AxisGroups,
    recorder: CollectiveRecorder,
}

impl fmt::Debug for CollectiveMatmul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CollectiveMatmul")
            .field("devices", &self.devices)
            .field("kernels", &self.lowering.kernels)
            .finish_non_exhaustive()
    }
}

impl CollectiveMatmul {
    /// The unit for the program `p` builds, its kernels lowered as `lowering` says.
    pub(crate) fn new(p: &Spmd<'_, ModelMesh>, lowering: &Lowering) -> Self {
        let mesh = p.mesh();
        CollectiveMatmul {
            lowering: lowering.clone(),
            devices: kernel_devices(mesh),
            data: mesh.axis::<Data>(),
            recorder: p.collective_recorder(),
        }
    }

    /// `x [T, K] @ W [K, F]` on every device, where `w [K / N, F]` is this device's rows of
    /// `W` (its position on the batch axis of `N` devices) and `x` its own rows: the result
    /// `[T, F]` in `x`'s dtype.
    pub(crate) fn apply(
        &self,
        f: &mut FuncBuilder<'_>,
        x: Value,
        w: Value,
    ) -> Result<Value, CollectiveError> {
        let rule = Rc::new(self.clone());
        let y = f.custom_vjp(rule, &[x, w], |f, xw| self.forward(f, xw[0], xw[1]))?;
        Ok(y[0])
    }

    fn forward(
        &self,
        f: &mut FuncBuilder<'_>,
        x: Value,
        w: Value,
    ) -> Result<Vec<Value>, CollectiveError> {
        let (xt, wt) = (f.value_type(x)?.clone(), f.value_type(w)?.clone());
        let dims = |d: &[i64]| d.iter().map(|&n| n as usize).collect::<Vec<_>>();
        let (xs, ws) = (dims(&xt.dims), dims(&wt.dims));
        let block_t = block(xs[0], 256, 8);
        let block_f = block(ws[1], 512, 128);
        let def: KernelDef = match xt.dtype {
            DType::F32 => all_gather_matmul::<f32, ModelMesh, Data>(block_t, block_f),
            DType::BF16 => all_gather_matmul::<bf16, ModelMesh, Data>(block_t, block_f),
            other => {
                return Err(CollectiveError::local(format!(
                    "the all-gather matmul runs in f32 or bf16, not {other}"
                )))
            }
        };
        let args = [ArgSpec::new(xt.dtype, xs), ArgSpec::new(wt.dtype, ws)];
        let kernel = def
            .instantiate_on(&args, &self.devices, &self.lowering.rules)
            .map_err(CollectiveError::local)?;
        self.lowering
            .lower_into_spmd(&kernel, f, &[x, w])
            .map_err(CollectiveError::local)
    }

    fn backward(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, CollectiveError> {
        let (&[x, w], &[y]) = (call.inputs, call.outputs) else {
            return Err(CollectiveError::local(
                "the all-gather matmul unit has two inputs and one output",
            ));
        };
        let dy = match call.cotangents[0] {
            Some(d) => d,
            None => {
                let t = f.value_type(y)?.clone();
                f.splat(0.0, t)?
            }
        };
        let mut grads = vec![None, None];
        if call.needed[0] {
            let gather = Collective::AllGather {
                axis: self.data.clone(),
                dim: 0,
            };
            let whole = self.recorder.emit(f, &gather, w)?;
            let dtype = f.value_type(x)?.dtype;
            let dims = DotDims::contracting([1], [1]);
            grads[0] = Some(f.dot_general(dy, whole, &dims, dtype, None)?);
        }
        if call.needed[1] {
            let dtype = f.value_type(w)?.dtype;
            let dims = DotDims::contracting([0], [0]);
            let partial = f.dot_general(x, dy, &dims, dtype, None)?;
            let scatter = Collective::ReduceScatter {
                axis: self.data.clone(),
                dim: 0,
            };
            grads[1] = Some(self.recorder.emit(f, &scatter, partial)?);
        }
        Ok(grads)
    }
}

impl VjpRule for CollectiveMatmul {
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

/// The largest divisor of `size` up to `cap` that is a multiple of `align` (`size` itself
/// when none is): the kernel's block along a dim.
fn block(size: usize, cap: usize, align: usize) -> usize {
    (1..=size.min(cap))
        .rev()
        .find(|b| size % b == 0 && b % align == 0)
        .unwrap_or(size)
}

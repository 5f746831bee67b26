//! The standalone context-parallel programs of a [`ContextParallel`]: the strategy's
//! composition between global arguments and outputs on a [`ModelMesh`] of one data shard
//! (a forward program, and a forward + backward program that appends the forward's
//! gradient), compiled and run on the devices of a [`Platform`], with the host-side
//! permutations that let callers keep their arrays in natural order.

use std::fmt;

use tessera_collectives::axes::Context;
use tessera_collectives::axes::Data;
use tessera_collectives::{
    CollectiveCall, CollectiveError, DTensor, Executable, Invariant, MeshShape, Program,
    Replicated, Split, Spmd,
};
use tessera_dsl::{DType, HostArray};
use tessera_hlo::Module;
use tessera_runtime::{HostBuffer, Platform};
use tessera_splash::{Inputs, SegmentIds};

use super::config::inverse;
use super::error::CpError;
use super::layout::{
    ModelMesh, Pieces, PiecesLse, RingAxis, Seq, SeqTensor, TokenLayout, WholeSegments,
};
use super::local_splash::WholeSegmentIds;
use super::spmd::{chunk_view, reorder_chunks};
use super::stats::CollectiveStat;
use super::ContextParallel;

/// The global arrays of a call.
#[derive(Debug, Clone, Copy)]
pub struct CpInputs<'a> {
    /// `[B, H, S, D]`.
    pub q: &'a HostArray,
    /// `[B, KVH, S, D]`.
    pub k: &'a HostArray,
    /// `[B, KVH, S, Dv]`.
    pub v: &'a HostArray,
    /// `[B, S]` int32, shared by queries and keys (packed sequences).
    pub segment_ids: Option<&'a HostArray>,
}

/// What [`ContextParallel::forward_backward`] returns: the forward's results and the
/// gradients of `sum(out * dout)`, global arrays.
#[derive(Debug, Clone)]
pub struct CpForwardBackward {
    /// `[B, H, S, Dv]`.
    pub out: HostArray,
    /// `[B, H, S]`, f32.
    pub lse: HostArray,
    /// Like `q`.
    pub dq: HostArray,
    /// Like `k`.
    pub dk: HostArray,
    /// Like `v`.
    pub dv: HostArray,
}

/// A built SPMD program, with the order in which it takes the sequence.
pub struct CpProgram {
    program: Program<ModelMesh>,
    view: HostView,
}

/// How a program's global arrays lay out the sequence: in `chunks` order (see
/// [`ContextParallel::chunk_order`]; `None`: natural), viewed as `[R, S/R]` for a mesh
/// whose ring axis has `ring` devices ([`Pieces`]).
#[derive(Debug, Clone, PartialEq, Eq)]
struct HostView {
    ring: usize,
    chunks: Option<Vec<usize>>,
}

/// The sequence dim of a caller's array: 1 for segment ids `[B, S]`, else 2.
fn seq_dim(rank: usize) -> usize {
    if rank == 2 {
        1
    } else {
        2
    }
}

/// `a` with its sequence dim cut into `order.len()` chunks, chunk `i` of the result being
/// chunk `order[i]` of `a`.
pub(crate) fn permute_chunks(a: &HostArray, order: &[usize]) -> HostArray {
    let shape = a.shape();
    let dim = seq_dim(shape.len());
    let outer: usize = shape[..dim].iter().product();
    let chunk = shape[dim] / order.len() * shape[dim + 1..].iter().product::<usize>();
    let values = a.to_f64_vec();
    let mut out = Vec::with_capacity(values.len());
    for o in 0..outer {
        let base = o * chunk * order.len();
        for &c in order {
            out.extend_from_slice(&values[base + c * chunk..base + (c + 1) * chunk]);
        }
    }
    HostArray::from_f64(a.dtype(), shape.to_vec(), &out).expect("a permutation keeps the shape")
}

impl HostView {
    /// A caller's array (`[B, H, S, ..]` or `[B, S]`) as the program takes it.
    fn program_order(&self, a: &HostArray) -> HostArray {
        let a = match &self.chunks {
            Some(order) => permute_chunks(a, order),
            None => a.clone(),
        };
        let (s, d) = (a.shape(), seq_dim(a.shape().len()));
        let shape = [&s[..d], &[self.ring, s[d] / self.ring], &s[d + 1..]].concat();
        tessera_splash::reshape(&a, &shape)
    }

    /// A program's result (`[B, H, R, S/R, ..]`) as the caller wants it.
    fn caller_order(&self, a: HostArray) -> HostArray {
        let s = a.shape();
        let shape = [&s[..2], &[s[2] * s[3]], &s[4..]].concat();
        let a = tessera_splash::reshape(&a, &shape);
        match &self.chunks {
            Some(order) => permute_chunks(&a, &inverse(order)),
            None => a,
        }
    }
}

impl fmt::Debug for CpProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpProgram")
            .field("view", &self.view)
            .field("collectives", &self.collectives().len())
            .finish_non_exhaustive()
    }
}

impl CpProgram {
    /// The StableHLO text that runs.
    pub fn to_mlir(&self) -> String {
        self.program.to_mlir()
    }

    /// The StableHLO module (its `mhlo.num_partitions` is the number of devices).
    pub fn module(&self) -> &Module {
        self.program.module()
    }

    /// The collectives, in program order.
    pub fn collectives(&self) -> &[CollectiveCall] {
        self.program.collectives()
    }

    pub(crate) fn collective_stats(&self) -> Vec<CollectiveStat> {
        self.collectives()
            .iter()
            .map(|c| CollectiveStat {
                name: c.collective.name(),
                axis: c.collective.axis().name().to_string(),
                operand: c.input_type.to_string(),
                bytes_per_device: c.bytes_sent_per_device(),
            })
            .collect()
    }

    /// Compiles for the first devices of `platform`, one per device of the mesh. A program
    /// with Mosaic kernels compiles only for TPU.
    pub fn compile(&self, platform: Platform) -> Result<CpExecutable, CpError> {
        let kernels = self.module().tpu_kernel_names();
        if !kernels.is_empty() && !platform.takes_mosaic_kernels() {
            return Err(CpError::MosaicOffTpu { platform, kernels });
        }
        Ok(CpExecutable {
            exe: compile_on(&self.program, platform)?,
            view: self.view.clone(),
        })
    }

    /// Compiles for `platform` and runs once on global host arrays.
    pub fn run(
        &self,
        platform: Platform,
        inputs: &[&HostArray],
    ) -> Result<Vec<HostArray>, CpError> {
        self.compile(platform)?.run(inputs)
    }
}

fn compile_on<M: MeshShape>(
    program: &Program<M>,
    platform: Platform,
) -> Result<Executable<M>, CpError> {
    let client = platform
        .client(program.mesh().num_devices())
        .map_err(CpError::Devices)?;
    Ok(program.compile(&client)?)
}

/// A compiled [`CpProgram`].
#[allow(missing_debug_implementations)] // wraps a loaded PJRT executable
pub struct CpExecutable {
    exe: Executable<ModelMesh>,
    view: HostView,
}

impl CpExecutable {
    /// Runs on global host arrays (in natural order): shards them over the devices, runs,
    /// and assembles the global results.
    pub fn run(&self, inputs: &[&HostArray]) -> Result<Vec<HostArray>, CpError> {
        let buffers = inputs
            .iter()
            .map(|a| HostBuffer::from_array(&self.view.program_order(a)))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = self.exe.run_global(&buffers)?;
        outs.iter()
            .map(|b| Ok(self.view.caller_order(b.to_array()?)))
            .collect()
    }
}

/// A device's block of a [`Pieces`] argument as the strategies take it, [`Seq`].
fn local<'p>(x: &DTensor<'p, ModelMesh, Pieces>) -> Result<SeqTensor<'p>, CollectiveError> {
    x.map_local_as::<Seq, Invariant>(|f, v| chunk_view(f, v, true))
}

/// `[B, S]` segment ids as the program takes them, `[B, R, S/R]`.
type SegmentPieces = TokenLayout;

impl ContextParallel {
    /// The forward SPMD program: global `q, k, v` (and `segment_ids [B, S]` int32 when
    /// `segmented`) in, `out [B, H, S, Dv]` and `lse [B, H, S]` out.
    pub fn forward_program(&self, segmented: bool) -> Result<CpProgram, CpError> {
        self.program(false, segmented)
    }

    /// The forward + backward SPMD program: global `q, k, v, dout` (and `segment_ids` when
    /// `segmented`) in, `out, lse, dq, dk, dv` out (`dq, dk, dv`: the gradient of
    /// `sum(out * dout)`, reverse-mode autodiff of the forward built in the program, with
    /// the forward ops the gradients do not need left out).
    pub fn forward_backward_program(&self, segmented: bool) -> Result<CpProgram, CpError> {
        self.program(true, segmented)
    }

    fn program(&self, backward: bool, segmented: bool) -> Result<CpProgram, CpError> {
        self.validate()?;
        let composition = self.strategy.compose(self)?;
        let mesh = self.mesh(1)?;
        let ring = mesh.sizes()[2];
        let name = format!(
            "{}_{}",
            self.strategy
                .maxtext_name()
                .replace(|c: char| !c.is_ascii_alphanumeric(), "_"),
            if backward { "fwdbwd" } else { "fwd" }
        );
        let d = self.dims;
        let i = |x: usize| x as i64;
        let (b, s, r) = (i(d.batch), i(d.q_len), i(ring));
        let pieces = |heads: usize, dim: usize| [b, i(heads), r, s / r, i(dim)];
        let program = Program::build(&name, &mesh, |p| {
            let arg = |dims| p.arg::<Pieces>(dims, self.dtype);
            let q = arg(pieces(d.heads, d.head_dim))?;
            let k = arg(pieces(d.kv_heads, d.head_dim))?;
            let v = arg(pieces(d.kv_heads, d.head_dim_v))?;
            let dout = backward
                .then(|| arg(pieces(d.heads, d.head_dim_v)))
                .transpose()?;
            let seg = segmented
                .then(|| self.whole_segments(p, [b, r, s / r]))
                .transpose()?;
            let qkv = [&local(&q)?, &local(&k)?, &local(&v)?];
            let (out, lse) = composition.attend(p, qkv, seg.as_ref())?;
            out.map_local_as::<Pieces, Invariant>(|f, v| chunk_view(f, v, false))?
                .output::<Pieces>()?;
            lse.map_local_as::<PiecesLse, Invariant>(|f, v| chunk_view(f, v, false))?
                .output::<PiecesLse>()?;
            let Some(dout) = dout else {
                return Ok(());
            };
            output_gradients(p, &out, &local(&dout)?, [&q, &k, &v])
        })?;
        Ok(CpProgram {
            program,
            view: HostView {
                ring,
                chunks: self.load_balance.then(|| self.chunk_order()),
            },
        })
    }

    /// The segment ids `[B, R, S/R]` (the pieces of the program's order) gathered whole on
    /// every device, in natural order: 4 bytes a token, against K/V's `2 D` elements per KV
    /// head.
    fn whole_segments<'p>(
        &self,
        p: &'p Spmd<'_, ModelMesh>,
        dims: [i64; 3],
    ) -> Result<WholeSegments<'p>, CollectiveError> {
        let chunks = p
            .arg::<SegmentPieces>(dims, DType::I32)?
            .all_gather::<Context, 2>()?;
        let whole = if p.mesh().sizes()[2] > 1 {
            chunks.all_gather::<RingAxis, 1>()?
        } else {
            // A split over one device is the whole dim.
            chunks.map_local_as::<(Split<Data>, Replicated, Replicated), Invariant>(|_, x| Ok(x))?
        };
        let whole = whole.map_local_as::<WholeSegmentIds<Split<Data>>, Invariant>(|f, x| {
            let d = f.value_type(x)?.dims.clone();
            Ok(f.reshape(x, &[d[0], d[1] * d[2]])?)
        })?;
        if !self.load_balance {
            return Ok(whole);
        }
        // Gathered in the program's (zigzag) order; the kernels' positions are natural.
        let natural = inverse(&self.chunk_order());
        whole.map_local(|f, x| reorder_chunks(f, x, 1, &natural))
    }

    /// Checks a call's global arrays with the same checks as a single-device splash
    /// attention (shapes against `dims`, dtype, finite values, segment ids int32 `[B, S]`),
    /// so every strategy validates its inputs alike, before anything is compiled.
    pub fn check_inputs(&self, x: &CpInputs<'_>) -> Result<(), CpError> {
        let inputs = Inputs {
            segment_ids: x.segment_ids.map(|s| SegmentIds { q: s, kv: s }),
            ..Inputs::new(x.q, x.k, x.v)
        };
        self.dims.check_inputs(self.dtype, &inputs)?;
        Ok(())
    }

    /// Checks a backward's output cotangent: shaped like the output, finite.
    pub fn check_dout(&self, dout: &HostArray) -> Result<(), CpError> {
        Ok(self.dims.check_output_like("dout", self.dtype, dout)?)
    }

    /// Forward on `devices` devices of `platform`: `out` and `lse` of the global inputs.
    pub fn forward(
        &self,
        platform: Platform,
        x: &CpInputs<'_>,
    ) -> Result<(HostArray, HostArray), CpError> {
        self.check_inputs(x)?;
        let mut inputs = vec![x.q, x.k, x.v];
        inputs.extend(x.segment_ids);
        let outs = self
            .forward_program(x.segment_ids.is_some())?
            .run(platform, &inputs)?;
        let got = outs.len();
        let [out, lse]: [HostArray; 2] = outs.try_into().map_err(|_| CpError::Results {
            program: "forward",
            got,
            expected: 2,
        })?;
        Ok((out, lse))
    }

    /// Forward and backward on `devices` devices of `platform` in one program: `out`, `lse`
    /// and the global `dq`, `dk`, `dv` of `sum(out * dout)`.
    pub fn forward_backward(
        &self,
        platform: Platform,
        x: &CpInputs<'_>,
        dout: &HostArray,
    ) -> Result<CpForwardBackward, CpError> {
        self.check_inputs(x)?;
        self.check_dout(dout)?;
        let mut inputs = vec![x.q, x.k, x.v, dout];
        inputs.extend(x.segment_ids);
        let outs = self
            .forward_backward_program(x.segment_ids.is_some())?
            .run(platform, &inputs)?;
        let got = outs.len();
        let [out, lse, dq, dk, dv]: [HostArray; 5] =
            outs.try_into().map_err(|_| CpError::Results {
                program: "forward + backward",
                got,
                expected: 5,
            })?;
        Ok(CpForwardBackward {
            out,
            lse,
            dq,
            dk,
            dv,
        })
    }
}

/// Ends a backward program: the gradients of `sum(out * dout)` with respect to the arguments
/// `q`, `k`, `v` (reverse-mode autodiff of the forward built in the program), each returned
/// laid out like its argument, and the forward ops they do not need (the output
/// re-shardings) left out.
fn output_gradients<'p>(
    p: &'p Spmd<'_, ModelMesh>,
    out: &SeqTensor<'p>,
    dout: &SeqTensor<'p>,
    [q, k, v]: [&DTensor<'p, ModelMesh, Pieces>; 3],
) -> Result<(), CollectiveError> {
    for g in p.vjp(&[out], &[dout], &[q, k, v])? {
        p.declare::<Pieces, Invariant>(g)?.output::<Pieces>()?;
    }
    p.prune()
}

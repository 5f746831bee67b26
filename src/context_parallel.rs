//! Context-parallel splash attention over a `context` mesh axis of U devices.
//!
//! Implemented so far: **Ulysses** (DeepSpeed-Ulysses, MaxText's
//! `context_parallel_strategy = "ulysses"`), forward and backward. Per device the sequence is
//! sharded, `[B, H, S/U, D]`; an all-to-all (split heads, concatenate sequence) gives each
//! device the whole sequence for `H/U` heads, `[B, H/U, S, D]`; the local splash kernels run;
//! the inverse all-to-all brings the result back to `[B, H, S/U, D]`. The backward is the
//! transpose: the cotangent goes through the inverse's transpose (the forward all-to-all),
//! the splash dq/dkv kernels run locally, and the gradients go back through the forward
//! all-to-alls' transposes (the inverse all-to-all).
//!
//! GQA: with `KVH` divisible by U the KV heads go through the same all-to-all; with
//! `KVH < U` (which MaxText rejects) each KV head is first replicated `U / KVH` times so every
//! device holds the one KV head its query heads use; its gradient is summed back over the
//! replicas.
//!
//! The programs are SPMD StableHLO in the manual-sharding form, built with the typed
//! collectives (the sharding of every tensor is in its type), with the splash kernels
//! inlined by the StableHLO lowering; they run on the PJRT CPU plugin on U devices.

use std::collections::HashMap;

use tessera_collectives::axes::Context;
use tessera_collectives::{mesh, CollectiveError, DTensor, Mesh, Program, Replicated, Split, Spmd};
use tessera_dsl::{DType, HostArray, TargetRules};
use tessera_hlo::{FuncBuilder, Value};
use tessera_runtime::Client;
use tessera_splash::{
    BlockSizes, Dims, Mask, SplashAttention, SplashError, SplashOptions, Stage, Tensor,
};

use crate::backend::{from_host_buffer, to_host_buffer};

mesh!(pub ContextMesh = [Context]);

/// `[B, H, S/U, D]`: the sequence split over `context`.
type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
/// `[B, H/U, S, D]`: the heads split over `context`, the whole sequence on every device.
type HeadSharded = (Replicated, Split<Context>, Replicated, Replicated);
/// `[B, H, S/U]` (logsumexp).
type SeqSharded3 = (Replicated, Replicated, Split<Context>);
/// `[B, H/U, S]`.
type HeadSharded3 = (Replicated, Split<Context>, Replicated);

/// Why a context-parallel call could not run.
#[derive(Debug, thiserror::Error)]
pub enum CpError {
    #[error("ulysses: {0}")]
    Config(String),
    #[error(transparent)]
    Splash(#[from] SplashError),
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[error(transparent)]
    Kernel(#[from] tessera_dsl::KernelError),
    #[error("XLA runtime: {0}")]
    Runtime(#[from] tessera_runtime::Error),
}

/// A Ulysses configuration: the global problem, its mask and the context degree.
#[derive(Debug, Clone)]
pub struct Ulysses {
    /// The global dims (`heads`, `kv_heads`, `q_len = kv_len = S`).
    pub dims: Dims,
    pub dtype: DType,
    /// One mask shared by every head (positions are global).
    pub mask: Mask,
    pub block_sizes: BlockSizes,
    /// The context-parallel degree U (devices on the `context` axis).
    pub degree: usize,
}

/// What each device holds after a Ulysses call, for `--stats`-style reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UlyssesStats {
    /// KV heads each device's attention holds (after the all-to-all).
    pub kv_heads_per_device: usize,
    /// Bytes of K and V each device's attention holds.
    pub kv_bytes_per_device: usize,
    /// How many times each KV head was replicated before the all-to-all (1: none).
    pub kv_replication: usize,
}

impl Ulysses {
    /// Checks the configuration (MaxText's rules, with KV replication for `KVH < U`).
    pub fn validate(&self) -> Result<(), CpError> {
        let (d, u) = (self.dims, self.degree);
        let err = |m: String| Err(CpError::Config(m));
        if u == 0 {
            return err("the context degree must be at least 1".into());
        }
        if d.q_len != d.kv_len {
            return err(format!(
                "q and kv lengths differ ({} and {}); self-attention only",
                d.q_len, d.kv_len
            ));
        }
        if d.heads % u != 0 {
            return err(format!(
                "{} query heads are not divisible by the context degree {u}",
                d.heads
            ));
        }
        if d.q_len % u != 0 {
            return err(format!(
                "the sequence length {} is not divisible by the context degree {u}",
                d.q_len
            ));
        }
        if d.kv_heads < u && u % d.kv_heads != 0 {
            return err(format!(
                "{} KV heads cannot be replicated evenly to the context degree {u}; use a degree that is a multiple of the KV heads",
                d.kv_heads
            ));
        }
        if d.kv_heads >= u && d.kv_heads % u != 0 {
            return err(format!(
                "{} KV heads are not divisible by the context degree {u}",
                d.kv_heads
            ));
        }
        Ok(())
    }

    fn kv_replication(&self) -> usize {
        if self.dims.kv_heads < self.degree {
            self.degree / self.dims.kv_heads
        } else {
            1
        }
    }

    /// The splash attention each device runs on its `[B, H/U, S, D]` slice.
    fn local(&self) -> Result<SplashAttention, CpError> {
        let d = self.dims;
        let local = Dims {
            heads: d.heads / self.degree,
            kv_heads: d.kv_heads * self.kv_replication() / self.degree,
            ..d
        };
        Ok(SplashAttention::new(
            self.mask.clone(),
            local,
            self.dtype,
            self.block_sizes,
            SplashOptions::default(),
            TargetRules::portable(),
        )?)
    }

    pub fn stats(&self) -> UlyssesStats {
        let d = self.dims;
        let kv_heads_per_device = d.kv_heads * self.kv_replication() / self.degree;
        let per_head = d.batch * d.kv_len * (d.head_dim + d.head_dim_v) * self.dtype.size_bytes();
        UlyssesStats {
            kv_heads_per_device,
            kv_bytes_per_device: kv_heads_per_device * per_head,
            kv_replication: self.kv_replication(),
        }
    }

    /// Declares the global `q, k, v` arguments (sequence-sharded) and re-shards them to
    /// heads, replicating the KV heads first when there are fewer than devices.
    fn qkv_by_heads<'p>(
        &self,
        p: &'p Spmd<'_, ContextMesh>,
    ) -> Result<[DTensor<'p, ContextMesh, HeadSharded>; 3], CollectiveError> {
        let (d, rep) = (self.dims, self.kv_replication());
        let q = p.arg::<SeqSharded>(dims4(d.batch, d.heads, d.q_len, d.head_dim), self.dtype)?;
        let k =
            p.arg::<SeqSharded>(dims4(d.batch, d.kv_heads, d.kv_len, d.head_dim), self.dtype)?;
        let v = p.arg::<SeqSharded>(
            dims4(d.batch, d.kv_heads, d.kv_len, d.head_dim_v),
            self.dtype,
        )?;
        let (k, v) = (replicate_heads(&k, rep)?, replicate_heads(&v, rep)?);
        Ok([
            q.all_to_all::<Context, 1, 2>()?,
            k.all_to_all::<Context, 1, 2>()?,
            v.all_to_all::<Context, 1, 2>()?,
        ])
    }

    fn mesh(&self) -> Result<Mesh<ContextMesh>, CpError> {
        Ok(Mesh::<ContextMesh>::new([self.degree])?)
    }

    /// Forward: `out [B, H, S, Dv]` and `lse [B, H, S]` of global `q`, `k`, `v`, computed on
    /// `degree` devices.
    pub fn forward(
        &self,
        q: &HostArray,
        k: &HostArray,
        v: &HostArray,
    ) -> Result<(HostArray, HostArray), CpError> {
        let program = self.forward_program()?;
        let outs = self.run(&program, &[q, k, v])?;
        let mut outs = outs.into_iter();
        Ok((
            outs.next().expect("two outputs"),
            outs.next().expect("two outputs"),
        ))
    }

    /// The forward SPMD program: global `q, k, v` in, `out` and `lse` out.
    pub fn forward_program(&self) -> Result<Program<ContextMesh>, CpError> {
        self.validate()?;
        let local = self.local()?;
        let program = Program::build("ulysses_fwd", &self.mesh()?, |p| {
            let [q, k, v] = self.qkv_by_heads(p)?;
            let outs = p.local_values(&[&q, &k, &v], |f, x| {
                let mut env =
                    HashMap::from([(Tensor::Q, x[0]), (Tensor::K, x[1]), (Tensor::V, x[2])]);
                lower_plan(f, &local.forward_plan(Default::default()), &mut env)?;
                let lse = env[&Tensor::Lse];
                let ld = local.dims();
                let lse = f.reshape(lse, &[ld.batch as i64, ld.heads as i64, ld.q_len as i64])?;
                Ok(vec![env[&Tensor::Out], lse])
            })?;
            let out: DTensor<'_, ContextMesh, HeadSharded> = p.declare(outs[0])?;
            let lse: DTensor<'_, ContextMesh, HeadSharded3> = p.declare(outs[1])?;
            out.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
            lse.all_to_all::<Context, 2, 1>()?.output::<SeqSharded3>()
        })?;
        Ok(program)
    }

    /// Backward: `dq`, `dk`, `dv` (global) of `sum(out * dout)`, given the forward's results.
    pub fn backward(
        &self,
        q: &HostArray,
        k: &HostArray,
        v: &HostArray,
        out: &HostArray,
        lse: &HostArray,
        dout: &HostArray,
    ) -> Result<(HostArray, HostArray, HostArray), CpError> {
        let program = self.backward_program()?;
        let outs = self.run(&program, &[q, k, v, out, lse, dout])?;
        let mut outs = outs.into_iter();
        let mut next = || outs.next().expect("three gradients");
        Ok((next(), next(), next()))
    }

    /// The backward SPMD program: global `q, k, v, out, lse, dout` in, `dq, dk, dv` out.
    pub fn backward_program(&self) -> Result<Program<ContextMesh>, CpError> {
        self.validate()?;
        let local = self.local()?;
        let d = self.dims;
        let rep = self.kv_replication();
        let program = Program::build("ulysses_bwd", &self.mesh()?, |p| {
            let [q, k, v] = self.qkv_by_heads(p)?;
            let out =
                p.arg::<SeqSharded>(dims4(d.batch, d.heads, d.q_len, d.head_dim_v), self.dtype)?;
            let lse =
                p.arg::<SeqSharded3>([d.batch as i64, d.heads as i64, d.q_len as i64], DType::F32)?;
            let dout =
                p.arg::<SeqSharded>(dims4(d.batch, d.heads, d.q_len, d.head_dim_v), self.dtype)?;
            // The transpose of the forward's output all-to-all (split 2, concat 1) is the
            // all-to-all (split 1, concat 2): the same re-sharding the inputs take.
            let out: DTensor<'_, ContextMesh, HeadSharded> = out.all_to_all::<Context, 1, 2>()?;
            let lse: DTensor<'_, ContextMesh, HeadSharded3> = lse.all_to_all::<Context, 1, 2>()?;
            let dout: DTensor<'_, ContextMesh, HeadSharded> = dout.all_to_all::<Context, 1, 2>()?;
            let grads = p.local_values(&[&q, &k, &v, &out, &lse, &dout], |f, x| {
                let ld = local.dims();
                let lse4 = f.reshape(
                    x[4],
                    &[ld.batch as i64, ld.heads as i64, ld.q_len as i64, 1],
                )?;
                let mut env = HashMap::from([
                    (Tensor::Q, x[0]),
                    (Tensor::K, x[1]),
                    (Tensor::V, x[2]),
                    (Tensor::Out, x[3]),
                    (Tensor::Lse, lse4),
                    (Tensor::DOut, x[5]),
                ]);
                lower_plan(f, &local.backward_plan(Default::default()), &mut env)?;
                Ok(vec![env[&Tensor::Dq], env[&Tensor::Dk], env[&Tensor::Dv]])
            })?;
            let dq: DTensor<'_, ContextMesh, HeadSharded> = p.declare(grads[0])?;
            let dk: DTensor<'_, ContextMesh, HeadSharded> = p.declare(grads[1])?;
            let dv: DTensor<'_, ContextMesh, HeadSharded> = p.declare(grads[2])?;
            dq.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
            sum_replicated_heads(&dk.all_to_all::<Context, 2, 1>()?, rep)?
                .output::<SeqSharded>()?;
            sum_replicated_heads(&dv.all_to_all::<Context, 2, 1>()?, rep)?.output::<SeqSharded>()
        })?;
        Ok(program)
    }

    fn run(
        &self,
        program: &Program<ContextMesh>,
        inputs: &[&HostArray],
    ) -> Result<Vec<HostArray>, CpError> {
        let client = Client::cpu_shared(self.degree)?;
        let exe = program.compile(&client)?;
        let buffers = inputs
            .iter()
            .map(|a| to_host_buffer(a))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = exe.run_global(&buffers)?;
        outs.iter()
            .map(|b| from_host_buffer(b).map_err(CpError::Config))
            .collect()
    }
}

fn dims4(a: usize, b: usize, c: usize, d: usize) -> [i64; 4] {
    [a as i64, b as i64, c as i64, d as i64]
}

/// Repeats each head `rep` times along dim 1 (`[B, KVH, S/U, D] -> [B, KVH*rep, S/U, D]`), so
/// head `j` becomes heads `j*rep .. j*rep + rep`.
fn replicate_heads<'p>(
    x: &DTensor<'p, ContextMesh, SeqSharded>,
    rep: usize,
) -> Result<DTensor<'p, ContextMesh, SeqSharded>, CollectiveError> {
    if rep == 1 {
        return Ok(x.clone());
    }
    x.map_local(|f, v| {
        let t = f.value_type(v)?.clone();
        let (b, h, s, d) = (t.dims[0], t.dims[1], t.dims[2], t.dims[3]);
        let wide = f.broadcast_in_dim(v, &[b, h, rep as i64, s, d], &[0, 1, 3, 4])?;
        Ok(f.reshape(wide, &[b, h * rep as i64, s, d])?)
    })
}

/// The transpose of [`replicate_heads`]: sums each group of `rep` heads.
fn sum_replicated_heads<'p>(
    x: &DTensor<'p, ContextMesh, SeqSharded>,
    rep: usize,
) -> Result<DTensor<'p, ContextMesh, SeqSharded>, CollectiveError> {
    if rep == 1 {
        return Ok(x.clone());
    }
    x.map_local(|f, v| {
        let t = f.value_type(v)?.clone();
        let (b, h, s, d) = (t.dims[0], t.dims[1], t.dims[2], t.dims[3]);
        let grouped = f.reshape(v, &[b, h / rep as i64, rep as i64, s, d])?;
        Ok(f.reduce(grouped, &[2], tessera_hlo::Reducer::Sum)?)
    })
}

/// Lowers a splash plan inline into `f` (the kernels under portable rules: this program runs
/// on the CPU plugin), with errors in the collectives' form.
fn lower_plan(
    f: &mut FuncBuilder<'_>,
    stages: &[Stage],
    env: &mut HashMap<Tensor, Value>,
) -> Result<(), CollectiveError> {
    crate::attention::lower_stages(f, stages, &TargetRules::portable(), env)
        .map_err(|e| CollectiveError::local(format!("{e:#}")))
}

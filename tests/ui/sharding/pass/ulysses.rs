//! The Ulysses flow, type-checked end to end on an `fsdp` x `context` mesh:
//! per device `[B, H, S/U, D]` -> all_to_all(split = heads, concat = seq) -> `[B, H/U, S, D]`
//! -> a local attention op that needs the whole sequence -> the inverse all_to_all.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Fsdp = "fsdp");

mesh!(FsdpContext = [Fsdp, Context]);

/// `[B, H, S/U, D]`: batch over `fsdp`, sequence over `context`.
type SeqSharded = (Split<Fsdp>, Replicated, Split<Context>, Replicated);
/// `[B, H/U, S, D]`: batch over `fsdp`, heads over `context`, the whole sequence.
type HeadSharded = (Split<Fsdp>, Split<Context>, Replicated, Replicated);

/// A placeholder for the single-device splash kernel: it needs the whole sequence (dim 2).
/// The real one is `tessera_parallel::local_splash::UlyssesAttention` (see `ulysses_splash.rs`).
fn splash<'p, M: MeshShape, S: Layout<M> + WholeDim<2>>(
    p: &'p Spmd<'_, M>,
    q: &DTensor<'p, M, S>,
    k: &DTensor<'p, M, S>,
    v: &DTensor<'p, M, S>,
) -> Result<DTensor<'p, M, S>, CollectiveError> {
    p.local::<S, Invariant>(&[q, k, v], |f, a| {
        let s = f.mul(a[0], a[1])?;
        Ok(f.add(s, a[2])?)
    })
}

fn main() -> Result<(), CollectiveError> {
    const B: i64 = 4;
    const H: i64 = 8;
    const S: i64 = 64;
    const D: i64 = 16;
    let mesh = Mesh::<FsdpContext>::new([2, 4])?;
    let program = Program::build("ulysses", &mesh, |p| {
        let q = p.arg::<SeqSharded>([B, H, S, D], DType::BF16)?;
        let k = p.arg::<SeqSharded>([B, H, S, D], DType::BF16)?;
        let v = p.arg::<SeqSharded>([B, H, S, D], DType::BF16)?;
        let q: DTensor<'_, FsdpContext, HeadSharded> = q.all_to_all::<Context, 1, 2>()?;
        let k = k.all_to_all::<Context, 1, 2>()?;
        let v = v.all_to_all::<Context, 1, 2>()?;
        let o = splash(p, &q, &k, &v)?;
        let o: DTensor<'_, FsdpContext, SeqSharded> = o.all_to_all::<Context, 2, 1>()?;
        o.output::<SeqSharded>()
    })?;
    let text = program.to_mlir();
    assert_eq!(text.matches("\"stablehlo.all_to_all\"").count(), 4);
    assert_eq!(program.inputs()[0].local.dims, vec![B / 2, H, S / 4, D]);
    assert_eq!(program.outputs()[0].local.dims, vec![B / 2, H, S / 4, D]);
    Ok(())
}

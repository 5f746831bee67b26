//! The all-gather program of tessera-parallel without its all-gathers: the attention reads every
//! key, so k and v must hold the whole sequence, but they still hold one block of it.
mod common;

use common::{config, DIMS};
use tessera_collectives::{axis, mesh, Mesh, Program, Replicated, Split};
use tessera_dsl::DType;
use tessera_parallel::local_splash::AllGatherAttention;
use tessera_parallel::strategy::AllGather;

axis!(Context = "context");
mesh!(Cp = [Context]);

/// `[B, H, S/U, D]`: the sequence split over `context`, as the program takes it.
type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
/// `[B, H, S/U]` (logsumexp).
type SeqSharded3 = (Replicated, Replicated, Split<Context>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let attention = AllGatherAttention::<Context>::new(&config(AllGather))?;
    let mesh = Mesh::<Cp>::new([2])?;
    Program::build("all_gather_fwd", &mesh, |p| {
        let q = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let k = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let v = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        // (the all_gather::<Context, 2>() of k and v is missing)
        let shard = p.axis_index::<Context>()?;
        let (out, lse) = attention.forward(p, &shard, &q, &k, &v, None)?;
        out.output::<SeqSharded>()?;
        lse.output::<SeqSharded3>()
    })?;
    Ok(())
}

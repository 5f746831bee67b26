//! A ring attention step given all-gathered K/V: each step attends one K/V shard, so k and v
//! must stay split over the ring axis.
mod common;

use common::{config, DIMS};
use tessera_collectives::{axis, mesh, Mesh, Program, Replicated, Split};
use tessera_dsl::DType;
use tessera_parallel::local_splash::RingAttention;
use tessera_parallel::strategy::Ring;

axis!(Context = "context");
mesh!(Cp = [Context]);

/// `[B, H, S/U, D]`: the sequence split over `context`, as the program takes it.
type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
/// `[B, H, S/U]` (logsumexp).
type SeqSharded3 = (Replicated, Replicated, Split<Context>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let ring = RingAttention::<Context>::new(&config(Ring))?;
    let mesh = Mesh::<Cp>::new([2])?;
    Program::build("ring_fwd", &mesh, |p| {
        let q = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let k = p.arg::<SeqSharded>(DIMS, DType::F32)?.all_gather::<Context, 2>()?;
        let v = p.arg::<SeqSharded>(DIMS, DType::F32)?.all_gather::<Context, 2>()?;
        let shard = p.axis_index::<Context>()?;
        let partial = ring.forward_step(p, 0, &shard, &q, &k, &v, None, None)?;
        partial.out.output::<SeqSharded>()?;
        partial.lse.output::<SeqSharded3>()
    })?;
    Ok(())
}

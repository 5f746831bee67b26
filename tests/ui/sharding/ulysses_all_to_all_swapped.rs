//! The Ulysses program of tessera-parallel with split and concat swapped in the all-to-all of
//! q: `all_to_all::<Context, 2, 1>` would split the already split sequence and concatenate the
//! heads, which are whole.
mod common;

use common::{config, DIMS};
use tessera_collectives::{axis, mesh, Mesh, Program, Replicated, Split};
use tessera_dsl::DType;
use tessera_parallel::local_splash::UlyssesAttention;
use tessera_parallel::strategy::Ulysses;

axis!(Context = "context");
mesh!(Cp = [Context]);

/// `[B, H, S/U, D]`: the sequence split over `context`, as the program takes it.
type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
/// `[B, H, S/U]` (logsumexp).
type SeqSharded3 = (Replicated, Replicated, Split<Context>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let attention = UlyssesAttention::<Context>::new(&config(Ulysses))?;
    let mesh = Mesh::<Cp>::new([2])?;
    Program::build("ulysses_fwd", &mesh, |p| {
        let q = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let k = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let v = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let q = q.all_to_all::<Context, 2, 1>()?;
        let k = k.all_to_all::<Context, 1, 2>()?;
        let v = v.all_to_all::<Context, 1, 2>()?;
        let (out, lse) = attention.forward(p, &q, &k, &v, None)?;
        out.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
        lse.all_to_all::<Context, 2, 1>()?.output::<SeqSharded3>()
    })?;
    Ok(())
}

//! The Ulysses program of tessera-parallel without its all-to-alls: the attention needs the
//! heads split over `context` and the whole sequence on every device, but q, k and v still
//! hold a block of the sequence.
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
        // (the all_to_all::<Context, 1, 2>() of q, k and v is missing)
        let (out, lse) = attention.forward(p, &q, &k, &v, None)?;
        out.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
        lse.all_to_all::<Context, 2, 1>()?.output::<SeqSharded3>()
    })?;
    Ok(())
}

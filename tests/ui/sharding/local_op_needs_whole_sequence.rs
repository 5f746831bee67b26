//! A single-device attention kernel needs the whole sequence (dim 2); calling it on the
//! sequence-sharded q, without the Ulysses all_to_all, does not compile.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);

/// A placeholder for the splash kernel on `[B, H/U, S, D]`.
fn attention<'p, S: WholeDim<2>>(
    q: &DTensor<'p, Cp, S>,
) -> Result<DTensor<'p, Cp, S>, CollectiveError> {
    q.map_local(|f, q| Ok(f.tanh(q)?))
}

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("ulysses", &mesh, |p| {
        let q = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let o = attention(&q)?;
        o.output::<SeqSharded>()
    })?;
    Ok(())
}

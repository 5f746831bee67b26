//! The returned tensor must have the declared output sharding: the inverse all_to_all is
//! missing, so the result is still head-sharded.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("ulysses", &mesh, |p| {
        let q = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
        let o = q.all_to_all::<Context, 1, 2>()?;
        o.output::<SeqSharded>()
    })?;
    Ok(())
}

//! The concat dim of an all_to_all must be the dim split over its axis: here the sequence
//! (dim 2) is split, but the call concatenates dim 3.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("ulysses", &mesh, |p| {
        let q = p.arg::<(Replicated, Replicated, Split<Context>, Replicated)>(
            [1, 8, 64, 16],
            DType::F32,
        )?;
        let _ = q.all_to_all::<Context, 1, 3>()?;
        Ok(())
    })?;
    Ok(())
}

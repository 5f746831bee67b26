//! A dim that the tensor does not have (rank 4: dims 0..=3).
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("gather", &mesh, |p| {
        let k = p.arg::<(Replicated, Replicated, Split<Context>, Replicated)>(
            [1, 8, 64, 16],
            DType::F32,
        )?;
        let _ = k.all_gather::<Context, 4>()?;
        Ok(())
    })?;
    Ok(())
}

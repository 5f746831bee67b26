//! A collective over a mesh axis the tensor is not split on: the sequence is split over
//! `context`, the all_gather runs over `data`.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Data = "data");

mesh!(DataContext = [Data, Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<DataContext>::new([2, 4])?;
    Program::build("all_gather", &mesh, |p| {
        let k = p.arg::<(Replicated, Replicated, Split<Context>, Replicated)>(
            [2, 8, 64, 16],
            DType::F32,
        )?;
        let _ = k.all_gather::<Data, 2>()?;
        Ok(())
    })?;
    Ok(())
}

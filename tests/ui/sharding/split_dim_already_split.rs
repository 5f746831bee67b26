//! An all_to_all cannot split a dim that is already split over another mesh axis: the batch
//! (dim 0) is split over `data`.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Data = "data");

mesh!(DataContext = [Data, Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<DataContext>::new([2, 4])?;
    Program::build("ulysses", &mesh, |p| {
        let q = p.arg::<(Split<Data>, Replicated, Split<Context>, Replicated)>(
            [2, 8, 64, 16],
            DType::F32,
        )?;
        let _ = q.all_to_all::<Context, 0, 2>()?;
        Ok(())
    })?;
    Ok(())
}

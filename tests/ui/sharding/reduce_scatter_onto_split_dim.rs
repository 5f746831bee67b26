//! reduce_scatter cannot scatter a dim that is already split (here over `data`).
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Data = "data");

mesh!(DataContext = [Data, Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<DataContext>::new([2, 4])?;
    Program::build("rs", &mesh, |p| {
        let x = p.arg::<(Split<Data>, Replicated)>([16, 16], DType::F32)?;
        let partial =
            x.map_local_as::<(Split<Data>, Replicated), Varying<Context>>(|_, v| Ok(v))?;
        let _ = partial.reduce_scatter::<Context, 0>()?;
        Ok(())
    })?;
    Ok(())
}

//! A sharding may only name axes of the tensor's mesh: this mesh has no `fsdp` axis.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Data = "data");
axis!(Fsdp = "fsdp");

mesh!(DataContext = [Data, Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<DataContext>::new([2, 4])?;
    Program::build("params", &mesh, |p| {
        let _w = p.arg::<(Split<Fsdp>, Replicated)>([16, 16], DType::F32)?;
        Ok(())
    })?;
    Ok(())
}

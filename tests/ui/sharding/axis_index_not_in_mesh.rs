//! axis_index over an axis the mesh does not have.
use tessera_collectives::prelude::*;

axis!(Context = "context");
axis!(Data = "data");

mesh!(Cp = [Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("index", &mesh, |p| {
        let _i = p.axis_index::<Data>()?;
        Ok(())
    })?;
    Ok(())
}

//! Each entry of a sharding is `Replicated` or `Split<Axis>`.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("args", &mesh, |p| {
        let _x = p.arg::<(Replicated, Context)>([4, 4], DType::F32)?;
        Ok(())
    })?;
    Ok(())
}

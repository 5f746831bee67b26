//! A ring shift on a replicated tensor: every device holds the same K, so there is nothing
//! to rotate.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("ring", &mesh, |p| {
        let k =
            p.arg::<(Replicated, Replicated, Replicated, Replicated)>([1, 8, 64, 16], DType::F32)?;
        let _ = k.ring_shift::<Context, 2>(1)?;
        Ok(())
    })?;
    Ok(())
}

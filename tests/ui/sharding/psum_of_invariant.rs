//! psum sums per-device summands: a tensor that is the same on every device (Invariant) has
//! none to sum.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Data = "data");

mesh!(DataContext = [Data, Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<DataContext>::new([2, 4])?;
    Program::build("psum", &mesh, |p| {
        let g = p.arg::<(Replicated, Replicated)>([16, 16], DType::F32)?;
        let _ = g.psum::<Data>()?;
        Ok(())
    })?;
    Ok(())
}

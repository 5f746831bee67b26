//! A per-device partial result cannot be a program output: psum it first.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Data = "data");

mesh!(DataContext = [Data, Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<DataContext>::new([2, 4])?;
    Program::build("grad", &mesh, |p| {
        let w = p.arg::<(Replicated, Replicated)>([16, 16], DType::F32)?;
        let grad =
            w.map_local_as::<(Replicated, Replicated), Varying<Data>>(|f, w| Ok(f.mul(w, w)?))?;
        grad.output::<(Replicated, Replicated)>()
    })?;
    Ok(())
}

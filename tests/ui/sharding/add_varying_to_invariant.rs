//! Elementwise ops need both operands to vary (or not) over the same axis: a partial sum
//! plus a replicated value would add the value once per device.
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
        let _ = grad.add(&w)?;
        Ok(())
    })?;
    Ok(())
}

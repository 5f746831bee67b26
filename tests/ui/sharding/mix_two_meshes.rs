//! Tensors of two meshes cannot be mixed, even with the same sharding.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");
axis!(Tensor = "tensor");

mesh!(Cp = [Context]);
mesh!(Tp = [Tensor]);

fn main() -> Result<(), CollectiveError> {
    let cp = Mesh::<Cp>::new([4])?;
    let tp = Mesh::<Tp>::new([4])?;
    Program::build("outer", &cp, |p| {
        let x = p.arg::<(Replicated, Replicated)>([4, 4], DType::F32)?;
        Program::build("inner", &tp, |q| {
            let y = q.arg::<(Replicated, Replicated)>([4, 4], DType::F32)?;
            let _ = x.add(&y)?;
            Ok(())
        })?;
        Ok(())
    })?;
    Ok(())
}

//! Elementwise ops need the same sharding on both sides: q is split on the sequence, k on the
//! heads.
use tessera_collectives::prelude::*;
use tessera_hlo::DType;

axis!(Context = "context");

mesh!(Cp = [Context]);

fn main() -> Result<(), CollectiveError> {
    let mesh = Mesh::<Cp>::new([4])?;
    Program::build("add", &mesh, |p| {
        let q = p.arg::<(Replicated, Replicated, Split<Context>, Replicated)>(
            [1, 8, 64, 16],
            DType::F32,
        )?;
        let k = p.arg::<(Replicated, Split<Context>, Replicated, Replicated)>(
            [1, 8, 64, 16],
            DType::F32,
        )?;
        let _ = q.add(&k)?;
        Ok(())
    })?;
    Ok(())
}

//! The Ulysses program of tessera-parallel, type-checked and built with the real splash
//! kernels: q, k, v re-sharded from sequence to heads, the attention, and back.
#[path = "../common/mod.rs"]
mod common;

use common::{config, DIMS};
use tessera_collectives::axes::Context;
use tessera_collectives::{Mesh, Program, Replicated, Split};
use tessera_dsl::DType;
use tessera_parallel::local_splash::UlyssesAttention;
use tessera_parallel::{strategy::Ulysses, ContextMesh};

/// `[B, H, S/U, D]`: the sequence split over `context`, as the program takes it.
type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated);
/// `[B, H, S/U]` (logsumexp).
type SeqSharded3 = (Replicated, Replicated, Split<Context>);

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let attention = UlyssesAttention::<Context>::new(&config(Ulysses))?;
    let mesh = Mesh::<ContextMesh>::new([2])?;
    let program = Program::build("ulysses_fwd", &mesh, |p| {
        let q = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let k = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let v = p.arg::<SeqSharded>(DIMS, DType::F32)?;
        let q = q.all_to_all::<Context, 1, 2>()?;
        let k = k.all_to_all::<Context, 1, 2>()?;
        let v = v.all_to_all::<Context, 1, 2>()?;
        let (out, lse) = attention.forward(p, &q, &k, &v, None)?;
        out.all_to_all::<Context, 2, 1>()?.output::<SeqSharded>()?;
        lse.all_to_all::<Context, 2, 1>()?.output::<SeqSharded3>()
    })?;
    let text = program.to_mlir();
    assert_eq!(text.matches("\"stablehlo.all_to_all\"").count(), 5);
    assert_eq!(program.outputs()[0].local.dims, vec![1, 4, 128, 64]);
    assert_eq!(program.outputs()[1].local.dims, vec![1, 4, 128]);
    Ok(())
}

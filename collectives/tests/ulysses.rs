//! Ulysses end to end on the CPU devices: `[B, H, S/U, D]` -> all_to_all -> `[B, H/U, S, D]`
//! -> a local op that needs the whole sequence -> inverse all_to_all, against a host
//! reference of the op on the global array. On `context` alone and on `fsdp` x `context`.

mod common;

use common::{client, from_buffer, to_buffer, Arr};
use tessera_collectives::prelude::*;
use tessera_hlo::{DType, Reducer};

mesh!(Cp = [Context]);
mesh!(FsdpContext = [Fsdp, Context]);

/// The stand-in for attention: every position gets the sum over the whole sequence (dim 2),
/// so a device that held only its sequence chunk would compute a different result.
fn sequence_sum<'p, M: MeshShape, S: WholeDim<2>>(
    x: &DTensor<'p, M, S>,
) -> Result<DTensor<'p, M, S>, CollectiveError> {
    let ty = x.local_type()?;
    x.map_local(|f, v| {
        let s = f.reduce(v, &[2], Reducer::Sum)?;
        Ok(f.broadcast_in_dim(s, &ty.dims, &[0, 1, 3])?)
    })
}

fn reference(x: &Arr) -> Arr {
    Arr::from_fn(&x.dims, |i| {
        (0..x.dims[2]).map(|s| x.at(&[i[0], i[1], s, i[3]])).sum()
    })
}

fn check<M: MeshShape>(program: &Program<M>, dims: &[usize], dtype: DType) {
    let mut rng = fastrand::Rng::with_seed(5);
    let x = Arr::random(dims, &mut rng);
    let exe = program
        .compile(&client(program.mesh().num_devices()))
        .unwrap();
    let out = exe.run_global(&[to_buffer(&x, dtype)]).unwrap();
    assert_eq!(from_buffer(&out[0]), reference(&x), "{dtype}");
}

#[test]
fn ulysses_on_context() {
    for dtype in [DType::F32, DType::BF16] {
        type Seq = (Replicated, Replicated, Split<Context>, Replicated);
        let mesh = Mesh::<Cp>::new([4]).unwrap();
        let program = Program::build("ulysses", &mesh, |p| {
            let q = p.arg::<Seq>([2, 4, 16, 3], dtype)?;
            let heads = q.all_to_all::<Context, 1, 2>()?;
            let o = sequence_sum(&heads)?;
            o.all_to_all::<Context, 2, 1>()?.output::<Seq>()
        })
        .unwrap();
        check(&program, &[2, 4, 16, 3], dtype);
    }
}

#[test]
fn ulysses_on_fsdp_x_context() {
    for dtype in [DType::F32, DType::BF16] {
        type Seq = (Split<Fsdp>, Replicated, Split<Context>, Replicated);
        let mesh = Mesh::<FsdpContext>::new([2, 4]).unwrap();
        let program = Program::build("ulysses", &mesh, |p| {
            let q = p.arg::<Seq>([4, 8, 16, 3], dtype)?;
            let heads = q.all_to_all::<Context, 1, 2>()?;
            let o = sequence_sum(&heads)?;
            o.all_to_all::<Context, 2, 1>()?.output::<Seq>()
        })
        .unwrap();
        check(&program, &[4, 8, 16, 3], dtype);
    }
}

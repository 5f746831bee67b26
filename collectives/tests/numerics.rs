//! Every combinator's numbers, checked exactly against a host-side reference (tests/common),
//! on 1-D meshes of 2, 4 and 8 devices and on 2-D meshes over each axis, in f32 and bf16.
//! Inputs are small random integers, so every result (including sums) is exact in bf16.
//! Every program runs in both of its forms (Shardy's, which `Program::compile` uses, and
//! GSPMD's `{manual}` form), and the two must agree bit for bit.

mod common;

use common::{axes_of, client, coords, from_buffer, local, to_buffer, Arr};
use tessera_collectives::prelude::*;
use tessera_collectives::{DimSharding, DimSpec};
use tessera_hlo::DType;
use tessera_runtime::{CompileOptions, HostBuffer};

mesh!(Ring = [Context]);
mesh!(DataContext = [Data, Context]);
mesh!(FsdpContext = [Fsdp, Context]);

/// Compiles and runs `program` on per-device inputs, returning each device's outputs.
fn run<M: MeshShape>(
    program: &Program<M>,
    inputs: &[(&Arr, &PartitionSpec)],
    dtype: DType,
) -> Vec<Vec<Arr>> {
    let mesh = program.mesh();
    let n = mesh.num_devices();
    let per_device: Vec<Vec<HostBuffer>> = (0..n)
        .map(|d| {
            inputs
                .iter()
                .map(|(g, spec)| {
                    let l = local(
                        g,
                        &axes_of::<M>(spec),
                        mesh.sizes(),
                        &coords(d, mesh.sizes()),
                    );
                    to_buffer(&l, dtype)
                })
                .collect()
        })
        .collect();
    let exe = program
        .compile(&client(n))
        .unwrap_or_else(|e| panic!("{e}\n{}", program.to_mlir()));
    let out = exe.run(&per_device).unwrap();
    let gspmd = client(n)
        .compile(
            &program.to_mlir_gspmd(),
            &CompileOptions::manual_partitions(n).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", program.to_mlir_gspmd()));
    assert_eq!(
        gspmd.execute_host(&per_device).unwrap(),
        out,
        "the GSPMD form computes what the Shardy form does:\n{}",
        program.to_mlir()
    );
    out.iter()
        .map(|o| o.iter().map(from_buffer).collect())
        .collect()
}

/// Asserts that output `index` on every device is `expected(coords)`.
fn check<M: MeshShape>(
    mesh: &Mesh<M>,
    out: &[Vec<Arr>],
    index: usize,
    what: &str,
    expected: impl Fn(&[usize]) -> Arr,
) {
    for (d, o) in out.iter().enumerate() {
        let c = coords(d, mesh.sizes());
        assert_eq!(
            o[index],
            expected(&c),
            "{what}: device {d} (mesh coords {c:?}, mesh {mesh})"
        );
    }
}

fn spec(dims: Vec<DimSpec>) -> PartitionSpec {
    PartitionSpec(dims)
}

fn split<A: MeshAxis>() -> DimSpec {
    DimSpec::Split(A::NAME)
}

const R: DimSpec = DimSpec::Replicated;

/// Batch size: 2 per device along the axis `X0` splits dim 0 over (if any).
fn batch<M: MeshShape, X0: DimSharding<M>>(mesh: &Mesh<M>) -> usize {
    match X0::SPEC {
        DimSpec::Replicated => 2,
        DimSpec::Split(a) => 2 * mesh.axis_by_name(a).unwrap().size(),
    }
}

/// Ulysses' pair: `[B, H, S/n, D] -> [B, H/n, S, D]` and back.
fn all_to_all<M, A, X0>(mesh: &Mesh<M>, dtype: DType, rng: &mut fastrand::Rng)
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    X0: DimSharding<M>,
{
    let n = mesh.axis_size::<A>();
    let global = Arr::random(&[batch::<M, X0>(mesh), 2 * n, 2 * n, 3], rng);
    let program = Program::build("all_to_all", mesh, |p| {
        let x = p.arg::<(X0, Replicated, Split<A>, Replicated)>(global.dims_i64(), dtype)?;
        let y: DTensor<'_, M, (X0, Split<A>, Replicated, Replicated)> =
            x.all_to_all::<A, 1, 2>()?;
        let z = y.all_to_all::<A, 2, 1>()?;
        y.output::<(X0, Split<A>, Replicated, Replicated)>()?;
        z.output::<(X0, Replicated, Split<A>, Replicated)>()
    })
    .unwrap();
    let x_spec = spec(vec![X0::SPEC, R, split::<A>(), R]);
    let y_spec = spec(vec![X0::SPEC, split::<A>(), R, R]);
    let out = run(&program, &[(&global, &x_spec)], dtype);
    let sizes = mesh.sizes();
    check(mesh, &out, 0, "all_to_all::<A, 1, 2>", |c| {
        local(&global, &axes_of::<M>(&y_spec), sizes, c)
    });
    check(mesh, &out, 1, "inverse all_to_all", |c| {
        local(&global, &axes_of::<M>(&x_spec), sizes, c)
    });
    // The global view: an all_to_all moves the layout, never the data.
    let exe = program.compile(&client(mesh.num_devices())).unwrap();
    let globals = exe.run_global(&[to_buffer(&global, dtype)]).unwrap();
    assert_eq!(from_buffer(&globals[0]), global);
    assert_eq!(from_buffer(&globals[1]), global);
}

fn all_gather<M, A, X0>(mesh: &Mesh<M>, dtype: DType, rng: &mut fastrand::Rng)
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    X0: DimSharding<M>,
{
    let n = mesh.axis_size::<A>();
    let global = Arr::random(&[batch::<M, X0>(mesh), 2, 2 * n, 3], rng);
    let program = Program::build("all_gather", mesh, |p| {
        let x = p.arg::<(X0, Replicated, Split<A>, Replicated)>(global.dims_i64(), dtype)?;
        let y = x.all_gather::<A, 2>()?;
        y.output::<(X0, Replicated, Replicated, Replicated)>()
    })
    .unwrap();
    let x_spec = spec(vec![X0::SPEC, R, split::<A>(), R]);
    let y_spec = spec(vec![X0::SPEC, R, R, R]);
    let out = run(&program, &[(&global, &x_spec)], dtype);
    check(mesh, &out, 0, "all_gather::<A, 2>", |c| {
        local(&global, &axes_of::<M>(&y_spec), mesh.sizes(), c)
    });
}

/// Ring shifts by +1 and -1, and a partial permutation (position 0 -> n-1).
fn ppermute<M, A, X0>(mesh: &Mesh<M>, dtype: DType, rng: &mut fastrand::Rng)
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    X0: DimSharding<M>,
{
    let n = mesh.axis_size::<A>();
    let a = <M as HasAxis<A>>::INDEX;
    let global = Arr::random(&[batch::<M, X0>(mesh), 2, 2 * n, 3], rng);
    let program = Program::build("ppermute", mesh, |p| {
        let x = p.arg::<(X0, Replicated, Split<A>, Replicated)>(global.dims_i64(), dtype)?;
        x.ring_shift::<A, 2>(1)?
            .output::<(X0, Replicated, Split<A>, Replicated)>()?;
        x.ring_shift::<A, 2>(-1)?
            .output::<(X0, Replicated, Split<A>, Replicated)>()?;
        x.ppermute::<A, 2>(&[(0, n - 1)])?
            .output::<(X0, Replicated, Split<A>, Replicated)>()
    })
    .unwrap();
    let x_spec = spec(vec![X0::SPEC, R, split::<A>(), R]);
    let axes = axes_of::<M>(&x_spec);
    let out = run(&program, &[(&global, &x_spec)], dtype);
    let from = |c: &[usize], shift: usize| {
        let mut c = c.to_vec();
        c[a] = (c[a] + n - shift) % n;
        local(&global, &axes, mesh.sizes(), &c)
    };
    check(mesh, &out, 0, "ring_shift(1)", |c| from(c, 1));
    check(mesh, &out, 1, "ring_shift(-1)", |c| from(c, n - 1));
    check(mesh, &out, 2, "ppermute [(0, n-1)]", |c| {
        if c[a] == n - 1 {
            from(c, n - 1)
        } else {
            Arr::zeros(&from(c, 0).dims)
        }
    });
}

/// psum and reduce_scatter of per-device summands (a split input re-declared as varying),
/// and psum of `vary` (n times the value).
fn sums<M, A, X0>(mesh: &Mesh<M>, dtype: DType, rng: &mut fastrand::Rng)
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    X0: DimSharding<M>,
{
    let n = mesh.axis_size::<A>();
    let b = batch::<M, X0>(mesh);
    // Device i of A holds block i of dim 1: its summand.
    let global = Arr::random(&[b, n * n, 3], rng);
    let inv = Arr::random(&[b, 2, 3], rng);
    let program = Program::build("sums", mesh, |p| {
        let x = p.arg::<(X0, Split<A>, Replicated)>(global.dims_i64(), dtype)?;
        let w = p.arg::<(X0, Replicated, Replicated)>(inv.dims_i64(), dtype)?;
        let parts = x.map_local_as::<(X0, Replicated, Replicated), Varying<A>>(|_, v| Ok(v))?;
        parts
            .psum::<A>()?
            .output::<(X0, Replicated, Replicated)>()?;
        parts
            .reduce_scatter::<A, 1>()?
            .output::<(X0, Split<A>, Replicated)>()?;
        w.vary::<A>()?
            .psum::<A>()?
            .output::<(X0, Replicated, Replicated)>()
    })
    .unwrap();
    let x_spec = spec(vec![X0::SPEC, split::<A>(), R]);
    let w_spec = spec(vec![X0::SPEC, R, R]);
    let out = run(&program, &[(&global, &x_spec), (&inv, &w_spec)], dtype);
    let total = (0..n).fold(Arr::zeros(&[b, n, 3]), |acc, j| {
        acc.add(&global.block(1, n, j))
    });
    let sizes = mesh.sizes();
    check(mesh, &out, 0, "psum", |c| {
        local(&total, &axes_of::<M>(&w_spec), sizes, c)
    });
    let rs_spec = spec(vec![X0::SPEC, split::<A>(), R]);
    check(mesh, &out, 1, "reduce_scatter::<A, 1>", |c| {
        local(&total, &axes_of::<M>(&rs_spec), sizes, c)
    });
    let times_n = Arr::from_fn(&inv.dims, |i| inv.at(i) * n as f32);
    check(mesh, &out, 2, "psum(vary(w))", |c| {
        local(&times_n, &axes_of::<M>(&w_spec), sizes, c)
    });
}

/// axis_index: each device's coordinate along A, returned as a 1-element block of an
/// A-split vector (so the global result is 0, 1, ..., n-1).
fn axis_index<M, A>(mesh: &Mesh<M>)
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
{
    let program = Program::build("axis_index", mesh, |p| {
        let i = p.axis_index::<A>()?;
        let v = i.map_local_as::<(Split<A>,), Invariant>(|f, s| Ok(f.reshape(s, &[1])?))?;
        v.output::<(Split<A>,)>()
    })
    .unwrap();
    let out = run(&program, &[], DType::I32);
    let a = <M as HasAxis<A>>::INDEX;
    check(mesh, &out, 0, "axis_index", |c| {
        Arr::from_fn(&[1], |_| c[a] as f32)
    });
    let exe = program.compile(&client(mesh.num_devices())).unwrap();
    let g = exe.run_global(&[]).unwrap();
    let n = mesh.axis_size::<A>();
    assert_eq!(from_buffer(&g[0]), Arr::from_fn(&[n], |i| i[0] as f32));
}

fn every_combinator<M, A, X0>(mesh: &Mesh<M>, dtype: DType)
where
    M: MeshShape + HasAxis<A>,
    A: MeshAxis,
    X0: DimSharding<M>,
{
    let mut rng = fastrand::Rng::with_seed(mesh.num_devices() as u64 * 31 + A::NAME.len() as u64);
    all_to_all::<M, A, X0>(mesh, dtype, &mut rng);
    all_gather::<M, A, X0>(mesh, dtype, &mut rng);
    ppermute::<M, A, X0>(mesh, dtype, &mut rng);
    sums::<M, A, X0>(mesh, dtype, &mut rng);
    if dtype == DType::F32 {
        axis_index::<M, A>(mesh);
    }
}

fn ring(n: usize) -> Mesh<Ring> {
    Mesh::new([n]).unwrap()
}

#[test]
fn ring_of_2_f32() {
    every_combinator::<Ring, Context, Replicated>(&ring(2), DType::F32);
}

#[test]
fn ring_of_2_bf16() {
    every_combinator::<Ring, Context, Replicated>(&ring(2), DType::BF16);
}

#[test]
fn ring_of_4_f32() {
    every_combinator::<Ring, Context, Replicated>(&ring(4), DType::F32);
}

#[test]
fn ring_of_4_bf16() {
    every_combinator::<Ring, Context, Replicated>(&ring(4), DType::BF16);
}

#[test]
fn ring_of_8_f32() {
    every_combinator::<Ring, Context, Replicated>(&ring(8), DType::F32);
}

#[test]
fn ring_of_8_bf16() {
    every_combinator::<Ring, Context, Replicated>(&ring(8), DType::BF16);
}

fn data_context() -> Mesh<DataContext> {
    Mesh::new([2, 4]).unwrap()
}

#[test]
fn data_x_context_over_context_f32() {
    every_combinator::<DataContext, Context, Split<Data>>(&data_context(), DType::F32);
}

#[test]
fn data_x_context_over_context_bf16() {
    every_combinator::<DataContext, Context, Split<Data>>(&data_context(), DType::BF16);
}

#[test]
fn data_x_context_over_data_f32() {
    every_combinator::<DataContext, Data, Split<Context>>(&data_context(), DType::F32);
}

#[test]
fn data_x_context_over_data_bf16() {
    every_combinator::<DataContext, Data, Split<Context>>(&data_context(), DType::BF16);
}

/// The other axis replicated: the groups over one axis still pick the right devices.
#[test]
fn data_x_context_replicated_batch_f32() {
    every_combinator::<DataContext, Context, Replicated>(&data_context(), DType::F32);
    every_combinator::<DataContext, Data, Replicated>(&data_context(), DType::F32);
}

fn fsdp_context() -> Mesh<FsdpContext> {
    Mesh::new([4, 2]).unwrap()
}

#[test]
fn fsdp_x_context_over_context_f32() {
    every_combinator::<FsdpContext, Context, Split<Fsdp>>(&fsdp_context(), DType::F32);
}

#[test]
fn fsdp_x_context_over_context_bf16() {
    every_combinator::<FsdpContext, Context, Split<Fsdp>>(&fsdp_context(), DType::BF16);
}

#[test]
fn fsdp_x_context_over_fsdp_f32() {
    every_combinator::<FsdpContext, Fsdp, Split<Context>>(&fsdp_context(), DType::F32);
}

#[test]
fn fsdp_x_context_over_fsdp_bf16() {
    every_combinator::<FsdpContext, Fsdp, Split<Context>>(&fsdp_context(), DType::BF16);
}

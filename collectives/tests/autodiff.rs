//! Autodiff through the typed collectives: each collective is a custom-VJP unit whose rule is
//! its transpose ([`Collective::transpose`]). On 4 devices, the gradient of
//! `sum_d <collective(x)_d^2, ct_d>` through the typed combinators equals the one through the
//! raw StableHLO collective and tessera-hlo's op-level rule (they agree), except `psum`,
//! whose replicated cotangent counts once (JAX's convention) where the op-level rule counts it
//! on every device. The transposes join the program's collectives; dead forward collectives
//! are pruned.

mod common;

use common::{client, from_buffer, to_buffer, Arr};
use tessera_collectives::prelude::*;
use tessera_collectives::{AxisGroups, Collective};
use tessera_hlo::{DType, FuncBuilder, Grouping, HloError, Module, Reducer, Sharding, Value};
use tessera_runtime::{CompileOptions, HostBuffer};

mesh!(Ring = [Context]);

const N: usize = 4;
/// Per-device `x`.
const X: [usize; 4] = [2, 4, 4, 3];

type Seq = (Replicated, Replicated, Split<Context>, Replicated);
type Heads = (Replicated, Split<Context>, Replicated, Replicated);
type Whole = (Replicated, Replicated, Replicated, Replicated);

/// A typed program: `z = y * y` with `y = op(x)`, returning `vjp(z; ct)` w.r.t. `x`.
fn typed<S: Layout<Ring>, V: Variation<Ring>, S2: Layout<Ring>>(
    op: impl for<'p> Fn(
        &DTensor<'p, Ring, S, V>,
    ) -> Result<DTensor<'p, Ring, S2, Invariant>, CollectiveError>,
    x_global: [i64; 4],
    ct_global: [i64; 4],
) -> Program<Ring> {
    let mesh = Mesh::<Ring>::new([N]).unwrap();
    Program::build("typed", &mesh, |p| {
        let x = p.arg::<S>(x_global, DType::F32)?;
        let x: DTensor<'_, Ring, S, V> = p.declare(x.value())?;
        let y = op(&x)?;
        let z = y.map_local(|f, y| Ok(f.mul(y, y)?))?;
        let ct = p.arg::<S2>(ct_global, DType::F32)?;
        let g = p.vjp(&[&z], &[&ct], &[&x])?;
        p.declare::<S, Invariant>(g[0])?.output::<S>()
    })
    .unwrap()
}

/// The same with the raw collective on a [`FuncBuilder`] (tessera-hlo's op-level rules).
fn raw(
    op: impl Fn(&mut FuncBuilder<'_>, Value) -> Result<Value, HloError>,
    y_dims: &[usize],
) -> Module {
    let mut m = Module::new("raw");
    m.set_num_partitions(N as u32).unwrap();
    let mut f = m.func("main");
    let t = |d: &[usize]| {
        tessera_hlo::TensorType::new(d.iter().map(|&x| x as i64).collect::<Vec<_>>(), DType::F32)
    };
    let x = f.arg_with_sharding(t(&X), Sharding::Manual).unwrap();
    let y = op(&mut f, x).unwrap();
    let z = f.mul(y, y).unwrap();
    let ct = f.arg_with_sharding(t(y_dims), Sharding::Manual).unwrap();
    let g = f.vjp(&[z], &[ct], &[x]).unwrap();
    f.finish_with_shardings(&[(g[0], Some(Sharding::Manual))])
        .unwrap();
    m
}

/// Runs both on per-device `x` and `ct` and returns each one's per-device gradients.
fn gradients(typed: &Program<Ring>, raw: &Module, ct: &[Arr]) -> (Vec<Arr>, Vec<Arr>) {
    let mut rng = fastrand::Rng::with_seed(5);
    let inputs: Vec<Vec<HostBuffer>> = ct
        .iter()
        .map(|c| {
            vec![
                to_buffer(&Arr::random(&X, &mut rng), DType::F32),
                to_buffer(c, DType::F32),
            ]
        })
        .collect();
    let t = typed.compile(&client(N)).unwrap().run(&inputs).unwrap();
    let r = client(N)
        .compile(
            &raw.to_mlir(),
            &CompileOptions::manual_partitions(N).unwrap(),
        )
        .unwrap()
        .execute_host(&inputs)
        .unwrap();
    let grads = |o: Vec<Vec<HostBuffer>>| o.iter().map(|d| from_buffer(&d[0])).collect();
    (grads(t), grads(r))
}

fn cotangents(dims: &[usize], seed: u64) -> Vec<Arr> {
    let mut rng = fastrand::Rng::with_seed(seed);
    (0..N).map(|_| Arr::random(dims, &mut rng)).collect()
}

fn axis() -> AxisGroups {
    Mesh::<Ring>::new([N]).unwrap().axis::<Context>()
}

fn emit(c: Collective) -> impl Fn(&mut FuncBuilder<'_>, Value) -> Result<Value, HloError> {
    move |f, x| {
        c.emit(f, x).map_err(|e| HloError::Module {
            reason: e.to_string(),
        })
    }
}

#[test]
fn typed_and_op_level_rules_agree() {
    let (b, h, s, d) = (X[0] as i64, X[1] as i64, X[2] as i64, X[3] as i64);
    let n = N as i64;
    // all_to_all: [B, H, S/U, D] -> [B, H/U, S, D].
    let y_dims = [X[0], X[1] / N, X[2] * N, X[3]];
    let t = typed::<Seq, Invariant, Heads>(
        |x| x.all_to_all::<Context, 1, 2>(),
        [b, h, s * n, d],
        [b, h, s * n, d],
    );
    let r = raw(
        emit(Collective::AllToAll {
            axis: axis(),
            split_dim: 1,
            concat_dim: 2,
        }),
        &y_dims,
    );
    let (gt, gr) = gradients(&t, &r, &cotangents(&y_dims, 1));
    assert_eq!(gt, gr, "all_to_all");
    let names: Vec<&str> = t
        .collectives()
        .iter()
        .map(|c| c.collective.name())
        .collect();
    assert_eq!(
        names,
        ["all_to_all", "all_to_all"],
        "the forward and its transpose"
    );

    // all_gather: [B, H, S/U, D] -> whole; its transpose a reduce_scatter.
    let y_dims = [X[0], X[1], X[2] * N, X[3]];
    let t = typed::<Seq, Invariant, Whole>(
        |x| x.all_gather::<Context, 2>(),
        [b, h, s * n, d],
        [b, h, s * n, d],
    );
    let r = raw(
        emit(Collective::AllGather {
            axis: axis(),
            dim: 2,
        }),
        &y_dims,
    );
    let (gt, gr) = gradients(&t, &r, &cotangents(&y_dims, 2));
    assert_eq!(gt, gr, "all_gather");
    let names: Vec<&str> = t
        .collectives()
        .iter()
        .map(|c| c.collective.name())
        .collect();
    assert_eq!(names, ["all_gather", "reduce_scatter"]);

    // reduce_scatter of a partial sum: whole, varying -> [B, H, S/U, D].
    let y_dims = [X[0], X[1], X[2] / N, X[3]];
    let t = typed::<Whole, Varying<Context>, Seq>(
        |x| x.reduce_scatter::<Context, 2>(),
        [b, h, s, d],
        [b, h, s, d],
    );
    let r = raw(
        emit(Collective::ReduceScatter {
            axis: axis(),
            dim: 2,
        }),
        &y_dims,
    );
    let (gt, gr) = gradients(&t, &r, &cotangents(&y_dims, 3));
    assert_eq!(gt, gr, "reduce_scatter");

    // A ring shift and a partial permutation.
    for (i, pairs) in [vec![(0, 1), (1, 2), (2, 3), (3, 0)], vec![(2, 0), (1, 3)]]
        .into_iter()
        .enumerate()
    {
        let pp = pairs.clone();
        let t = typed::<Seq, Invariant, Seq>(
            move |x| x.ppermute::<Context, 2>(&pp),
            [b, h, s * n, d],
            [b, h, s * n, d],
        );
        let r = raw(
            emit(Collective::Ppermute {
                axis: axis(),
                pairs,
            }),
            &X,
        );
        let (gt, gr) = gradients(&t, &r, &cotangents(&X, 4 + i as u64));
        assert_eq!(gt, gr, "ppermute #{i}");
    }
}

#[test]
fn psum_takes_a_replicated_cotangent_once() {
    let (b, h, s, d) = (X[0] as i64, X[1] as i64, X[2] as i64, X[3] as i64);
    let t = typed::<Whole, Varying<Context>, Whole>(
        |x| x.psum::<Context>(),
        [b, h, s, d],
        [b, h, s, d],
    );
    let r = raw(
        |f, x| {
            let groups = vec![(0..N as i64).collect::<Vec<_>>()];
            f.all_reduce(x, Reducer::Sum, &groups, Grouping::FlattenedIds)
        },
        &X,
    );
    // One replicated cotangent.
    let c = cotangents(&X, 9).remove(0);
    let (gt, gr) = gradients(&t, &r, &vec![c; N]);
    for (t, r) in gt.iter().zip(&gr) {
        // z = psum(x)^2: the typed rule gives 2 psum(x) ct on each device (the identity
        // transpose); the op-level rule sums the N devices' copies of the cotangent.
        let scaled: Vec<f32> = t.data.iter().map(|v| v * N as f32).collect();
        assert_eq!(scaled, r.data);
    }
    let names: Vec<&str> = t
        .collectives()
        .iter()
        .map(|c| c.collective.name())
        .collect();
    assert_eq!(names, ["psum", "pvary"]);
}

#[test]
fn vary_then_psum_is_differentiated_consistently() {
    // psum(vary(x)) = N x for an invariant x: its gradient is N ct, through pvary's transpose
    // (a psum) after psum's (the identity).
    let (b, h, s, d) = (X[0] as i64, X[1] as i64, X[2] as i64, X[3] as i64);
    let mesh = Mesh::<Ring>::new([N]).unwrap();
    let program = Program::build("vary_psum", &mesh, |p| {
        let x = p.arg::<Whole>([b, h, s, d], DType::F32)?;
        let y = x.vary::<Context>()?.psum::<Context>()?;
        let ct = p.arg::<Whole>([b, h, s, d], DType::F32)?;
        let g = p.vjp(&[&y], &[&ct], &[&x])?;
        p.declare::<Whole, Invariant>(g[0])?.output::<Whole>()?;
        p.prune()
    })
    .unwrap();
    let mut rng = fastrand::Rng::with_seed(3);
    let (x, c) = (Arr::random(&X, &mut rng), Arr::random(&X, &mut rng));
    let inputs: Vec<Vec<HostBuffer>> = (0..N)
        .map(|_| vec![to_buffer(&x, DType::F32), to_buffer(&c, DType::F32)])
        .collect();
    let out = program.compile(&client(N)).unwrap().run(&inputs).unwrap();
    for o in out {
        let g = from_buffer(&o[0]);
        let want: Vec<f32> = c.data.iter().map(|v| v * N as f32).collect();
        assert_eq!(g.data, want);
    }
    let names: Vec<&str> = program
        .collectives()
        .iter()
        .map(|c| c.collective.name())
        .collect();
    // The forward pvary and psum are dead (the program returns only the gradient, which does
    // not need y) and pruned; the transposes remain: psum's (pvary), then pvary's (psum).
    assert_eq!(names, ["pvary", "psum"]);
}

#[test]
fn dead_forward_collectives_are_pruned() {
    // The gradient of y = all_to_all(x) * w w.r.t. w needs y but not a second, unused
    // all_gather of x.
    let (b, h, s, d) = (X[0] as i64, X[1] as i64, X[2] as i64, X[3] as i64);
    let n = N as i64;
    let mesh = Mesh::<Ring>::new([N]).unwrap();
    let program = Program::build("pruned", &mesh, |p| {
        let x = p.arg::<Seq>([b, h, s * n, d], DType::F32)?;
        let _unused = x.all_gather::<Context, 2>()?;
        let y = x.all_to_all::<Context, 1, 2>()?;
        let z = y.map_local(|f, y| Ok(f.exp(y)?))?;
        z.output::<Heads>()?;
        p.prune()
    })
    .unwrap();
    let text = program.to_mlir();
    assert!(!text.contains("stablehlo.all_gather"), "{text}");
    let names: Vec<&str> = program
        .collectives()
        .iter()
        .map(|c| c.collective.name())
        .collect();
    assert_eq!(names, ["all_to_all"]);
}

//! The transpose (VJP) rule of every collective, checked numerically on 4 devices (a 1-D mesh)
//! and on each axis of a 2 x 4 mesh: `sum_d <f(x)_d, y_d> == sum_d <x_d, f^T(y)_d>` for
//! random per-device `x`, `y` (small integers: every sum is exact).
//!
//! `psum`'s result and cotangent are replicated over the group: its left side counts each
//! group's value once (see `Collective`), and its transpose is the identity.

mod common;

use common::{client, from_buffer, to_buffer, Arr};
use tessera_collectives::prelude::*;
use tessera_collectives::{AxisGroups, Collective};
use tessera_hlo::{DType, Module, Sharding};
use tessera_runtime::HostBuffer;

mesh!(Ring = [Context]);
mesh!(DataContext = [Data, Context]);

/// Per-device local shape of `x`.
const X: [usize; 4] = [4, 8, 4, 3];

/// Builds `(f(x), f^T(y))` for per-device `x: X`, `y` of `f(x)`'s type, runs it, and returns
/// per device `(x, y, f(x), f^T(y))`.
fn run(
    c: &Collective,
    x_of: impl Fn(usize, &mut fastrand::Rng) -> Arr,
    y_of: impl Fn(usize, &[usize], &mut fastrand::Rng) -> Arr,
) -> Vec<[Arr; 4]> {
    let n = c.axis().num_devices();
    let mut m = Module::new("vjp");
    m.set_num_partitions(n as u32).unwrap();
    let mut f = m.func("main");
    let dims: Vec<i64> = X.iter().map(|&d| d as i64).collect();
    let x = f
        .arg_with_sharding(
            tessera_hlo::TensorType::new(dims, DType::F32),
            Sharding::Manual,
        )
        .unwrap();
    let fx = c.emit(&mut f, x).unwrap();
    let y_ty = f.value_type(fx).unwrap().clone();
    let y = f.arg_with_sharding(y_ty.clone(), Sharding::Manual).unwrap();
    let ft = c.emit_transpose(&mut f, y).unwrap();
    assert_eq!(
        f.value_type(ft).unwrap(),
        f.value_type(x).unwrap(),
        "{c}: f^T(y) has x's type"
    );
    f.finish_with_shardings(&[(fx, Some(Sharding::Manual)), (ft, Some(Sharding::Manual))])
        .unwrap();
    let y_dims: Vec<usize> = y_ty.dims.iter().map(|&d| d as usize).collect();
    let mut rng = fastrand::Rng::with_seed(7 + n as u64);
    let inputs: Vec<(Arr, Arr)> = (0..n)
        .map(|d| (x_of(d, &mut rng), y_of(d, &y_dims, &mut rng)))
        .collect();
    let per_device: Vec<Vec<HostBuffer>> = inputs
        .iter()
        .map(|(x, y)| vec![to_buffer(x, DType::F32), to_buffer(y, DType::F32)])
        .collect();
    let exe = client(n)
        .compile(
            &m.to_mlir(),
            &tessera_runtime::CompileOptions::manual_partitions(n).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{e}\n{}", m.to_mlir()));
    let out = exe.execute_host(&per_device).unwrap();
    inputs
        .into_iter()
        .zip(out)
        .map(|((x, y), o)| [x, y, from_buffer(&o[0]), from_buffer(&o[1])])
        .collect()
}

/// `<f(x), y> == <x, f^T(y)>`, both summed over devices.
fn check_linear(c: &Collective) {
    let r = run(
        c,
        |_, rng| Arr::random(&X, rng),
        |_, dims, rng| Arr::random(dims, rng),
    );
    let lhs: f64 = r.iter().map(|[_, y, fx, _]| fx.dot(y)).sum();
    let rhs: f64 = r.iter().map(|[x, _, _, ft]| x.dot(ft)).sum();
    assert_ne!(lhs, 0.0, "{c}: a degenerate test");
    assert_eq!(lhs, rhs, "{c}: <f(x), y> != <x, f^T(y)>");
}

/// One random array per group of `axis`, and a device's group.
fn per_group(axis: &AxisGroups, seed: u64) -> (Vec<Arr>, impl Fn(usize) -> usize + '_) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let arrays = (0..axis.groups().len())
        .map(|_| Arr::random(&X, &mut rng))
        .collect();
    let group_of = move |d: usize| {
        axis.groups()
            .iter()
            .position(|g| g.contains(&(d as i64)))
            .unwrap()
    };
    (arrays, group_of)
}

/// psum: its result and cotangent are replicated over the group, so the left side counts
/// each group once; the transpose is the identity.
fn check_psum(axis: &AxisGroups) {
    let c = Collective::Psum { axis: axis.clone() };
    let (ys, group_of) = per_group(axis, 99);
    let r = run(
        &c,
        |_, rng| Arr::random(&X, rng),
        |d, _, _| ys[group_of(d)].clone(),
    );
    let lhs: f64 = axis
        .groups()
        .iter()
        .map(|g| {
            let [_, y, fx, _] = &r[g[0] as usize];
            fx.dot(y)
        })
        .sum();
    let rhs: f64 = r.iter().map(|[x, _, _, ft]| x.dot(ft)).sum();
    assert_ne!(lhs, 0.0);
    assert_eq!(lhs, rhs, "psum over {}", axis.name());
    for [_, y, _, ft] in &r {
        assert_eq!(ft, y, "psum^T is the identity");
    }
}

/// pvary (the identity from replicated to varying): its operand is replicated over the
/// group, so the right side counts each group once; the transpose is psum.
fn check_pvary(axis: &AxisGroups) {
    let c = Collective::Pvary { axis: axis.clone() };
    let (xs, group_of) = per_group(axis, 98);
    let r = run(
        &c,
        |d, _| xs[group_of(d)].clone(),
        |_, dims, rng| Arr::random(dims, rng),
    );
    let lhs: f64 = r.iter().map(|[_, y, fx, _]| fx.dot(y)).sum();
    let rhs: f64 = axis
        .groups()
        .iter()
        .map(|g| {
            let [x, _, _, ft] = &r[g[0] as usize];
            x.dot(ft)
        })
        .sum();
    assert_ne!(lhs, 0.0);
    assert_eq!(lhs, rhs, "pvary over {}", axis.name());
}

fn every_rule(axis: AxisGroups) {
    let n = axis.size();
    let cases = [
        Collective::AllToAll {
            axis: axis.clone(),
            split_dim: 1,
            concat_dim: 2,
        },
        Collective::AllToAll {
            axis: axis.clone(),
            split_dim: 0,
            concat_dim: 3,
        },
        Collective::AllGather {
            axis: axis.clone(),
            dim: 2,
        },
        Collective::ReduceScatter {
            axis: axis.clone(),
            dim: 1,
        },
        Collective::ring_shift(axis.clone(), 1),
        Collective::ring_shift(axis.clone(), -1),
        Collective::Ppermute {
            axis: axis.clone(),
            pairs: vec![(0, n - 1)],
        },
    ];
    for c in &cases {
        check_linear(c);
    }
    check_psum(&axis);
    check_pvary(&axis);
}

#[test]
fn transposes_on_4_devices() {
    every_rule(Mesh::<Ring>::new([4]).unwrap().axis::<Context>());
}

#[test]
fn transposes_on_each_axis_of_a_2x4_mesh() {
    let mesh = Mesh::<DataContext>::new([2, 4]).unwrap();
    every_rule(mesh.axis::<Context>());
    every_rule(mesh.axis::<Data>());
}

/// The permutations' transposes are their inverses: `f^T(f(x)) == x`.
#[test]
fn permutation_transposes_invert() {
    let mesh = Mesh::<DataContext>::new([2, 4]).unwrap();
    for c in [
        Collective::AllToAll {
            axis: mesh.axis::<Context>(),
            split_dim: 1,
            concat_dim: 2,
        },
        Collective::ring_shift(mesh.axis::<Context>(), 1),
        Collective::ring_shift(mesh.axis::<Data>(), 1),
    ] {
        // Feed f(x) back as y: f^T(f(x)) must be x.
        let mut m = Module::new("inverse");
        m.set_num_partitions(8).unwrap();
        let mut f = m.func("main");
        let x = f
            .arg_with_sharding(
                tessera_hlo::TensorType::new([4, 8, 4, 3], DType::F32),
                Sharding::Manual,
            )
            .unwrap();
        let y = c.emit(&mut f, x).unwrap();
        let back = c.emit_transpose(&mut f, y).unwrap();
        f.finish_with_shardings(&[(back, Some(Sharding::Manual))])
            .unwrap();
        let exe = client(8)
            .compile(
                &m.to_mlir(),
                &tessera_runtime::CompileOptions::manual_partitions(8).unwrap(),
            )
            .unwrap();
        let mut rng = fastrand::Rng::with_seed(3);
        let xs: Vec<Arr> = (0..8).map(|_| Arr::random(&X, &mut rng)).collect();
        let inputs: Vec<Vec<HostBuffer>> =
            xs.iter().map(|x| vec![to_buffer(x, DType::F32)]).collect();
        let out = exe.execute_host(&inputs).unwrap();
        for (d, (o, x)) in out.iter().zip(&xs).enumerate() {
            assert_eq!(&from_buffer(&o[0]), x, "{c}: f^T(f(x)) on device {d}");
        }
    }
}

#[test]
fn transpose_table() {
    let axis = Mesh::<Ring>::new([4]).unwrap().axis::<Context>();
    let a2a = Collective::AllToAll {
        axis: axis.clone(),
        split_dim: 1,
        concat_dim: 2,
    };
    assert_eq!(
        a2a.transpose(),
        Collective::AllToAll {
            axis: axis.clone(),
            split_dim: 2,
            concat_dim: 1
        }
    );
    let ag = Collective::AllGather {
        axis: axis.clone(),
        dim: 2,
    };
    assert_eq!(
        ag.transpose(),
        Collective::ReduceScatter {
            axis: axis.clone(),
            dim: 2
        }
    );
    assert_eq!(ag.transpose().transpose(), ag);
    let psum = Collective::Psum { axis: axis.clone() };
    assert_eq!(psum.transpose(), Collective::Pvary { axis: axis.clone() });
    let pairs = |c: Collective| match c {
        Collective::Ppermute { mut pairs, .. } => {
            pairs.sort_unstable();
            pairs
        }
        other => panic!("{other}"),
    };
    assert_eq!(
        pairs(Collective::ring_shift(axis.clone(), 1).transpose()),
        pairs(Collective::ring_shift(axis, -1))
    );
}

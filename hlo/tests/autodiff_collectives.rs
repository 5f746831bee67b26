//! The collectives' transposes against finite differences on 4 CPU devices: each device
//! runs the program on its own values, and the function checked is
//! `sum over devices of <output, cotangent>` (see `fd/mod.rs`).

mod fd;

use fd::{check, uniform};
use tessera_hlo::{Grouping, HostArray, Reducer};

const DEVICES: usize = 4;

/// Per device, arrays of `shapes` (different values on every device).
fn inputs(shapes: &[&[usize]], seed: u64) -> Vec<Vec<HostArray>> {
    (0..DEVICES)
        .map(|d| {
            shapes
                .iter()
                .enumerate()
                .map(|(i, s)| uniform(s, -1.0, 1.0, seed + (10 * d + i) as u64))
                .collect()
        })
        .collect()
}

fn all() -> Vec<Vec<i64>> {
    vec![(0..DEVICES as i64).collect()]
}

#[test]
fn all_to_all_is_transposed_by_the_inverse_all_to_all() {
    // Ulysses' re-sharding [B, H, S/U, D] -> [B, H/U, S, D], through a nonlinearity.
    check(
        "stablehlo.all_to_all",
        &inputs(&[&[1, 4, 2, 3]], 1),
        &|f, a| {
            let y = f.all_to_all(a[0], 1, 2, &all(), Grouping::FlattenedIds)?;
            let y = f.sin(y)?;
            Ok(vec![y])
        },
    );
    // Two groups of two.
    check(
        "stablehlo.all_to_all (groups)",
        &inputs(&[&[4, 3]], 2),
        &|f, a| {
            let groups = vec![vec![0, 2], vec![1, 3]];
            let y = f.all_to_all(a[0], 0, 1, &groups, Grouping::CrossPartition)?;
            Ok(vec![f.exp(y)?])
        },
    );
}

#[test]
fn all_gather_and_reduce_scatter_transpose_each_other() {
    check("stablehlo.all_gather", &inputs(&[&[2, 3]], 3), &|f, a| {
        let y = f.all_gather(a[0], 0, &all(), Grouping::FlattenedIds)?;
        Ok(vec![f.tanh(y)?])
    });
    check(
        "stablehlo.reduce_scatter",
        &inputs(&[&[8, 3]], 4),
        &|f, a| {
            let y = f.reduce_scatter(a[0], 0, Reducer::Sum, &all(), Grouping::FlattenedIds)?;
            Ok(vec![f.tanh(y)?])
        },
    );
}

#[test]
fn collective_permute_is_transposed_by_the_reversed_pairs() {
    // A ring shift, and a partial permutation (devices 1 and 3 receive zeros, device 0 and 2
    // send nothing).
    check(
        "stablehlo.collective_permute (ring)",
        &inputs(&[&[3, 2]], 5),
        &|f, a| {
            let y = f.collective_permute(
                a[0],
                &[(0, 1), (1, 2), (2, 3), (3, 0)],
                Grouping::CrossPartition,
            )?;
            let y = f.mul(y, a[0])?;
            Ok(vec![y])
        },
    );
    check(
        "stablehlo.collective_permute (partial)",
        &inputs(&[&[3, 2]], 6),
        &|f, a| {
            let y = f.collective_permute(a[0], &[(1, 0), (3, 2)], Grouping::CrossPartition)?;
            let y = f.exp(y)?;
            Ok(vec![y])
        },
    );
}

#[test]
fn all_reduce_sum_is_its_own_transpose() {
    check("stablehlo.all_reduce", &inputs(&[&[5]], 7), &|f, a| {
        let y = f.all_reduce(a[0], Reducer::Sum, &all(), Grouping::FlattenedIds)?;
        let y = f.mul(y, a[0])?;
        Ok(vec![y])
    });
}

#[test]
fn a_chain_of_collectives_and_local_ops() {
    // Gather K along the sequence, attend-like contraction with the local queries, send the
    // result around the ring, all-to-all it.
    check(
        "collective chain",
        &inputs(&[&[2, 4], &[2, 4]], 8),
        &|f, a| {
            let (q, k) = (a[0], a[1]);
            let k = f.all_gather(k, 0, &all(), Grouping::FlattenedIds)?;
            let d = tessera_hlo::DotDims::contracting([1], [1]);
            let s = f.dot_general(q, k, &d, tessera_hlo::DType::F32, None)?;
            let s = f.exp(s)?;
            let s = f.collective_permute(
                s,
                &[(0, 3), (1, 0), (2, 1), (3, 2)],
                Grouping::CrossPartition,
            )?;
            let s = f.all_to_all(s, 1, 0, &all(), Grouping::CrossPartition)?;
            Ok(vec![s])
        },
    );
}

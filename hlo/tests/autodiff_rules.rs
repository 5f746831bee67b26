//! Every VJP rule against central finite differences in float64 on the XLA CPU plugin (see
//! `fd/mod.rs`), and its f32 program against the f64 one.

mod fd;

use fd::{check1, compile1, index, signed, uniform};
use tessera_hlo::{
    BinaryOp, DType, DotDims, FuncBuilder, HloError, HostArray, Reducer, TensorType, UnaryOp, Value,
};

fn sum_all(f: &mut FuncBuilder<'_>, x: Value) -> Result<Value, HloError> {
    let rank = f.value_type(x)?.rank() as i64;
    f.reduce(x, &(0..rank).collect::<Vec<_>>(), Reducer::Sum)
}

#[test]
fn unary_rules_match_finite_differences() {
    // Each op on a domain where it is smooth.
    let positive = [
        UnaryOp::Log,
        UnaryOp::Sqrt,
        UnaryOp::Rsqrt,
        UnaryOp::Cbrt,
        UnaryOp::Log1p,
    ];
    let anywhere = [
        UnaryOp::Neg,
        UnaryOp::Exp,
        UnaryOp::Expm1,
        UnaryOp::Tanh,
        UnaryOp::Logistic,
        UnaryOp::Sin,
        UnaryOp::Cos,
    ];
    for (i, u) in positive.iter().chain(&anywhere).enumerate() {
        let x = if positive.contains(u) {
            uniform(&[3, 5], 0.3, 2.0, i as u64)
        } else {
            uniform(&[3, 5], -2.0, 2.0, i as u64)
        };
        check1(u.op_name(), &[x], &|f, a| Ok(vec![f.unary(*u, a[0])?]));
    }
    // abs away from 0 (its kink).
    check1("stablehlo.abs", &[signed(&[4, 4], 0.2, 2.0, 3)], &|f, a| {
        Ok(vec![f.abs(a[0])?])
    });
}

#[test]
fn piecewise_constant_ops_have_no_cotangent() {
    // floor, sign, round: the gradient flows only through the smooth term.
    check1(
        "floor_sign_round",
        &[uniform(&[8], -3.0, 3.0, 5)],
        &|f, a| {
            let fl = f.floor(a[0])?;
            let s = f.sign(a[0])?;
            let r = f.round_nearest_even(a[0])?;
            let c = f.ceil(a[0])?;
            let t = f.mul(fl, a[0])?;
            let t = f.add(t, s)?;
            let t = f.add(t, r)?;
            let t = f.mul(t, c)?;
            Ok(vec![t])
        },
    );
}

#[test]
fn binary_rules_match_finite_differences() {
    type Range = (f64, f64);
    let cases: [(BinaryOp, Range, Range); 9] = [
        (BinaryOp::Add, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Sub, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Mul, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Div, (-2.0, 2.0), (0.5, 2.0)),
        (BinaryOp::Pow, (0.3, 2.0), (-1.5, 2.5)),
        (BinaryOp::Atan2, (-2.0, 2.0), (-2.0, 2.0)),
        // rem(a, b) = a - trunc(a/b) b, smooth away from multiples of b.
        (BinaryOp::Rem, (0.1, 0.9), (1.0, 1.5)),
        // max and min without ties (the two operands from disjoint ranges in places).
        (BinaryOp::Max, (-2.0, 2.0), (-2.0, 2.0)),
        (BinaryOp::Min, (-2.0, 2.0), (-2.0, 2.0)),
    ];
    for (i, (b, (l0, l1), (r0, r1))) in cases.into_iter().enumerate() {
        let s = 10 * i as u64;
        let lhs = uniform(&[2, 6], l0, l1, s);
        let rhs = uniform(&[2, 6], r0, r1, s + 1);
        check1(b.op_name(), &[lhs, rhs], &|f, a| {
            Ok(vec![f.binary(b, a[0], a[1])?])
        });
    }
    // rem with a negative dividend: trunc rounds towards zero.
    check1(
        "stablehlo.remainder (negative)",
        &[uniform(&[6], -3.4, -2.1, 9), uniform(&[6], 1.0, 1.2, 10)],
        &|f, a| Ok(vec![f.rem(a[0], a[1])?]),
    );
}

#[test]
fn fan_out_accumulates_cotangents() {
    // x used five times, y twice; z = x * x + sin(x) * x * y + y.
    check1(
        "fan_out",
        &[uniform(&[5], -1.0, 1.0, 1), uniform(&[5], -1.0, 1.0, 2)],
        &|f, a| {
            let (x, y) = (a[0], a[1]);
            let xx = f.mul(x, x)?;
            let s = f.sin(x)?;
            let sx = f.mul(s, x)?;
            let sxy = f.mul(sx, y)?;
            let z = f.add(xx, sxy)?;
            let z = f.add(z, y)?;
            let e = f.exp(x)?;
            Ok(vec![z, e])
        },
    );
}

#[test]
fn broadcasting_sums_the_cotangent_back() {
    // [3] -> [2, 3, 4] (dims added before and after), [3, 1] -> [3, 5] (a size-1 dim
    // expanded), a scalar to a matrix, and [4, 3] -> [3, 2, 4] (dims reordered).
    check1(
        "broadcast_in_dim",
        &[
            uniform(&[3], -1.0, 1.0, 1),
            uniform(&[3, 1], -1.0, 1.0, 2),
            uniform(&[], -1.0, 1.0, 3),
            uniform(&[4, 3], -1.0, 1.0, 4),
        ],
        &|f, a| {
            let b0 = f.broadcast_in_dim(a[0], &[2, 3, 4], &[1])?;
            let b1 = f.broadcast_in_dim(a[1], &[3, 5], &[0, 1])?;
            let b2 = f.broadcast(a[2], &[3, 5])?;
            let b3 = f.broadcast_in_dim(a[3], &[3, 2, 4], &[2, 0])?;
            let b1 = f.mul(b1, b2)?;
            let s = f.sin(b0)?;
            let c = f.cos(b3)?;
            Ok(vec![s, b1, c])
        },
    );
}

#[test]
fn reductions_match_finite_differences() {
    // Sums over some dims, with a non-zero init; max and min (no ties in random data).
    check1(
        "stablehlo.reduce (sum, max, min)",
        &[uniform(&[3, 4, 5], -2.0, 2.0, 1), uniform(&[], 0.5, 1.0, 2)],
        &|f, a| {
            let init = a[1];
            let s = f.reduce_with(&[a[0]], &[init], &[0, 2], |b, args| {
                Ok::<_, HloError>(vec![b.add(args[0], args[1])?])
            })?;
            let mx = f.reduce(a[0], &[1], Reducer::Max)?;
            let mn = f.reduce(a[0], &[0, 1, 2], Reducer::Min)?;
            let mx = f.exp(mx)?;
            Ok(vec![s[0], mx, mn])
        },
    );
}

#[test]
fn max_and_min_reductions_credit_a_winning_init_value() {
    // Rows 0 and 2 stay below the max's init 0.2 (and above the min's init -0.3): the init
    // wins there; in rows 1 and 3 an element does.
    let x = HostArray::from_f64(
        DType::F32,
        [4, 3],
        &[
            -0.1, 0.15, 0.05, 0.9, -0.8, 0.3, 0.1, -0.2, 0.0, -0.6, 0.7, 0.4,
        ],
    )
    .unwrap();
    check1(
        "stablehlo.reduce (max, min with inits)",
        &[x, uniform(&[], 0.2, 0.21, 6), uniform(&[], -0.31, -0.3, 7)],
        &|f, a| {
            let mx = f.reduce_with(&[a[0]], &[a[1]], &[1], |b, args| {
                Ok::<_, HloError>(vec![b.max(args[0], args[1])?])
            })?;
            let mn = f.reduce_with(&[a[0]], &[a[2]], &[1], |b, args| {
                Ok::<_, HloError>(vec![b.min(args[1], args[0])?])
            })?;
            Ok(vec![mx[0], mn[0]])
        },
    );
}

#[test]
fn dot_general_matches_finite_differences() {
    // matmul; batch dims in different places on each side; two contracting dims listed out
    // of order; an outer product (no contraction).
    check1(
        "stablehlo.dot_general (matmul)",
        &[
            uniform(&[3, 4], -1.0, 1.0, 1),
            uniform(&[4, 5], -1.0, 1.0, 2),
        ],
        &|f, a| Ok(vec![f.matmul(a[0], a[1], DType::F32)?]),
    );
    check1(
        "stablehlo.dot_general (batch)",
        &[
            uniform(&[2, 3, 4], -1.0, 1.0, 3),
            uniform(&[4, 5, 2], -1.0, 1.0, 4),
        ],
        &|f, a| {
            let d = DotDims::new([0], [2], [2], [0]);
            Ok(vec![f.dot_general(a[0], a[1], &d, DType::F32, None)?])
        },
    );
    check1(
        "stablehlo.dot_general (two contracting dims)",
        &[
            uniform(&[3, 2, 4, 5], -1.0, 1.0, 5),
            uniform(&[4, 6, 3, 2], -1.0, 1.0, 6),
        ],
        &|f, a| {
            // lhs dims 2 and 1 against rhs dims 0 and 3; batch lhs 0 with rhs 2.
            let d = DotDims::new([0], [2], [2, 1], [0, 3]);
            Ok(vec![f.dot_general(a[0], a[1], &d, DType::F32, None)?])
        },
    );
    check1(
        "stablehlo.dot_general (outer)",
        &[uniform(&[3], -1.0, 1.0, 7), uniform(&[2, 2], -1.0, 1.0, 8)],
        &|f, a| {
            let d = DotDims::new([], [], [], []);
            Ok(vec![f.dot_general(a[0], a[1], &d, DType::F32, None)?])
        },
    );
}

#[test]
fn shape_ops_match_finite_differences() {
    check1(
        "reshape, transpose, reverse, optimization_barrier",
        &[uniform(&[2, 3, 4], -1.0, 1.0, 1)],
        &|f, a| {
            let r = f.reshape(a[0], &[6, 4])?;
            let t = f.transpose(a[0], &[2, 0, 1])?;
            let v = f.reverse(a[0], &[0, 2])?;
            let r = f.sin(r)?;
            let b = f.optimization_barrier(v)?;
            let b = f.cos(b)?;
            Ok(vec![r, t, b])
        },
    );
    check1(
        "stablehlo.slice (strided)",
        &[uniform(&[7, 6], -1.0, 1.0, 2)],
        &|f, a| {
            let s = f.slice_strided(a[0], &[1, 0], &[7, 5], &[2, 3])?;
            let u = f.slice(a[0], &[2, 1], &[4, 6])?;
            let s = f.exp(s)?;
            Ok(vec![s, u])
        },
    );
    check1(
        "stablehlo.pad (negative edges, interior)",
        &[uniform(&[4, 5], -1.0, 1.0, 3), uniform(&[], -1.0, 1.0, 4)],
        &|f, a| {
            let p = f.pad(a[0], a[1], &[2, -1], &[-1, 3], &[1, 2])?;
            let p = f.tanh(p)?;
            Ok(vec![p])
        },
    );
    check1(
        "stablehlo.concatenate",
        &[
            uniform(&[2, 3], -1.0, 1.0, 5),
            uniform(&[2, 1], -1.0, 1.0, 6),
            uniform(&[2, 4], -1.0, 1.0, 7),
        ],
        &|f, a| {
            let c = f.concatenate(&[a[0], a[1], a[2], a[0]], 1)?;
            Ok(vec![f.sin(c)?])
        },
    );
}

#[test]
fn dynamic_slices_match_finite_differences() {
    // Run-time starts, one of them clamped (start 5 of 6 with a window of 3 starts at 3).
    check1(
        "stablehlo.dynamic_slice / dynamic_update_slice",
        &[
            uniform(&[4, 6], -1.0, 1.0, 1),
            uniform(&[2, 3], -1.0, 1.0, 2),
            index(1),
            index(5),
        ],
        &|f, a| {
            let (x, u, i, j) = (a[0], a[1], a[2], a[3]);
            let s = f.dynamic_slice(x, &[i, j], &[2, 3])?;
            let s = f.sin(s)?;
            let w = f.dynamic_update_slice(x, u, &[i, j])?;
            let w = f.exp(w)?;
            Ok(vec![s, w])
        },
    );
}

#[test]
fn row_gathers_and_scatters_match_finite_differences() {
    // Repeated rows (their cotangents add up), and one index out of range each way: gather
    // clamps it (-1 reads row 0, 9 reads row 4), scatter skips it.
    let rows = || HostArray::i32(vec![6], vec![3, 1, 3, -1, 9, 0]).unwrap();
    check1(
        "stablehlo.gather / scatter (rows)",
        &[
            uniform(&[5, 2, 3], -1.0, 1.0, 1),
            rows(),
            uniform(&[6, 2, 3], -1.0, 1.0, 2),
            uniform(&[5], -1.0, 1.0, 3),
        ],
        &|f, a| {
            let (table, ids, updates, vector) = (a[0], a[1], a[2], a[3]);
            let picked = f.gather_rows(table, ids)?;
            let picked = f.sin(picked)?;
            let scattered = f.scatter_add_rows(table, ids, updates)?;
            let scattered = f.exp(scattered)?;
            // Rows of a vector are its elements.
            let elements = f.gather_rows(vector, ids)?;
            let elements = f.tanh(elements)?;
            Ok(vec![picked, scattered, elements])
        },
    );
}

#[test]
fn select_clamp_and_masks_match_finite_differences() {
    check1(
        "stablehlo.select",
        &[
            uniform(&[3, 4], -1.0, 1.0, 1),
            uniform(&[3, 4], -1.0, 1.0, 2),
        ],
        &|f, a| {
            // An iota mask (no cotangent flows into it) and a data-dependent one.
            let t = TensorType::new([3, 4], DType::I32);
            let r = f.iota(t.clone(), 0)?;
            let c = f.iota(t, 1)?;
            let below = f.le(c, r)?;
            let s = f.select(below, a[0], a[1])?;
            let gt = f.gt(a[0], a[1])?;
            let m = f.select(gt, a[0], s)?;
            let one = f.scalar(1.0, DType::Bool)?;
            let whole = f.select(one, m, a[1])?;
            Ok(vec![f.exp(whole)?])
        },
    );
    // Values away from the bounds; array bounds and scalar bounds (summed).
    check1(
        "stablehlo.clamp",
        &[
            HostArray::from_f64(DType::F32, [6], &[-2.0, -0.3, 0.1, 0.4, 1.7, 3.0]).unwrap(),
            uniform(&[6], -1.0, -0.5, 2),
            uniform(&[], 1.0, 1.5, 3),
        ],
        &|f, a| Ok(vec![f.clamp(a[1], a[0], a[2])?]),
    );
    // Integer arithmetic between float ops: the float path is differentiated, the integers
    // are not (convert int -> float has no cotangent).
    check1("integer path", &[uniform(&[5], 0.5, 4.5, 4)], &|f, a| {
        let i = f.convert(a[0], DType::I32)?;
        let two = f.splat(2.0, TensorType::new([5], DType::I32))?;
        let i = f.mul(i, two)?;
        let back = f.convert(i, DType::F32)?;
        Ok(vec![f.mul(back, a[0])?])
    });
}

#[test]
fn convert_to_bf16_and_back_passes_the_cotangent_through() {
    // Rounding is piecewise constant, so the finite difference is taken where it is the
    // identity: bf16-exact inputs moved by bf16-exact steps (h = 2^-4 along 0/±1 directions
    // lands on bf16 values), `L = <convert(convert(x, bf16), f32), c>`.
    let x = HostArray::from_f64(DType::F32, [4], &[0.5, -1.25, 2.0, 0.75]).unwrap();
    let mut m = tessera_hlo::Module::new("convert");
    let mut f = m.func("main");
    let a = f.arg(TensorType::new([4], DType::F32)).unwrap();
    let ct = f.arg(TensorType::new([4], DType::F32)).unwrap();
    let b = f.convert(a, DType::BF16).unwrap();
    let y = f.convert(b, DType::F32).unwrap();
    let g = f.vjp(&[y], &[ct], &[a]).unwrap();
    f.finish(&[y, g[0]]).unwrap();
    let text = m.to_mlir();
    // The backward converts the cotangent to bf16 and back: exactly the identity on bf16
    // values.
    assert!(text.contains("stablehlo.convert"), "{text}");
    let exe = compile1(&m);
    let run = |x: &HostArray, c: &HostArray| {
        let out = exe.execute_arrays(&[vec![x.clone(), c.clone()]]).unwrap();
        (out[0][0].to_f64_vec(), out[0][1].to_f64_vec())
    };
    let c = HostArray::from_f64(DType::F32, [4], &[0.25, -1.0, 0.5, 2.0]).unwrap();
    let (_, g) = run(&x, &c);
    assert_eq!(g, c.to_f64_vec());
    let h = 0.0625;
    let u = [1.0, 0.0, -1.0, 1.0];
    let loss = |sign: f64| {
        let xs: Vec<f64> = x
            .to_f64_vec()
            .iter()
            .zip(u)
            .map(|(v, d)| v + sign * h * d)
            .collect();
        let xs = HostArray::from_f64(DType::F32, [4], &xs).unwrap();
        let (y, _) = run(&xs, &c);
        y.iter()
            .zip(c.to_f64_vec())
            .map(|(a, b)| a * b)
            .sum::<f64>()
    };
    let fd = (loss(1.0) - loss(-1.0)) / (2.0 * h);
    let analytic: f64 = g.iter().zip(u).map(|(a, b)| a * b).sum();
    assert_eq!(fd, analytic);
}

#[test]
fn reduce_max_splits_ties_evenly() {
    // Row 0 has its max twice, row 1 three times, row 2 once: the cotangent 1 of each row's
    // max goes 1/2, 1/3 and 1 to the positions holding it.
    let x = HostArray::from_f64(
        DType::F32,
        [3, 4],
        &[2.0, 5.0, 5.0, 1.0, 7.0, 7.0, 0.0, 7.0, -1.0, 3.0, -4.0, 2.5],
    )
    .unwrap();
    let mut m = tessera_hlo::Module::new("ties");
    let mut f = m.func("main");
    let a = f.arg(TensorType::new([3, 4], DType::F32)).unwrap();
    let b = f.arg(TensorType::new([3, 4], DType::F32)).unwrap();
    let mx = f.reduce(a, &[1], Reducer::Max).unwrap();
    let s = sum_all(&mut f, mx).unwrap();
    let g = f.grad(s, &[a]).unwrap();
    // Binary max: a tie gives each side half.
    let bm = f.max(a, b).unwrap();
    let bs = sum_all(&mut f, bm).unwrap();
    let gb = f.grad(bs, &[a, b]).unwrap();
    f.finish(&[g[0], gb[0], gb[1]]).unwrap();
    let exe = compile1(&m);
    let other = HostArray::from_f64(
        DType::F32,
        [3, 4],
        &[2.0, 6.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    )
    .unwrap();
    let out = exe.execute_arrays(&[vec![x, other]]).unwrap();
    let third = 1.0 / 3.0f32 as f64;
    let got = out[0][0].to_f64_vec();
    let want = [
        0.0, 0.5, 0.5, 0.0, third, third, 0.0, third, 0.0, 1.0, 0.0, 0.0,
    ];
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?}");
    }
    let ga = out[0][1].to_f64_vec();
    let gb = out[0][2].to_f64_vec();
    assert_eq!(&ga[..4], &[0.5, 0.0, 1.0, 0.5]);
    assert_eq!(&gb[..4], &[0.5, 1.0, 0.0, 0.5]);
}

//! The autodiff API: custom VJPs (checked against finite differences), the errors for ops
//! without a rule, dead code, unused arguments, determinism and the backward's size.

mod fd;

use std::rc::Rc;

use fd::{check1, compile1, uniform, Doublings};
use tessera_hlo::{CustomCall, DType, FuncBuilder, HloError, Module, Reducer, TensorType, Value};

fn f32t(dims: &[i64]) -> TensorType {
    TensorType::new(dims.to_vec(), DType::F32)
}

/// The loop of [`Doublings`], inline.
fn doubling_loop(f: &mut FuncBuilder<'_>, x: Value, n: u32) -> Result<Value, HloError> {
    let lo = f.scalar(0.0, DType::I32)?;
    let hi = f.scalar(f64::from(n), DType::I32)?;
    let out = f.fori_loop(lo, hi, &[x], |b, _, c| -> Result<Vec<Value>, HloError> {
        Ok(vec![b.add(c[0], c[0])?])
    })?;
    Ok(out[0])
}

#[test]
fn a_custom_vjp_replaces_the_loop_it_wraps() {
    let m = check1(
        "custom_vjp (while loop)",
        &[uniform(&[4], -1.0, 1.0, 1)],
        &|f, a| {
            let s = f.sin(a[0])?;
            let y = f.custom_vjp(Rc::new(Doublings(3)), &[s], |f, x| {
                Ok::<_, HloError>(vec![doubling_loop(f, x[0], 3)?])
            })?;
            Ok(vec![f.mul(y[0], a[0])?])
        },
    );
    assert!(m.fd_rel_err < 1e-8);
}

#[test]
fn a_loop_with_a_run_time_bound_is_an_error_naming_it_and_the_fix() {
    // Counted loops with constant bounds are differentiated (autodiff_loops.rs); a run-time
    // trip count is not.
    let mut m = Module::new("loop");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let n = f.arg(TensorType::scalar(DType::I32)).unwrap();
    let lo = f.scalar(0.0, DType::I32).unwrap();
    let y = f
        .fori_loop(lo, n, &[x], |b, _, c| -> Result<Vec<Value>, HloError> {
            Ok(vec![b.add(c[0], c[0])?])
        })
        .unwrap();
    let s = f.reduce(y[0], &[0], Reducer::Sum).unwrap();
    let e = f.grad(s, &[x]).unwrap_err();
    assert_eq!(e.op(), "stablehlo.while");
    let msg = e.to_string();
    assert!(msg.starts_with("stablehlo.while: no VJP rule"), "{msg}");
    assert!(msg.contains("FuncBuilder::custom_vjp"), "{msg}");
}

#[test]
fn ops_off_the_path_need_no_rule() {
    // A loop over a constant and a custom call whose result is unused do not stand between
    // x and the loss.
    let mut m = Module::new("off_path");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let c = f.splat(1.0, f32t(&[4])).unwrap();
    let looped = doubling_loop(&mut f, c, 2).unwrap();
    f.custom_call(CustomCall::new("opaque"), &[x], &[f32t(&[4])])
        .unwrap();
    let y = f.mul(x, looped).unwrap();
    let s = f.reduce(y, &[0], Reducer::Sum).unwrap();
    let g = f.grad(s, &[x]).unwrap();
    f.finish(&[g[0]]).unwrap();
}

#[test]
fn ops_without_a_rule_name_themselves() {
    type Build = dyn Fn(&mut FuncBuilder<'_>, Value) -> Result<Value, HloError>;
    let cases: [(&str, &Build); 4] = [
        ("stablehlo.custom_call", &|f, x| {
            Ok(f.custom_call(CustomCall::new("my_kernel"), &[x], &[f32t(&[4])])?[0])
        }),
        ("stablehlo.if", &|f, x| {
            let p = f.scalar(1.0, DType::Bool)?;
            Ok(f.if_else(
                p,
                |b| Ok::<_, HloError>(vec![b.exp(x)?]),
                |b| Ok(vec![b.sin(x)?]),
            )?[0])
        }),
        ("stablehlo.case", &|f, x| {
            let i = f.scalar(0.0, DType::I32)?;
            Ok(f.case(i, 2, |b, _| Ok::<_, HloError>(vec![b.exp(x)?]))?[0])
        }),
        ("stablehlo.reduce", &|f, x| f.reduce(x, &[0], Reducer::Prod)),
    ];
    for (op, build) in cases {
        let mut m = Module::new("no_rule");
        let mut f = m.func("main");
        let x = f.arg(f32t(&[4])).unwrap();
        let y = build(&mut f, x).unwrap();
        let t = f.value_type(y).unwrap().clone();
        let ct = f.arg(t).unwrap();
        let e = f.vjp(&[y], &[ct], &[x]).unwrap_err();
        assert_eq!(e.op(), op, "{e}");
        assert!(e.to_string().contains("custom_vjp"), "{e}");
    }
    // A call: the callee is opaque.
    let mut m = Module::new("call");
    let mut g = m.func("inner");
    g.set_public(false);
    let a = g.arg(f32t(&[4])).unwrap();
    let b = g.exp(a).unwrap();
    g.finish(&[b]).unwrap();
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let y = f.call("inner", &[x]).unwrap();
    let ct = f.arg(f32t(&[4])).unwrap();
    let e = f.vjp(&y, &[ct], &[x]).unwrap_err();
    assert_eq!(e.op(), "func.call");
    assert!(e.to_string().contains("@inner"), "{e}");
}

#[test]
fn a_custom_vjp_body_must_take_what_it_differentiates_as_inputs() {
    let mut m = Module::new("capture");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let w = f.arg(f32t(&[4])).unwrap();
    // The body multiplies by `w`, which is not an input.
    let y = f
        .custom_vjp(Rc::new(Doublings(0)), &[x], |f, i| {
            Ok::<_, HloError>(vec![f.mul(i[0], w)?])
        })
        .unwrap();
    let ct = f.arg(f32t(&[4])).unwrap();
    let e = f.vjp(&y, &[ct], &[x, w]).unwrap_err();
    assert_eq!(e.op(), "custom_vjp");
    assert!(e.to_string().contains("`doublings`"), "{e}");
    assert!(e.to_string().contains("pass it as an input"), "{e}");
    // Differentiating with respect to x only is fine: w is a constant then.
    f.vjp(&y, &[ct], &[x]).unwrap();
    // An output that is an input is refused when the unit is built.
    let e = f
        .custom_vjp(Rc::new(Doublings(0)), &[x], |_, i| {
            Ok::<_, HloError>(vec![i[0]])
        })
        .unwrap_err();
    assert!(e.to_string().contains("not computed by the body"), "{e}");
}

#[test]
fn misuse_is_named() {
    let mut m = Module::new("misuse");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let i = f.arg(TensorType::new([4], DType::I32)).unwrap();
    let y = f.exp(x).unwrap();
    let bad_ct = f.arg(f32t(&[3])).unwrap();
    let e = f.vjp(&[y], &[bad_ct], &[x]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("autodiff: cotangent #0 is tensor<3xf32>"),
        "{e}"
    );
    let ct = f.arg(f32t(&[4])).unwrap();
    let e = f.vjp(&[y], &[ct], &[i]).unwrap_err();
    assert!(
        e.to_string()
            .contains("wrt value #0 (tensor<4xi32>) is not a float"),
        "{e}"
    );
    let e = f.vjp(&[y], &[], &[x]).unwrap_err();
    assert!(e.to_string().contains("1 outputs but 0 cotangents"), "{e}");
    let e = f.grad(y, &[x]).unwrap_err();
    assert!(
        e.to_string().contains("grad needs a float scalar loss"),
        "{e}"
    );
}

/// The ops of a printed module (one per line with a result or a terminator-free call).
fn op_count(text: &str) -> usize {
    text.lines()
        .filter(|l| l.contains(" = \"stablehlo.") || l.contains(" = \"func.call"))
        .count()
}

#[test]
fn an_unused_argument_gets_zeros_and_dead_code_stays_out() {
    let build = |grad: bool, prune: bool| {
        let mut m = Module::new("unused");
        let mut f = m.func("main");
        let x = f.arg(f32t(&[4])).unwrap();
        let unused = f.arg(f32t(&[2, 2])).unwrap();
        // Dead forward code: computed, never used.
        let dead = f.tanh(x).unwrap();
        let _ = f.exp(dead).unwrap();
        let y = f.sin(x).unwrap();
        let s = f.reduce(y, &[0], Reducer::Sum).unwrap();
        let mut results = vec![s];
        if grad {
            results.extend(f.grad(s, &[x, unused]).unwrap());
        }
        if prune {
            let removed = f.prune(&results);
            assert_eq!(removed.len(), 2, "tanh and exp are dead");
        }
        f.finish(&results).unwrap();
        m.to_mlir()
    };
    let forward = op_count(&build(false, false));
    let text = build(true, false);
    // The seed, its broadcast, cos(x), the product and the zeros for `unused`: nothing for
    // the dead tanh and exp.
    assert_eq!(op_count(&text) - forward, 5, "{text}");
    assert!(text.contains("dense<0.0> : tensor<2x2xf32>"), "{text}");
    let pruned = build(true, true);
    assert!(!pruned.contains("stablehlo.tanh"), "{pruned}");
    assert_eq!(op_count(&pruned), op_count(&text) - 2);
}

#[test]
fn prune_keeps_side_effects_and_whole_custom_vjp_units() {
    let mut m = Module::new("prune");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let mut effect = CustomCall::new("print");
    effect.has_side_effect = true;
    f.custom_call(effect, &[x], &[]).unwrap();
    // A unit with two outputs of which only the first is used: the second stays (the rule
    // may read it).
    let outs = f
        .custom_vjp(Rc::new(Doublings(0)), &[x], |f, i| {
            Ok::<_, HloError>(vec![f.exp(i[0])?, f.log(i[0])?])
        })
        .unwrap();
    let removed = f.prune(&[outs[0]]);
    assert!(removed.is_empty(), "{removed:?}");
    f.finish(&[outs[0]]).unwrap();
    let text = m.to_mlir();
    assert!(
        text.contains("stablehlo.log") && text.contains("call_target_name = \"print\""),
        "{text}"
    );
}

#[test]
fn the_backward_is_deterministic_and_linear_in_the_forward() {
    let build = |n: usize, grad: bool| {
        let mut m = Module::new("chain");
        let mut f = m.func("main");
        let x = f.arg(f32t(&[8])).unwrap();
        let mut y = x;
        // Every step uses y three times: naive symbolic differentiation would blow up.
        for _ in 0..n {
            let yy = f.mul(y, y).unwrap();
            let s = f.sin(y).unwrap();
            let t = f.add(yy, s).unwrap();
            y = f.add(t, y).unwrap();
        }
        let s = f.reduce(y, &[0], Reducer::Sum).unwrap();
        let results = if grad {
            f.grad(s, &[x]).unwrap()
        } else {
            vec![s]
        };
        f.finish(&results).unwrap();
        m.to_mlir()
    };
    let a = build(50, true);
    assert_eq!(
        a,
        build(50, true),
        "the same program twice gives the same text"
    );
    let backward = |n| op_count(&build(n, true)) - op_count(&build(n, false));
    let (b50, b100) = (backward(50), backward(100));
    // Each step's backward: y's three uses (2 for y*y, cos and the product for sin, the
    // pass-through) summed: a fixed number of ops per step.
    assert_eq!(b100 - b50, b50 - backward(0), "{b50} -> {b100}");
    assert!(b100 <= 10 * 100, "{b100} backward ops for 100 steps");
}

#[test]
fn grad_through_a_reduction_and_matmul_runs() {
    // A small least-squares loss: d/dw sum((x w - t)^2) = 2 x^T (x w - t).
    let mut m = Module::new("lsq");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[3, 2])).unwrap();
    let w = f.arg(f32t(&[2, 1])).unwrap();
    let t = f.arg(f32t(&[3, 1])).unwrap();
    let p = f.matmul(x, w, DType::F32).unwrap();
    let r = f.sub(p, t).unwrap();
    let r2 = f.mul(r, r).unwrap();
    let loss = f.reduce(r2, &[0, 1], Reducer::Sum).unwrap();
    let g = f.grad(loss, &[w]).unwrap();
    f.finish(&[loss, g[0]]).unwrap();
    let exe = compile1(&m);
    let h = |shape: &[usize], v: &[f64]| {
        tessera_hlo::HostArray::from_f64(DType::F32, shape.to_vec(), v).unwrap()
    };
    let out = exe
        .execute_arrays(&[vec![
            h(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            h(&[2, 1], &[0.5, -1.0]),
            h(&[3, 1], &[1.0, 0.0, -1.0]),
        ]])
        .unwrap();
    // x w = [-1.5, -2.5, -3.5], r = [-2.5, -2.5, -2.5]; 2 x^T r = -5 [1 + 3 + 5, 2 + 4 + 6].
    assert_eq!(out[0][1].to_f64_vec(), vec![-45.0, -60.0]);
    assert_eq!(out[0][0].to_f64_vec(), vec![3.0 * 2.5 * 2.5]);
}

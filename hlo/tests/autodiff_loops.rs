//! Reverse-mode autodiff through counted loops (`FuncBuilder::scan`, `fori_loop` with constant
//! bounds): finite differences in f64, exact agreement with the unrolled program, a
//! collective in the body, the errors for other loops and the backward's size.

mod fd;

use std::rc::Rc;

use fd::{check, check1, program, signed, to_f64_text, uniform, values, Doublings};
use tessera_hlo::autodiff::{VjpCall, VjpRule};
use tessera_hlo::{
    DType, DotDims, FuncBuilder, Grouping, HloError, HostArray, Module, Reducer, TensorType, Value,
};
use tessera_runtime::{Client, CompileOptions, HostBuffer};

const D: usize = 3;

fn f32t(dims: &[i64]) -> TensorType {
    TensorType::new(dims.to_vec(), DType::F32)
}

/// Layer `i` of a stacked `[N, rows...]` array, read with `dynamic_slice` at `i`.
fn layer(f: &mut FuncBuilder<'_>, stack: Value, i: Value) -> Result<Value, HloError> {
    let t = f.value_type(stack)?.clone();
    let zero = f.scalar(0.0, DType::I32)?;
    let mut starts = vec![zero; t.rank()];
    starts[0] = i;
    let mut sizes = t.dims.clone();
    sizes[0] = 1;
    let s = f.dynamic_slice(stack, &starts, &sizes)?;
    f.reshape(s, &t.dims[1..])
}

/// One RNN step `tanh(w h + x)`.
fn step(f: &mut FuncBuilder<'_>, w: Value, h: Value, x: Value) -> Result<Value, HloError> {
    let wh = f.dot_general(w, h, &DotDims::contracting([1], [0]), DType::F32, None)?;
    let pre = f.add(wh, x)?;
    f.tanh(pre)
}

/// The RNN as a scan: `args = [h0 [D], w [N, D, D], x [N, D]]`, returns the final state and
/// every state stacked; `w` is captured and read at the counter, `x` is a scanned input.
fn rnn_scan(f: &mut FuncBuilder<'_>, a: &[Value]) -> Result<Vec<Value>, HloError> {
    let n = f.value_type(a[1])?.dims[0] as usize;
    let (h0, w, x) = (a[0], a[1], a[2]);
    let out = f.scan(n, &[h0], &[x], |f, i, carry, xs| {
        let wi = layer(f, w, i)?;
        let h = step(f, wi, carry[0], xs[0])?;
        Ok::<_, HloError>((vec![h], vec![h]))
    })?;
    Ok(vec![out.carry[0], out.ys[0]])
}

/// The same computation unrolled: `N` copies of the step, layers read at constant indices.
fn rnn_unrolled(f: &mut FuncBuilder<'_>, a: &[Value]) -> Result<Vec<Value>, HloError> {
    let n = f.value_type(a[1])?.dims[0] as usize;
    let (mut h, w, x) = (a[0], a[1], a[2]);
    let mut rows = Vec::with_capacity(n);
    for i in 0..n {
        let idx = f.scalar(i as f64, DType::I32)?;
        let wi = layer(f, w, idx)?;
        let xi = layer(f, x, idx)?;
        h = step(f, wi, h, xi)?;
        rows.push(f.reshape(h, &[1, D as i64])?);
    }
    let ys = f.concatenate(&rows, 0)?;
    Ok(vec![h, ys])
}

fn rnn_inputs(n: usize, seed: u64) -> Vec<HostArray> {
    vec![
        uniform(&[D], -1.0, 1.0, seed),
        uniform(&[n, D, D], -0.8, 0.8, seed + 1),
        uniform(&[n, D], -1.0, 1.0, seed + 2),
    ]
}

#[test]
fn an_rnn_scan_matches_finite_differences() {
    for n in [1, 4] {
        let m = check1(
            &format!("rnn scan N={n}"),
            &rnn_inputs(n, 10 + n as u64),
            &|f, a| rnn_scan(f, a),
        );
        assert!(m.fd_rel_err < 1e-8, "{m:?}");
    }
}

/// Runs the f64 form of a one-device module on f64 arguments; returns its results.
fn run_f64(m: &Module, args: &[(Vec<i64>, Vec<f64>)]) -> Vec<Vec<f64>> {
    let client = Client::cpu_shared(1).unwrap();
    let exe = client
        .compile(&to_f64_text(&m.to_mlir()), &CompileOptions::single_device())
        .unwrap();
    let buffers: Vec<HostBuffer> = args
        .iter()
        .map(|(dims, v)| HostBuffer::from_slice(dims, v).unwrap())
        .collect();
    exe.execute_host(&[buffers]).unwrap()[0]
        .iter()
        .map(fd::buffer_values)
        .collect()
}

/// Runs the f64 gradient programs of `scan` and `unrolled` (outputs: the final `[D]` state
/// and the `[steps, D]` stacked states) on `inputs` and the same cotangents, and checks that
/// they agree to 1e-12 of each gradient's largest element (none all but zero).
fn assert_scan_equals_unrolled(
    what: &str,
    inputs: &[HostArray],
    steps: usize,
    seed: u64,
    scan: fd::Forward<'_>,
    unrolled: fd::Forward<'_>,
) {
    let types: Vec<TensorType> = inputs.iter().map(fd::type_of).collect();
    let scan = program("scan", 1, &types, scan, true).unwrap();
    let unrolled = program("unrolled", 1, &types, unrolled, true).unwrap();
    let mut args: Vec<(Vec<i64>, Vec<f64>)> = inputs
        .iter()
        .map(|a| (fd::type_of(a).dims, a.to_f64_vec()))
        .collect();
    // Cotangents of the final state and of the stacked states.
    args.push((vec![D as i64], values(D, -1.0, 1.0, seed)));
    args.push((
        vec![steps as i64, D as i64],
        values(steps * D, -1.0, 1.0, seed + 1),
    ));
    let (g_scan, g_unrolled) = (run_f64(&scan, &args), run_f64(&unrolled, &args));
    assert_eq!(g_scan.len(), inputs.len());
    let mut worst = 0f64;
    for (k, (a, b)) in g_scan.iter().zip(&g_unrolled).enumerate() {
        let scale = b.iter().fold(0f64, |m, v| m.max(v.abs()));
        assert!(scale > 1e-3, "{what}: gradient #{k} is all but zero: {b:?}");
        for (x, y) in a.iter().zip(b) {
            worst = worst.max((x - y).abs() / scale);
        }
    }
    println!("{what}: scan vs unrolled: largest relative difference {worst:.2e}");
    assert!(
        worst <= 1e-12,
        "{what}: scan and unrolled gradients differ by {worst:e}"
    );
}

#[test]
fn the_scan_gradient_equals_the_unrolled_gradient() {
    let n = 5;
    assert_scan_equals_unrolled(
        "rnn",
        &rnn_inputs(n, 40),
        n,
        7,
        &|f, a| rnn_scan(f, a),
        &|f, a| rnn_unrolled(f, a),
    );
}

/// The RNN with its last step after the loop (the loop runs `N - 1` steps), as the train
/// step runs its last layer: the step after the loop reads its row of `w` at a constant.
fn rnn_scan_then_last(f: &mut FuncBuilder<'_>, a: &[Value]) -> Result<Vec<Value>, HloError> {
    let n = f.value_type(a[1])?.dims[0] as usize;
    let (h0, w, x) = (a[0], a[1], a[2]);
    let out = f.scan(n - 1, &[h0], &[], |f, i, carry, _| {
        let wi = layer(f, w, i)?;
        let xi = layer(f, x, i)?;
        let h = step(f, wi, carry[0], xi)?;
        Ok::<_, HloError>((vec![h], vec![h]))
    })?;
    let last = f.scalar((n - 1) as f64, DType::I32)?;
    let (w_last, x_last) = (layer(f, w, last)?, layer(f, x, last)?);
    let h = step(f, w_last, out.carry[0], x_last)?;
    let h_row = f.reshape(h, &[1, D as i64])?;
    let ys = f.concatenate(&[out.ys[0], h_row], 0)?;
    Ok(vec![h, ys])
}

#[test]
fn a_row_read_after_the_loop_adds_into_the_loop_s_gradient_by_its_window() {
    let n = 5;
    assert_scan_equals_unrolled(
        "rnn, last step after the loop",
        &rnn_inputs(n, 41),
        n,
        8,
        &|f, a| rnn_scan_then_last(f, a),
        &|f, a| rnn_unrolled(f, a),
    );
    // The last row's cotangent is added into that row of the loop's accumulated stack, not
    // as a whole zero stack with one row written: no add anywhere is the stack's size.
    let types = [
        f32t(&[D as i64]),
        f32t(&[n as i64, D as i64, D as i64]),
        f32t(&[n as i64, D as i64]),
    ];
    let text = program("after", 1, &types, &|f, a| rnn_scan_then_last(f, a), true)
        .unwrap()
        .to_mlir();
    let whole_stack_add = format!("-> tensor<{n}x{D}x{D}xf32>");
    let adds: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("stablehlo.add") && l.contains(&whole_stack_add))
        .collect();
    assert!(adds.is_empty(), "whole-stack adds: {adds:#?}");
    assert!(
        text.contains(&format!("(tensor<1x{D}x{D}xf32>, tensor<1x{D}x{D}xf32>)")),
        "no row-sized add in {text}"
    );
}

#[test]
fn a_fori_loop_with_constant_bounds_and_an_offset_counter() {
    // for i in 2..5: c = c * w + sin(i), with a carried loop-invariant scale `s`.
    let m = check1(
        "fori_loop 2..5",
        &[uniform(&[4], -1.0, 1.0, 50), uniform(&[4], 0.5, 1.2, 51)],
        &|f, a| {
            let lo = f.scalar(2.0, DType::I32)?;
            let hi = f.scalar(5.0, DType::I32)?;
            let s = f.exp(a[1])?;
            let out = f.fori_loop(lo, hi, &[a[0], s], |b, i, c| -> Result<_, HloError> {
                let fi = b.convert(i, DType::F32)?;
                let t = b.value_type(c[0])?.clone();
                let fi = b.broadcast_in_dim(fi, &t.dims, &[])?;
                let sfi = b.sin(fi)?;
                let cw = b.mul(c[0], c[1])?;
                let cw = b.tanh(cw)?;
                Ok(vec![b.add(cw, sfi)?, c[1]])
            })?;
            Ok(vec![out[0], out[1]])
        },
    );
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
}

/// `h = tanh(all_reduce_sum(w_i h) + x_i)` as an `n`-step scan on two manual partitions
/// (each device its own `w`), the all-reduce's result kept for the backward when `keep`.
fn all_reduce_rnn(
    n: usize,
    keep: bool,
) -> impl Fn(&mut FuncBuilder<'_>, &[Value]) -> Result<Vec<Value>, HloError> {
    move |f, a| {
        let (h0, w, x) = (a[0], a[1], a[2]);
        let out = f.scan(n, &[h0], &[x], |f, i, carry, xs| {
            let wi = layer(f, w, i)?;
            let dims = DotDims::contracting([1], [0]);
            let wh = f.dot_general(wi, carry[0], &dims, DType::F32, None)?;
            let mut all = f.all_reduce(wh, Reducer::Sum, &[vec![0, 1]], Grouping::FlattenedIds)?;
            if keep {
                all = f.keep_for_backward(all)?;
            }
            let pre = f.add(all, xs[0])?;
            Ok::<_, HloError>((vec![f.tanh(pre)?], vec![]))
        })?;
        Ok(vec![out.carry[0]])
    }
}

#[test]
fn a_scan_with_an_all_reduce_in_its_body() {
    let n = 3;
    let inputs: Vec<Vec<HostArray>> = (0..2).map(|d| rnn_inputs(n, 60 + 10 * d)).collect();
    let m = check("scan with all_reduce", &inputs, &all_reduce_rnn(n, false));
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
}

#[test]
fn a_nested_scan_and_a_scan_of_several_carries() {
    // An outer scan over stacked weights whose body runs an inner counted loop; two carries,
    // one of them only read.
    let m = check1(
        "nested scan",
        &[
            signed(&[D], 0.2, 1.0, 70),
            uniform(&[3, D, D], -0.6, 0.6, 71),
            uniform(&[D], -1.0, 1.0, 72),
        ],
        &|f, a| {
            let (h0, w, b0) = (a[0], a[1], a[2]);
            let out = f.scan(3, &[h0, b0], &[w], |f, _, c, ws| {
                let inner = f.scan(2, &[c[0]], &[], |f, _, ic, _| {
                    let h = step(f, ws[0], ic[0], c[1])?;
                    Ok::<_, HloError>((vec![h], vec![]))
                })?;
                let b = f.sin(c[1])?;
                Ok::<_, HloError>((vec![inner.carry[0], b], vec![]))
            })?;
            Ok(out.carry)
        },
    );
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
}

#[test]
fn loops_that_are_not_counted_are_errors_naming_the_loop_and_why() {
    // A run-time bound: the trip count is unknown when the program is built.
    let mut m = Module::new("runtime_bound");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let hi = f.arg(TensorType::scalar(DType::I32)).unwrap();
    let lo = f.scalar(0.0, DType::I32).unwrap();
    let y = f
        .fori_loop(lo, hi, &[x], |b, _, c| -> Result<_, HloError> {
            Ok(vec![b.sin(c[0])?])
        })
        .unwrap();
    let s = f.reduce(y[0], &[0], Reducer::Sum).unwrap();
    let e = f.grad(s, &[x]).unwrap_err();
    assert_eq!(e.op(), "stablehlo.while");
    let msg = e.to_string();
    assert!(msg.contains("its bound is not an i32 constant"), "{msg}");
    assert!(msg.contains("FuncBuilder::custom_vjp"), "{msg}");

    // A data-dependent loop: doubles x while its sum is below 10.
    let mut m = Module::new("data_dependent");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4])).unwrap();
    let y = f
        .while_loop(
            &[x],
            |b, c| -> Result<Value, HloError> {
                let s = b.reduce(c[0], &[0], Reducer::Sum)?;
                let ten = b.scalar(10.0, DType::F32)?;
                b.lt(s, ten)
            },
            |b, c| Ok(vec![b.add(c[0], c[0])?]),
        )
        .unwrap();
    let s = f.reduce(y[0], &[0], Reducer::Sum).unwrap();
    let e = f.grad(s, &[x]).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("stablehlo.while: no VJP rule for this loop"),
        "{msg}"
    );
    assert!(msg.contains("not a carried value"), "{msg}");
}

/// The text of the gradient program of an `n`-step RNN scan.
fn rnn_grad_text(n: usize) -> String {
    let types = [
        f32t(&[D as i64]),
        f32t(&[n as i64, D as i64, D as i64]),
        f32t(&[n as i64, D as i64]),
    ];
    program("size", 1, &types, &|f, a| rnn_scan(f, a), true)
        .unwrap()
        .to_mlir()
}

#[test]
fn the_backward_of_a_long_scan_is_the_size_of_a_short_one() {
    let (one, many) = (rnn_grad_text(1), rnn_grad_text(32));
    println!(
        "gradient text: {} bytes for 1 step, {} for 32",
        one.len(),
        many.len()
    );
    // Only the digits of the shapes and the trip counts differ.
    assert!(many.len() <= one.len() + one.len() / 20, "{many}");
    assert_eq!(one.lines().count(), many.lines().count());
}

#[test]
fn a_second_gradient_of_the_same_loop_reuses_its_saves() {
    // grad twice over the same forward: the loop is rewritten once, both gradients agree.
    let mut m = Module::new("twice");
    let mut f = m.func("main");
    let h0 = f.arg(f32t(&[D as i64])).unwrap();
    let w = f.arg(f32t(&[2, D as i64, D as i64])).unwrap();
    let x = f.arg(f32t(&[2, D as i64])).unwrap();
    let outs = rnn_scan(&mut f, &[h0, w, x]).unwrap();
    let s = f.reduce(outs[0], &[0], Reducer::Sum).unwrap();
    let g1 = f.grad(s, &[w]).unwrap();
    let g2 = f.grad(s, &[w]).unwrap();
    f.finish(&[g1[0], g2[0]]).unwrap();
    let text = m.to_mlir();
    // One forward loop with one save, and two backward loops.
    assert_eq!(text.matches("stablehlo.while").count(), 3, "{text}");
    let exe = fd::compile1(&m);
    let args: Vec<HostBuffer> = rnn_inputs(2, 80)
        .iter()
        .map(|a| HostBuffer::from_array(a).unwrap())
        .collect();
    let out = exe.execute_host(&[args]).unwrap();
    assert_eq!(fd::buffer_values(&out[0][0]), fd::buffer_values(&out[0][1]));
}

/// `h = tanh(doublings(sin h) / 4 + x_i)` over 3 steps (`args = [h0 [4], x [3, 4], k]`): the
/// unit doubles its input `k` times in a loop with a run-time trip count, which autodiff
/// cannot differentiate (only the unit's rule can, in the copies of the body autodiff
/// makes); its output kept for the backward when `keep`.
fn doublings_scan(
    keep: bool,
) -> impl Fn(&mut FuncBuilder<'_>, &[Value]) -> Result<Vec<Value>, HloError> {
    move |f, a| {
        let (h0, xs, k) = (a[0], a[1], a[2]);
        let out = f.scan(3, &[h0], &[xs], |f, _, c, x| {
            let s = f.sin(c[0])?;
            let y = f.custom_vjp(Rc::new(Doublings(2)), &[s], |f, v| {
                let lo = f.scalar(0.0, DType::I32)?;
                f.fori_loop(lo, k, &[v[0]], |b, _, d| -> Result<_, HloError> {
                    Ok(vec![b.add(d[0], d[0])?])
                })
            })?;
            let y = if keep {
                f.keep_for_backward(y[0])?
            } else {
                y[0]
            };
            let quarter = f.splat(0.25, f32t(&[4]))?;
            let y = f.mul(y, quarter)?;
            let pre = f.add(y, x[0])?;
            Ok::<_, HloError>((vec![f.tanh(pre)?], vec![]))
        })?;
        Ok(vec![out.carry[0]])
    }
}

fn doublings_inputs(seed: u64) -> [HostArray; 3] {
    [
        uniform(&[4], -1.0, 1.0, seed),
        uniform(&[3, 4], -1.0, 1.0, seed + 1),
        fd::index(2),
    ]
}

#[test]
fn a_custom_vjp_inside_a_scan_body_keeps_its_rule() {
    let m = check1(
        "custom_vjp in a scan",
        &doublings_inputs(90),
        &doublings_scan(false),
    );
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
}

#[test]
fn a_value_both_carried_and_captured_gets_both_cotangents() {
    // h0 starts the carry and is also read by every step; s is a carried loop invariant that
    // the body also reads directly.
    let m = check1(
        "carried and captured",
        &[uniform(&[D], -1.0, 1.0, 95), uniform(&[D], 0.5, 1.0, 96)],
        &|f, a| {
            let (h0, s) = (a[0], a[1]);
            let out = f.scan(3, &[h0, s], &[], |f, _, c, _| {
                let t = f.mul(c[0], c[1])?;
                let t = f.add(t, h0)?;
                let t = f.mul(t, s)?;
                Ok::<_, HloError>((vec![f.tanh(t)?, c[1]], vec![]))
            })?;
            Ok(out.carry)
        },
    );
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
}

/// `y = h * w[row] * scale` (`h [D]`, `w [N, D]`), a unit whose rule reads `row` (i32) and
/// `scale` (f32, not differentiated), values the forward computed outside the unit and the
/// rule captured.
#[derive(Debug)]
struct RowMul {
    row: Value,
    scale: Value,
}

impl RowMul {
    /// Row `row` of `w` as `[D]`.
    fn row_of(&self, f: &mut FuncBuilder<'_>, w: Value) -> Result<Value, HloError> {
        layer(f, w, self.row)
    }

    fn apply(
        f: &mut FuncBuilder<'_>,
        h: Value,
        w: Value,
        row: Value,
        scale: Value,
    ) -> Result<Value, HloError> {
        let rule = Rc::new(RowMul { row, scale });
        let y = f.custom_vjp(rule.clone(), &[h, w], |f, x| {
            let wr = rule.row_of(f, x[1])?;
            let hw = f.mul(x[0], wr)?;
            let s = f.broadcast_in_dim(scale, &[D as i64], &[])?;
            Ok::<_, HloError>(vec![f.mul(hw, s)?])
        })?;
        Ok(y[0])
    }
}

impl VjpRule for RowMul {
    fn name(&self) -> &str {
        "row mul"
    }

    fn vjp(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, HloError> {
        let Some(dy) = call.cotangents[0] else {
            return Ok(vec![None, None]);
        };
        let (h, w) = (call.inputs[0], call.inputs[1]);
        let s = f.broadcast_in_dim(self.scale, &[D as i64], &[])?;
        let dys = f.mul(dy, s)?;
        let wr = self.row_of(f, w)?;
        let dh = f.mul(dys, wr)?;
        let dwr = f.mul(dys, h)?;
        let dwr = f.reshape(dwr, &[1, D as i64])?;
        let zeros = f.splat(0.0, f.value_type(w)?.clone())?;
        let zero = f.scalar(0.0, DType::I32)?;
        let dw = f.dynamic_update_slice(zeros, dwr, &[self.row, zero])?;
        Ok(vec![Some(dh), Some(dw)])
    }
}

/// Iteration `i`'s row `(2 i) % rows` and scale `1 + row / 4`, computed in the loop body.
fn row_and_scale(
    f: &mut FuncBuilder<'_>,
    i: Value,
    rows: usize,
) -> Result<(Value, Value), HloError> {
    let two = f.scalar(2.0, DType::I32)?;
    let n = f.scalar(rows as f64, DType::I32)?;
    let twice = f.mul(i, two)?;
    let row = f.rem(twice, n)?;
    let r = f.convert(row, DType::F32)?;
    let quarter = f.scalar(0.25, DType::F32)?;
    let one = f.scalar(1.0, DType::F32)?;
    let rq = f.mul(r, quarter)?;
    Ok((row, f.add(rq, one)?))
}

/// `h = tanh(RowMul(h, w; row_i) + x_i)` as a scan: `args = [h0 [D], w [R, D], x [N, D]]`.
fn row_mul_scan(f: &mut FuncBuilder<'_>, a: &[Value]) -> Result<Vec<Value>, HloError> {
    let (h0, w, x) = (a[0], a[1], a[2]);
    let rows = f.value_type(w)?.dims[0] as usize;
    let n = f.value_type(x)?.dims[0] as usize;
    let out = f.scan(n, &[h0], &[x], |f, i, carry, xs| {
        let (row, scale) = row_and_scale(f, i, rows)?;
        let y = RowMul::apply(f, carry[0], w, row, scale)?;
        let pre = f.add(y, xs[0])?;
        let h = f.tanh(pre)?;
        Ok::<_, HloError>((vec![h], vec![h]))
    })?;
    Ok(vec![out.carry[0], out.ys[0]])
}

/// The same with plain ops, unrolled, rows and scales constants.
fn row_mul_unrolled(f: &mut FuncBuilder<'_>, a: &[Value]) -> Result<Vec<Value>, HloError> {
    let (mut h, w, x) = (a[0], a[1], a[2]);
    let rows = f.value_type(w)?.dims[0] as usize;
    let n = f.value_type(x)?.dims[0] as usize;
    let mut ys = Vec::with_capacity(n);
    for i in 0..n {
        let row = (2 * i) % rows;
        let idx = f.scalar(row as f64, DType::I32)?;
        let wr = layer(f, w, idx)?;
        let scale = f.splat(1.0 + row as f64 / 4.0, f32t(&[D as i64]))?;
        let hw = f.mul(h, wr)?;
        let y = f.mul(hw, scale)?;
        let xi = f.scalar(i as f64, DType::I32)?;
        let xi = layer(f, x, xi)?;
        let pre = f.add(y, xi)?;
        h = f.tanh(pre)?;
        ys.push(f.reshape(h, &[1, D as i64])?);
    }
    let ys = f.concatenate(&ys, 0)?;
    Ok(vec![h, ys])
}

fn row_mul_inputs(rows: usize, n: usize, seed: u64) -> Vec<HostArray> {
    vec![
        uniform(&[D], -1.0, 1.0, seed),
        uniform(&[rows, D], -0.9, 0.9, seed + 1),
        uniform(&[n, D], -1.0, 1.0, seed + 2),
    ]
}

#[test]
fn a_custom_vjp_rule_in_a_scan_reads_values_the_body_computed() {
    // Rows 0, 2, 0, 2, 0 of 4: two rows read several times, two never.
    let m = check1(
        "rule reading the body's index",
        &row_mul_inputs(4, 5, 100),
        &|f, a| row_mul_scan(f, a),
    );
    assert!(m.fd_rel_err < 1e-8, "{m:?}");

    assert_scan_equals_unrolled(
        "rule reading the body's index",
        &row_mul_inputs(5, 6, 110),
        6,
        111,
        &|f, a| row_mul_scan(f, a),
        &|f, a| row_mul_unrolled(f, a),
    );
}

#[test]
fn a_rule_in_a_nested_scan_reads_the_outer_body_s_index() {
    // The outer body computes the row; an inner loop's unit reads it in its rule.
    let m = check1(
        "rule reading the outer body's index",
        &row_mul_inputs(3, 4, 120),
        &|f, a| {
            let (h0, w, x) = (a[0], a[1], a[2]);
            let out = f.scan(4, &[h0], &[x], |f, i, c, xs| {
                let (row, scale) = row_and_scale(f, i, 3)?;
                let inner = f.scan(2, &[c[0]], &[], |f, _, ic, _| {
                    let y = RowMul::apply(f, ic[0], w, row, scale)?;
                    let pre = f.add(y, xs[0])?;
                    Ok::<_, HloError>((vec![f.tanh(pre)?], vec![]))
                })?;
                Ok::<_, HloError>((inner.carry, vec![]))
            })?;
            Ok(out.carry)
        },
    );
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
}

/// The RNN scan of `rnn_scan` with the values `keep` names marked with
/// `FuncBuilder::keep_for_backward`: `"wh"` (the product), `"h"` (the new state, also the
/// carry and the stacked output).
fn rnn_scan_keeping(
    f: &mut FuncBuilder<'_>,
    a: &[Value],
    keep: &[&str],
) -> Result<Vec<Value>, HloError> {
    let n = f.value_type(a[1])?.dims[0] as usize;
    let (h0, w, x) = (a[0], a[1], a[2]);
    let out = f.scan(n, &[h0], &[x], |f, i, carry, xs| {
        let wi = layer(f, w, i)?;
        let mut wh = f.dot_general(
            wi,
            carry[0],
            &DotDims::contracting([1], [0]),
            DType::F32,
            None,
        )?;
        if keep.contains(&"wh") {
            wh = f.keep_for_backward(wh)?;
        }
        let pre = f.add(wh, xs[0])?;
        let mut h = f.tanh(pre)?;
        if keep.contains(&"h") {
            h = f.keep_for_backward(h)?;
        }
        Ok::<_, HloError>((vec![h], vec![h]))
    })?;
    Ok(vec![out.carry[0], out.ys[0]])
}

#[test]
fn kept_values_give_the_gradient_of_the_unrolled_loop() {
    let n = 4;
    for keep in [&["wh"][..], &["h"], &["wh", "h"]] {
        assert_scan_equals_unrolled(
            &format!("rnn keeping {keep:?}"),
            &rnn_inputs(n, 140),
            n,
            17,
            &|f, a| rnn_scan_keeping(f, a, keep),
            &|f, a| rnn_unrolled(f, a),
        );
    }
}

#[test]
fn a_kept_value_is_read_from_the_forward_not_recomputed() {
    // The backward re-runs the body without the kept product: one dot fewer in its loop
    // (forward 1, re-run 1, the rule's 2 without keeping; the rule's 2 with it), and the
    // forward saves one buffer more.
    let types = [
        f32t(&[D as i64]),
        f32t(&[3, D as i64, D as i64]),
        f32t(&[3, D as i64]),
    ];
    let text = |keep: &'static [&'static str]| {
        program(
            "kept",
            1,
            &types,
            &move |f, a| rnn_scan_keeping(f, a, keep),
            true,
        )
        .unwrap()
        .to_mlir()
    };
    let (recomputed, kept) = (text(&[]), text(&["wh"]));
    let dots = |t: &str| t.matches("stablehlo.dot_general").count();
    assert_eq!(dots(&recomputed), 4, "{recomputed}");
    assert_eq!(dots(&kept), 3, "{kept}");
    let dus = |t: &str| t.matches("stablehlo.dynamic_update_slice").count();
    assert_eq!(dus(&kept), dus(&recomputed) + 1, "{kept}");
}

#[test]
fn a_kept_collective_is_not_run_again_in_the_backward() {
    // The all-reduce's result kept: the backward holds only its transpose (without the mark,
    // also the re-run's copy).
    const DEVICES: usize = 2;
    let n = 3;
    let inputs: Vec<Vec<HostArray>> = (0..DEVICES)
        .map(|d| rnn_inputs(n, 160 + 10 * d as u64))
        .collect();
    let forward = |keep: bool| all_reduce_rnn(n, keep);
    let m = check("scan with a kept all_reduce", &inputs, &forward(true));
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
    let types: Vec<TensorType> = inputs[0].iter().map(fd::type_of).collect();
    let count = |keep: bool| {
        program("kept", DEVICES, &types, &forward(keep), true)
            .unwrap()
            .to_mlir()
            .matches("\"stablehlo.all_reduce\"")
            .count()
    };
    assert_eq!((count(false), count(true)), (3, 2));
}

#[test]
fn a_kept_custom_vjp_output_leaves_the_unit_out_of_the_re_run() {
    // The unit runs in the forward only: loops without the mark: forward scan, its unit,
    // backward scan, the re-run's unit.
    let inputs = doublings_inputs(190);
    let forward = doublings_scan;
    let m = check1("kept custom_vjp output", &inputs, &forward(true));
    assert!(m.fd_rel_err < 1e-8, "{m:?}");
    let types: Vec<TensorType> = inputs.iter().map(fd::type_of).collect();
    let loops = |keep: bool| {
        program("kept", 1, &types, &forward(keep), true)
            .unwrap()
            .to_mlir()
            .matches("stablehlo.while")
            .count()
    };
    assert_eq!((loops(false), loops(true)), (4, 3));
}

//! Finite-difference checks of reverse-mode autodiff, run on the XLA CPU plugin.
//!
//! A case builds a forward `f(args) -> outputs` with the builder. The check builds two
//! programs from it: the forward, and the gradient `args, cotangents -> vjp(args)` (every
//! f32 argument differentiated). Both are printed and then retyped from f32 to f64 (the
//! rules do not depend on the element type; the CPU plugin runs f64 StableHLO), and for each
//! f32 argument `a` and a random direction `u`:
//!
//! `(L(x + h u) - L(x - h u)) / 2h  ~  sum_devices <grad_a, u>`,
//! `L(x) = sum_devices sum_outputs <output, cotangent>`
//!
//! with `h = 1e-5`, within [`RTOL`] of `sum |grad_a u|`. The f32 gradient program is run
//! too and must agree with the f64 one (it is the program users get).

#![allow(dead_code)] // each test binary uses part of the harness

use std::fmt::Write as _;

use half::bf16;
use tessera_hlo::autodiff::{VjpCall, VjpRule};
use tessera_hlo::{DType, FuncBuilder, HloError, HostArray, Module, Sharding, TensorType, Value};
use tessera_runtime::{Client, CompileOptions, ElementType, HostBuffer};

/// Relative tolerance of the f64 finite-difference check.
pub const RTOL: f64 = 1e-8;
/// Step of the central difference (inputs are O(1)).
pub const STEP: f64 = 1e-5;
/// Tolerance of the f32 gradient against the f64 one, relative to the largest f64 gradient.
pub const F32_RTOL: f64 = 1e-4;

/// The forward of a case: the builder and the arguments, returning the outputs.
pub type Forward<'a> = &'a dyn Fn(&mut FuncBuilder<'_>, &[Value]) -> Result<Vec<Value>, HloError>;

/// What a check measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Measured {
    /// The largest relative error of a finite difference against its directional derivative.
    pub fd_rel_err: f64,
    /// The largest error of the f32 gradient, relative to the largest gradient element.
    pub f32_rel_err: f64,
}

/// `n` pseudo-random values in `[lo, hi)` (a fixed generator: the same seed, the same values).
pub fn values(n: usize, lo: f64, hi: f64, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            lo + (hi - lo) * u
        })
        .collect()
}

/// An f32 array of values in `[lo, hi)`.
pub fn uniform(shape: &[usize], lo: f64, hi: f64, seed: u64) -> HostArray {
    let n = shape.iter().product();
    HostArray::from_f64(DType::F32, shape.to_vec(), &values(n, lo, hi, seed)).unwrap()
}

/// An f32 array with magnitudes in `[lo, hi)` and random signs.
pub fn signed(shape: &[usize], lo: f64, hi: f64, seed: u64) -> HostArray {
    let n = shape.iter().product();
    let mags = values(n, lo, hi, seed);
    let signs = values(n, -1.0, 1.0, seed + 7919);
    let v: Vec<f64> = mags
        .iter()
        .zip(signs)
        .map(|(m, s)| if s < 0.0 { -m } else { *m })
        .collect();
    HostArray::from_f64(DType::F32, shape.to_vec(), &v).unwrap()
}

/// An i32 scalar.
pub fn index(i: i32) -> HostArray {
    HostArray::i32(Vec::<usize>::new(), vec![i]).unwrap()
}

/// `TensorType` of a host array.
pub fn type_of(a: &HostArray) -> TensorType {
    TensorType::new(
        a.shape().iter().map(|&d| d as i64).collect::<Vec<_>>(),
        a.dtype(),
    )
}

/// A program from `forward`: the forward itself, or (`grad`) its gradient program taking the
/// arguments and one cotangent per output and returning the cotangent of every f32 argument.
pub fn program(
    name: &str,
    devices: usize,
    arg_types: &[TensorType],
    forward: Forward<'_>,
    grad: bool,
) -> Result<Module, HloError> {
    let mut m = Module::new(name);
    if devices > 1 {
        m.set_num_partitions(devices as u32)?;
    }
    let mut f = m.func("main");
    let add_arg = |f: &mut FuncBuilder<'_>, t: TensorType| {
        if devices > 1 {
            f.arg_with_sharding(t, Sharding::Manual)
        } else {
            f.arg(t)
        }
    };
    let args = arg_types
        .iter()
        .map(|t| add_arg(&mut f, t.clone()))
        .collect::<Result<Vec<_>, _>>()?;
    let outs = forward(&mut f, &args)?;
    let results = if grad {
        let mut cts = Vec::with_capacity(outs.len());
        for &o in &outs {
            let t = f.value_type(o)?.clone();
            cts.push(add_arg(&mut f, t)?);
        }
        let wrt: Vec<Value> = args
            .iter()
            .zip(arg_types)
            .filter(|(_, t)| t.dtype == DType::F32)
            .map(|(&a, _)| a)
            .collect();
        f.vjp(&outs, &cts, &wrt)?
    } else {
        outs
    };
    let sharding = (devices > 1).then_some(Sharding::Manual);
    let with: Vec<(Value, Option<Sharding>)> =
        results.iter().map(|&v| (v, sharding.clone())).collect();
    f.finish_with_shardings(&with)?;
    Ok(m)
}

/// The text of a module with every f32 type (and f32 infinity) as f64.
pub fn to_f64_text(text: &str) -> String {
    let t = text
        .replace("xf32>", "xf64>")
        .replace("<f32>", "<f64>")
        .replace("0xFF800000", "0xFFF0000000000000")
        .replace("0x7F800000", "0x7FF0000000000000");
    assert!(!t.contains("f32"), "f32 left after retyping:\n{t}");
    t
}

fn options(devices: usize) -> CompileOptions {
    if devices > 1 {
        CompileOptions::manual_partitions(devices).unwrap()
    } else {
        CompileOptions::single_device()
    }
}

/// An argument in f64 form: f32 arrays as f64 values, others as they are.
#[derive(Debug, Clone)]
enum Arg {
    Float { dims: Vec<i64>, values: Vec<f64> },
    Other(HostArray),
}

impl Arg {
    fn of(a: &HostArray) -> Arg {
        match a.dtype() {
            DType::F32 => Arg::Float {
                dims: type_of(a).dims,
                values: a.to_f64_vec(),
            },
            _ => Arg::Other(a.clone()),
        }
    }

    fn buffer(&self) -> HostBuffer {
        match self {
            Arg::Float { dims, values } => HostBuffer::from_slice(dims, values).unwrap(),
            Arg::Other(a) => HostBuffer::from_array(a).unwrap(),
        }
    }
}

/// The values of a result buffer as f64.
pub fn buffer_values(b: &HostBuffer) -> Vec<f64> {
    match b.element_type() {
        ElementType::F64 => b.to_vec::<f64>().unwrap(),
        ElementType::F32 => b
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        ElementType::BF16 => b
            .to_vec::<bf16>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        ElementType::I32 => b
            .to_vec::<i32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        other => panic!("unexpected result type {other}"),
    }
}

fn run(
    client: &Client,
    text: &str,
    devices: usize,
    args: &[Vec<Arg>],
    what: &str,
) -> Vec<Vec<Vec<f64>>> {
    let exe = client
        .compile(text, &options(devices))
        .unwrap_or_else(|e| panic!("{what}: compile: {e}\n{text}"));
    let buffers: Vec<Vec<HostBuffer>> = args
        .iter()
        .map(|l| l.iter().map(Arg::buffer).collect())
        .collect();
    exe.execute_host(&buffers)
        .unwrap_or_else(|e| panic!("{what}: run: {e}"))
        .iter()
        .map(|l| l.iter().map(buffer_values).collect())
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Checks the gradient of `forward` at `inputs` (per device, the argument arrays) against
/// central differences; panics naming the case and the argument on a mismatch.
pub fn check(name: &str, inputs: &[Vec<HostArray>], forward: Forward<'_>) -> Measured {
    let devices = inputs.len();
    let arg_types: Vec<TensorType> = inputs[0].iter().map(type_of).collect();
    let fwd = program(name, devices, &arg_types, forward, false)
        .unwrap_or_else(|e| panic!("{name}: forward: {e}"));
    let grad = program(name, devices, &arg_types, forward, true)
        .unwrap_or_else(|e| panic!("{name}: gradient: {e}"));
    let client = Client::cpu_shared(devices).unwrap();
    let (fwd_text, grad_text) = (to_f64_text(&fwd.to_mlir()), to_f64_text(&grad.to_mlir()));
    let x: Vec<Vec<Arg>> = inputs
        .iter()
        .map(|l| l.iter().map(Arg::of).collect())
        .collect();

    // Cotangents, one per output of the forward (its types from the f64 run).
    let outs = run(&client, &fwd_text, devices, &x, name);
    let out_types = fwd.get_func("main").unwrap().result_types();
    let cts: Vec<Vec<Arg>> = (0..devices)
        .map(|d| {
            out_types
                .iter()
                .enumerate()
                .map(|(o, t)| {
                    let n = t.num_elements().unwrap() as usize;
                    let v = values(n, -1.0, 1.0, 1000 + (d * 31 + o) as u64);
                    match t.dtype {
                        DType::F32 => Arg::Float {
                            dims: t.dims.clone(),
                            values: v,
                        },
                        dt => Arg::Other(
                            HostArray::from_f64(
                                dt,
                                t.dims.iter().map(|&s| s as usize).collect::<Vec<_>>(),
                                &v,
                            )
                            .unwrap(),
                        ),
                    }
                })
                .collect()
        })
        .collect();
    let ct_values: Vec<Vec<Vec<f64>>> = cts
        .iter()
        .map(|l| {
            l.iter()
                .map(|a| match a {
                    Arg::Float { values, .. } => values.clone(),
                    Arg::Other(h) => h.to_f64_vec(),
                })
                .collect()
        })
        .collect();
    assert_eq!(outs[0].len(), out_types.len(), "{name}: forward outputs");
    let loss = |x: &[Vec<Arg>]| -> f64 {
        let outs = run(&client, &fwd_text, devices, x, name);
        outs.iter()
            .zip(&ct_values)
            .map(|(o, c)| o.iter().zip(c).map(|(a, b)| dot(a, b)).sum::<f64>())
            .sum()
    };

    // The gradient, f64 and f32.
    let grad_args: Vec<Vec<Arg>> = x
        .iter()
        .zip(&cts)
        .map(|(a, c)| a.iter().chain(c).cloned().collect())
        .collect();
    let g = run(&client, &grad_text, devices, &grad_args, name);
    let f32_args: Vec<Vec<HostArray>> = inputs
        .iter()
        .zip(&ct_values)
        .map(|(a, c)| {
            let mut l = a.clone();
            for (t, v) in out_types.iter().zip(c) {
                let shape: Vec<usize> = t.dims.iter().map(|&s| s as usize).collect();
                l.push(HostArray::from_f64(t.dtype, shape, v).unwrap());
            }
            l
        })
        .collect();
    let f32_buffers: Vec<Vec<HostBuffer>> = f32_args
        .iter()
        .map(|l| {
            l.iter()
                .map(|a| HostBuffer::from_array(a).unwrap())
                .collect()
        })
        .collect();
    let g32: Vec<Vec<Vec<f64>>> = client
        .compile(&grad.to_mlir(), &options(devices))
        .unwrap_or_else(|e| panic!("{name}: f32 compile: {e}\n{}", grad.to_mlir()))
        .execute_host(&f32_buffers)
        .unwrap_or_else(|e| panic!("{name}: f32 run: {e}"))
        .iter()
        .map(|l| l.iter().map(buffer_values).collect())
        .collect();

    let float_args: Vec<usize> = arg_types
        .iter()
        .enumerate()
        .filter(|(_, t)| t.dtype == DType::F32)
        .map(|(i, _)| i)
        .collect();
    let mut measured = Measured {
        fd_rel_err: 0.0,
        f32_rel_err: 0.0,
    };
    let mut report = String::new();
    for (k, &a) in float_args.iter().enumerate() {
        let n = arg_types[a].num_elements().unwrap() as usize;
        let dirs: Vec<Vec<f64>> = (0..devices)
            .map(|d| values(n, -1.0, 1.0, 77 + (a * 13 + d) as u64))
            .collect();
        let shifted = |sign: f64| -> Vec<Vec<Arg>> {
            let mut y = x.clone();
            for (d, l) in y.iter_mut().enumerate() {
                if let Arg::Float { values, .. } = &mut l[a] {
                    for (v, u) in values.iter_mut().zip(&dirs[d]) {
                        *v += sign * STEP * u;
                    }
                }
            }
            y
        };
        let fd = (loss(&shifted(1.0)) - loss(&shifted(-1.0))) / (2.0 * STEP);
        let analytic: f64 = (0..devices).map(|d| dot(&g[d][k], &dirs[d])).sum();
        let scale: f64 = (0..devices)
            .map(|d| {
                g[d][k]
                    .iter()
                    .zip(&dirs[d])
                    .map(|(x, y)| (x * y).abs())
                    .sum::<f64>()
            })
            .sum::<f64>()
            .max(1e-12);
        let rel = (fd - analytic).abs() / scale;
        let _ = writeln!(
            report,
            "  arg #{a}: finite difference {fd:.12e}, vjp {analytic:.12e}, rel err {rel:.2e}"
        );
        measured.fd_rel_err = measured.fd_rel_err.max(rel);
        let largest = g
            .iter()
            .flat_map(|l| l[k].iter())
            .fold(0f64, |m, v| m.max(v.abs()));
        for d in 0..devices {
            for (i, (a32, a64)) in g32[d][k].iter().zip(&g[d][k]).enumerate() {
                let err = (a32 - a64).abs() / largest.max(1e-30);
                measured.f32_rel_err = measured.f32_rel_err.max(err);
                assert!(
                    err <= F32_RTOL,
                    "{name}: f32 gradient of arg #{a} device {d} [{i}]: {a32} vs f64 {a64}"
                );
            }
        }
    }
    assert!(
        measured.fd_rel_err <= RTOL,
        "{name}: the vjp disagrees with finite differences:\n{report}{grad_text}"
    );
    println!(
        "{name}: max fd rel err {:.2e}, f32 vs f64 {:.2e}",
        measured.fd_rel_err, measured.f32_rel_err
    );
    measured
}

/// Compiles `m` for one CPU device.
pub fn compile1(m: &Module) -> tessera_runtime::LoadedExecutable {
    Client::cpu_shared(1)
        .unwrap()
        .compile(&m.to_mlir(), &options(1))
        .unwrap_or_else(|e| panic!("{e}\n{}", m.to_mlir()))
}

/// [`check`] on one device.
pub fn check1(name: &str, inputs: &[HostArray], forward: Forward<'_>) -> Measured {
    check(name, &[inputs.to_vec()], forward)
}

/// A custom-VJP rule for `y = x * 2^n` (e.g. `n` doublings in a loop): `dx = dy * 2^n`.
#[derive(Debug)]
pub struct Doublings(pub u32);

impl VjpRule for Doublings {
    fn name(&self) -> &str {
        "doublings"
    }

    fn vjp(
        &self,
        f: &mut FuncBuilder<'_>,
        call: &VjpCall<'_>,
    ) -> Result<Vec<Option<Value>>, HloError> {
        let Some(dy) = call.cotangents[0] else {
            return Ok(vec![None]);
        };
        let t = f.value_type(dy)?.clone();
        let scale = f.splat(f64::from(2u32.pow(self.0)), t)?;
        Ok(vec![Some(f.mul(dy, scale)?)])
    }
}

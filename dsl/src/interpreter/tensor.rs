//! The interpreter's run-time values: small dense tensors with per-op dtype rounding.
//!
//! Floats are held as f32 and rounded to bf16 after every bf16 op; i8 values are held as i32
//! and wrapped after every i8 op. That matches what a TPU or XLA computes per op.

use half::bf16;

use crate::array::{ArrayData, HostArray};
use crate::ir::{garbage_literal, BinaryOp, CmpOp, DType, Literal, ReduceOp, UnaryOp};

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Data {
    F(Vec<f32>),
    I(Vec<i32>),
    B(Vec<bool>),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Tensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: Data,
}

pub(crate) fn round(dtype: DType, x: f32) -> f32 {
    if dtype == DType::BF16 {
        bf16::from_f32(x).to_f32()
    } else {
        x
    }
}

fn wrap(dtype: DType, x: i32) -> i32 {
    if dtype == DType::I8 {
        x as i8 as i32
    } else {
        x
    }
}

pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Calls `f(flat_index, multi_index)` for every element of `shape`, row-major.
pub(crate) fn for_each_index(shape: &[usize], mut f: impl FnMut(usize, &[usize])) {
    let n: usize = shape.iter().product();
    let mut idx = vec![0usize; shape.len()];
    for flat in 0..n {
        f(flat, &idx);
        for d in (0..shape.len()).rev() {
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl Tensor {
    pub fn splat(dtype: DType, shape: &[usize], lit: Literal) -> Tensor {
        let n = shape.iter().product();
        let data = match (dtype, lit) {
            (d, Literal::Float(v)) if d.is_float() => Data::F(vec![round(d, v as f32); n]),
            (d, Literal::Int(v)) if d.is_float() => Data::F(vec![round(d, v as f32); n]),
            (d, Literal::Int(v)) => Data::I(vec![wrap(d, v as i32); n]),
            (_, Literal::Bool(b)) => Data::B(vec![b; n]),
            (d, Literal::Float(v)) => Data::I(vec![wrap(d, v as i32); n]),
        };
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    /// A buffer of garbage, as uninitialised VMEM (see [`garbage_literal`]).
    pub fn garbage(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor::splat(dtype, shape, garbage_literal(dtype))
    }

    pub fn scalar_i32(v: i32) -> Tensor {
        Tensor {
            dtype: DType::I32,
            shape: vec![],
            data: Data::I(vec![v]),
        }
    }

    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }

    /// The single element of an i32 scalar.
    pub fn as_i32(&self) -> i32 {
        match &self.data {
            Data::I(v) => v[0],
            Data::F(v) => v[0] as i32,
            Data::B(v) => v[0] as i32,
        }
    }

    pub fn as_bool(&self) -> bool {
        match &self.data {
            Data::B(v) => v[0],
            Data::I(v) => v[0] != 0,
            Data::F(v) => v[0] != 0.0,
        }
    }

    pub fn from_host(a: &HostArray) -> Tensor {
        let data = match a.data() {
            ArrayData::F32(v) => Data::F(v.clone()),
            ArrayData::BF16(v) => Data::F(v.iter().map(|x| x.to_f32()).collect()),
            ArrayData::I32(v) => Data::I(v.clone()),
            ArrayData::I8(v) => Data::I(v.iter().map(|&x| x as i32).collect()),
            ArrayData::Bool(v) => Data::B(v.clone()),
        };
        Tensor {
            dtype: a.dtype(),
            shape: a.shape().to_vec(),
            data,
        }
    }

    pub fn into_host(self) -> HostArray {
        let data = match (self.dtype, self.data) {
            (DType::F32, Data::F(v)) => ArrayData::F32(v),
            (DType::BF16, Data::F(v)) => {
                ArrayData::BF16(v.into_iter().map(bf16::from_f32).collect())
            }
            (DType::I32, Data::I(v)) => ArrayData::I32(v),
            (DType::I8, Data::I(v)) => ArrayData::I8(v.into_iter().map(|x| x as i8).collect()),
            (DType::Bool, Data::B(v)) => ArrayData::Bool(v),
            (d, _) => unreachable!("tensor data does not match its dtype {d}"),
        };
        HostArray::new(self.shape, data).expect("tensor length matches its shape")
    }

    /// Copies the box `starts .. starts + sizes` out of `self`.
    pub fn window(&self, starts: &[usize], sizes: &[usize]) -> Tensor {
        let st = strides(&self.shape);
        let mut picks = Vec::with_capacity(sizes.iter().product());
        for_each_index(sizes, |_, idx| {
            picks.push(
                idx.iter()
                    .zip(starts)
                    .zip(&st)
                    .map(|((i, s), t)| (i + s) * t)
                    .sum::<usize>(),
            );
        });
        self.gather(&picks, sizes.to_vec())
    }

    /// Writes `src` into the box of `self` starting at `starts`.
    pub fn write_window(&mut self, starts: &[usize], src: &Tensor) {
        let st = strides(&self.shape);
        let mut targets = Vec::with_capacity(src.len());
        for_each_index(&src.shape, |_, idx| {
            targets.push(
                idx.iter()
                    .zip(starts)
                    .zip(&st)
                    .map(|((i, s), t)| (i + s) * t)
                    .sum::<usize>(),
            );
        });
        match (&mut self.data, &src.data) {
            (Data::F(d), Data::F(s)) => targets.iter().zip(s).for_each(|(&t, &v)| d[t] = v),
            (Data::I(d), Data::I(s)) => targets.iter().zip(s).for_each(|(&t, &v)| d[t] = v),
            (Data::B(d), Data::B(s)) => targets.iter().zip(s).for_each(|(&t, &v)| d[t] = v),
            _ => unreachable!("write_window with mismatched dtypes"),
        }
    }

    fn gather(&self, picks: &[usize], shape: Vec<usize>) -> Tensor {
        let data = match &self.data {
            Data::F(v) => Data::F(picks.iter().map(|&i| v[i]).collect()),
            Data::I(v) => Data::I(picks.iter().map(|&i| v[i]).collect()),
            Data::B(v) => Data::B(picks.iter().map(|&i| v[i]).collect()),
        };
        Tensor {
            dtype: self.dtype,
            shape,
            data,
        }
    }

    pub fn unary(&self, op: UnaryOp) -> Tensor {
        let d = self.dtype;
        let data = match &self.data {
            Data::F(v) => Data::F(
                v.iter()
                    .map(|&x| {
                        round(
                            d,
                            match op {
                                UnaryOp::Neg => -x,
                                UnaryOp::Exp => x.exp(),
                                UnaryOp::Log => x.ln(),
                                UnaryOp::Tanh => x.tanh(),
                                UnaryOp::Sqrt => x.sqrt(),
                                UnaryOp::Rsqrt => 1.0 / x.sqrt(),
                                UnaryOp::Abs => x.abs(),
                                UnaryOp::Not => unreachable!("verified: not on floats"),
                            },
                        )
                    })
                    .collect(),
            ),
            Data::I(v) => Data::I(
                v.iter()
                    .map(|&x| {
                        wrap(
                            d,
                            match op {
                                UnaryOp::Neg => x.wrapping_neg(),
                                UnaryOp::Abs => x.wrapping_abs(),
                                _ => unreachable!("verified: float-only op on ints"),
                            },
                        )
                    })
                    .collect(),
            ),
            Data::B(v) => Data::B(v.iter().map(|&x| !x).collect()),
        };
        Tensor {
            dtype: d,
            shape: self.shape.clone(),
            data,
        }
    }

    pub fn binary(&self, op: BinaryOp, rhs: &Tensor) -> Tensor {
        let d = self.dtype;
        let data = match (&self.data, &rhs.data) {
            (Data::F(a), Data::F(b)) => Data::F(
                a.iter()
                    .zip(b)
                    .map(|(&x, &y)| {
                        round(
                            d,
                            match op {
                                BinaryOp::Add => x + y,
                                BinaryOp::Sub => x - y,
                                BinaryOp::Mul => x * y,
                                BinaryOp::Div => x / y,
                                BinaryOp::Rem => x % y,
                                BinaryOp::Max => nan_max(x, y),
                                BinaryOp::Min => nan_min(x, y),
                                _ => unreachable!("verified: logical op on floats"),
                            },
                        )
                    })
                    .collect(),
            ),
            (Data::I(a), Data::I(b)) => Data::I(
                a.iter()
                    .zip(b)
                    .map(|(&x, &y)| {
                        wrap(
                            d,
                            match op {
                                BinaryOp::Add => x.wrapping_add(y),
                                BinaryOp::Sub => x.wrapping_sub(y),
                                BinaryOp::Mul => x.wrapping_mul(y),
                                // Division by zero is -1 / x like XLA, rather than a trap.
                                BinaryOp::Div => {
                                    if y == 0 {
                                        -1
                                    } else {
                                        x.wrapping_div(y)
                                    }
                                }
                                BinaryOp::Rem => {
                                    if y == 0 {
                                        x
                                    } else {
                                        x.wrapping_rem(y)
                                    }
                                }
                                BinaryOp::Max => x.max(y),
                                BinaryOp::Min => x.min(y),
                                BinaryOp::And => x & y,
                                BinaryOp::Or => x | y,
                                BinaryOp::Xor => x ^ y,
                            },
                        )
                    })
                    .collect(),
            ),
            (Data::B(a), Data::B(b)) => Data::B(
                a.iter()
                    .zip(b)
                    .map(|(&x, &y)| match op {
                        BinaryOp::And => x & y,
                        BinaryOp::Or => x | y,
                        BinaryOp::Xor => x ^ y,
                        _ => unreachable!("verified: arithmetic on bools"),
                    })
                    .collect(),
            ),
            _ => unreachable!("verified: binary operands have one dtype"),
        };
        Tensor {
            dtype: d,
            shape: self.shape.clone(),
            data,
        }
    }

    pub fn compare(&self, op: CmpOp, rhs: &Tensor) -> Tensor {
        fn cmp<T: PartialOrd>(op: CmpOp, x: T, y: T) -> bool {
            match op {
                CmpOp::Eq => x == y,
                CmpOp::Ne => x != y,
                CmpOp::Lt => x < y,
                CmpOp::Le => x <= y,
                CmpOp::Gt => x > y,
                CmpOp::Ge => x >= y,
            }
        }
        let out: Vec<bool> = match (&self.data, &rhs.data) {
            (Data::F(a), Data::F(b)) => a.iter().zip(b).map(|(&x, &y)| cmp(op, x, y)).collect(),
            (Data::I(a), Data::I(b)) => a.iter().zip(b).map(|(&x, &y)| cmp(op, x, y)).collect(),
            (Data::B(a), Data::B(b)) => a.iter().zip(b).map(|(&x, &y)| cmp(op, x, y)).collect(),
            _ => unreachable!("verified: compare operands have one dtype"),
        };
        Tensor {
            dtype: DType::Bool,
            shape: self.shape.clone(),
            data: Data::B(out),
        }
    }

    pub fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
        let Data::B(c) = &cond.data else {
            unreachable!("verified: bool condition")
        };
        let data = match (&a.data, &b.data) {
            (Data::F(x), Data::F(y)) => Data::F(
                c.iter()
                    .zip(x.iter().zip(y))
                    .map(|(&c, (&x, &y))| if c { x } else { y })
                    .collect(),
            ),
            (Data::I(x), Data::I(y)) => Data::I(
                c.iter()
                    .zip(x.iter().zip(y))
                    .map(|(&c, (&x, &y))| if c { x } else { y })
                    .collect(),
            ),
            (Data::B(x), Data::B(y)) => Data::B(
                c.iter()
                    .zip(x.iter().zip(y))
                    .map(|(&c, (&x, &y))| if c { x } else { y })
                    .collect(),
            ),
            _ => unreachable!("verified: select branches have one dtype"),
        };
        Tensor {
            dtype: a.dtype,
            shape: a.shape.clone(),
            data,
        }
    }

    pub fn cast(&self, to: DType) -> Tensor {
        let data = match (&self.data, to) {
            (Data::F(v), d) if d.is_float() => Data::F(v.iter().map(|&x| round(d, x)).collect()),
            // Float to int truncates toward zero and saturates (NaN gives 0).
            (Data::F(v), d) if d.is_int() => Data::I(
                v.iter()
                    .map(|&x| {
                        if d == DType::I8 {
                            x as i8 as i32
                        } else {
                            x as i32
                        }
                    })
                    .collect(),
            ),
            (Data::F(v), _) => Data::B(v.iter().map(|&x| x != 0.0).collect()),
            (Data::I(v), d) if d.is_float() => {
                Data::F(v.iter().map(|&x| round(d, x as f32)).collect())
            }
            (Data::I(v), d) if d.is_int() => Data::I(v.iter().map(|&x| wrap(d, x)).collect()),
            (Data::I(v), _) => Data::B(v.iter().map(|&x| x != 0).collect()),
            (Data::B(v), d) if d.is_float() => {
                Data::F(v.iter().map(|&x| x as i32 as f32).collect())
            }
            (Data::B(v), d) if d.is_int() => Data::I(v.iter().map(|&x| x as i32).collect()),
            (Data::B(v), _) => Data::B(v.clone()),
        };
        Tensor {
            dtype: to,
            shape: self.shape.clone(),
            data,
        }
    }

    pub fn broadcast(&self, shape: &[usize]) -> Tensor {
        let off = shape.len() - self.shape.len();
        let st = strides(&self.shape);
        let mut picks = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |_, idx| {
            let mut flat = 0;
            for (d, &n) in self.shape.iter().enumerate() {
                let i = if n == 1 { 0 } else { idx[d + off] };
                flat += i * st[d];
            }
            picks.push(flat);
        });
        self.gather(&picks, shape.to_vec())
    }

    /// `times` copies of `self` side by side along `axis`.
    pub fn repeat(&self, times: usize, axis: usize) -> Tensor {
        let mut shape = self.shape.clone();
        let n = shape[axis];
        shape[axis] *= times;
        let st = strides(&self.shape);
        let mut picks = Vec::with_capacity(shape.iter().product());
        for_each_index(&shape, |_, idx| {
            let flat = idx
                .iter()
                .zip(&st)
                .enumerate()
                .map(|(d, (&i, &s))| if d == axis { i % n } else { i } * s)
                .sum::<usize>();
            picks.push(flat);
        });
        self.gather(&picks, shape)
    }

    pub fn reshape(&self, shape: &[usize]) -> Tensor {
        Tensor {
            dtype: self.dtype,
            shape: shape.to_vec(),
            data: self.data.clone(),
        }
    }

    pub fn iota(dtype: DType, shape: &[usize], dim: usize) -> Tensor {
        let mut v = Vec::with_capacity(shape.iter().product());
        for_each_index(shape, |_, idx| v.push(wrap(dtype, idx[dim] as i32)));
        Tensor {
            dtype,
            shape: shape.to_vec(),
            data: Data::I(v),
        }
    }

    pub fn reduce(&self, op: ReduceOp, axis: usize) -> Tensor {
        let mut out_shape = self.shape.clone();
        let n = out_shape.remove(axis);
        let outer: usize = self.shape[..axis].iter().product();
        let inner: usize = self.shape[axis + 1..].iter().product();
        let d = self.dtype;
        let data = match &self.data {
            Data::F(v) => {
                let mut out = Vec::with_capacity(outer * inner);
                for o in 0..outer {
                    for i in 0..inner {
                        // Accumulate in f32 (as TPUs and XLA do for bf16), round once.
                        let mut acc = match op {
                            ReduceOp::Sum => 0.0f32,
                            ReduceOp::Max => f32::NEG_INFINITY,
                            ReduceOp::Min => f32::INFINITY,
                        };
                        for k in 0..n {
                            let x = v[(o * n + k) * inner + i];
                            acc = match op {
                                ReduceOp::Sum => acc + x,
                                ReduceOp::Max => nan_max(acc, x),
                                ReduceOp::Min => nan_min(acc, x),
                            };
                        }
                        out.push(round(d, acc));
                    }
                }
                Data::F(out)
            }
            Data::I(v) => {
                let mut out = Vec::with_capacity(outer * inner);
                for o in 0..outer {
                    for i in 0..inner {
                        let mut acc = match op {
                            ReduceOp::Sum => 0i32,
                            ReduceOp::Max => i32::MIN,
                            ReduceOp::Min => i32::MAX,
                        };
                        for k in 0..n {
                            let x = v[(o * n + k) * inner + i];
                            acc = match op {
                                ReduceOp::Sum => acc.wrapping_add(x),
                                ReduceOp::Max => acc.max(x),
                                ReduceOp::Min => acc.min(x),
                            };
                        }
                        out.push(wrap(d, acc));
                    }
                }
                Data::I(out)
            }
            Data::B(_) => unreachable!("verified: no reductions over bools"),
        };
        Tensor {
            dtype: d,
            shape: out_shape,
            data,
        }
    }

    pub fn dot(&self, rhs: &Tensor, ta: bool, tb: bool) -> Tensor {
        let (m, k) = if ta {
            (self.shape[1], self.shape[0])
        } else {
            (self.shape[0], self.shape[1])
        };
        let n = if tb { rhs.shape[0] } else { rhs.shape[1] };
        let a_at = |i: usize, p: usize| if ta { p * m + i } else { i * k + p };
        let b_at = |p: usize, j: usize| if tb { j * k + p } else { p * n + j };
        match (&self.data, &rhs.data) {
            (Data::F(a), Data::F(b)) => {
                let mut out = vec![0f32; m * n];
                for i in 0..m {
                    for p in 0..k {
                        let x = a[a_at(i, p)];
                        let row = &mut out[i * n..(i + 1) * n];
                        for (j, o) in row.iter_mut().enumerate() {
                            *o += x * b[b_at(p, j)];
                        }
                    }
                }
                Tensor {
                    dtype: DType::F32,
                    shape: vec![m, n],
                    data: Data::F(out),
                }
            }
            (Data::I(a), Data::I(b)) => {
                let mut out = vec![0i32; m * n];
                for i in 0..m {
                    for p in 0..k {
                        let x = a[a_at(i, p)];
                        for j in 0..n {
                            out[i * n + j] =
                                out[i * n + j].wrapping_add(x.wrapping_mul(b[b_at(p, j)]));
                        }
                    }
                }
                Tensor {
                    dtype: DType::I32,
                    shape: vec![m, n],
                    data: Data::I(out),
                }
            }
            _ => unreachable!("verified: dot operands are numbers of one dtype"),
        }
    }
}

/// Maximum that propagates NaN (as StableHLO's maximum does).
fn nan_max(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.max(y)
    }
}

fn nan_min(x: f32, y: f32) -> f32 {
    if x.is_nan() || y.is_nan() {
        f32::NAN
    } else {
        x.min(y)
    }
}

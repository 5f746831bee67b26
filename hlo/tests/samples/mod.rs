//! Sample programs (test support): one module per op kind (plus a few combinations), for
//! compiling and running through the PJRT runtime (`run_samples.rs`).
//!
//! Most samples carry a [`Check`]: per-device inputs and expected outputs computed on the
//! host here, so the test can execute the module and compare.

use half::bf16;
use tessera_hlo::{
    ArrayData, ComparisonDirection as Dir, ComparisonType, CustomCall, DType, DotDims, FuncBuilder,
    Grouping, HloError, HostArray, Module, Precision, Reducer, Sharding, TensorType, Value,
};

/// Inputs and expected outputs of a sample, one list per device (device `i` runs with
/// `inputs[i]` and must produce `outputs[i]`).
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// Arguments of `@main`, per device.
    pub inputs: Vec<Vec<HostArray>>,
    /// Results of `@main`, per device.
    pub outputs: Vec<Vec<HostArray>>,
}

/// A sample program.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Unique name (what it exercises).
    pub name: &'static str,
    /// The module (`@main` is the entry point).
    pub module: Module,
    /// Numeric expectations, when the sample has them.
    pub check: Option<Check>,
}

impl Sample {
    /// Devices the program runs on: `num_replicas * num_partitions`.
    pub fn num_devices(&self) -> usize {
        self.module.num_replicas() as usize * self.module.num_partitions() as usize
    }
}

/// Every sample module, in a fixed order.
pub fn sample_modules() -> Result<Vec<Sample>, HloError> {
    let builders: [fn() -> Result<Sample, HloError>; 39] = [
        constants,
        unary_float,
        unary_bf16,
        unary_int,
        binary_float,
        binary_int,
        binary_bool,
        compare,
        select_clamp,
        convert,
        iota,
        broadcast,
        reshape_transpose_reverse,
        slice,
        dynamic_slice,
        dynamic_update_slice,
        concatenate,
        pad,
        dot_general,
        dot_general_mixed,
        reduce,
        reduce_with,
        while_loop,
        fori_loop,
        if_else,
        case,
        call,
        custom_call,
        all_to_all,
        all_gather,
        collective_permute,
        all_reduce,
        reduce_scatter,
        device_ids,
        cross_replica,
        mesh_2x2,
        sharded_matmul_psum,
        shardy_blocks,
        shardy_no_results,
    ];
    builders.iter().map(|b| b()).collect()
}

// ----- helpers -----

fn t(dims: &[i64], dtype: DType) -> TensorType {
    TensorType::new(dims.to_vec(), dtype)
}

/// The tensor type of a host array.
pub fn type_of(a: &HostArray) -> TensorType {
    let dims: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
    TensorType::new(dims, a.dtype())
}

fn array(dims: &[i64], data: ArrayData) -> Result<HostArray, HloError> {
    let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    HostArray::new(shape, data).map_err(|e| HloError::Literal {
        op: "stablehlo.constant",
        reason: e.to_string(),
    })
}

fn f32_lit(dims: &[i64], v: Vec<f32>) -> Result<HostArray, HloError> {
    array(dims, ArrayData::F32(v))
}

/// bf16 elements rounded from `v`.
fn bf16_lit(dims: &[i64], v: &[f32]) -> Result<HostArray, HloError> {
    array(
        dims,
        ArrayData::BF16(v.iter().map(|&x| bf16::from_f32(x)).collect()),
    )
}

fn i32_lit(dims: &[i64], v: Vec<i32>) -> Result<HostArray, HloError> {
    array(dims, ArrayData::I32(v))
}

fn i8_lit(dims: &[i64], v: Vec<i8>) -> Result<HostArray, HloError> {
    array(dims, ArrayData::I8(v))
}

fn bool_lit(dims: &[i64], v: Vec<bool>) -> Result<HostArray, HloError> {
    array(dims, ArrayData::Bool(v))
}

/// `value` in every element of a `dims` array of `dtype`.
fn splat_lit(value: f64, dims: &[i64], dtype: DType) -> Result<HostArray, HloError> {
    let n = dims.iter().product::<i64>() as usize;
    let shape: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    HostArray::from_f64(dtype, shape, &vec![value; n]).map_err(|e| HloError::Literal {
        op: "stablehlo.constant",
        reason: e.to_string(),
    })
}

fn scalar_lit(value: f64, dtype: DType) -> Result<HostArray, HloError> {
    splat_lit(value, &[], dtype)
}

/// `v` rounded to bf16 and back.
fn round_bf16(v: f32) -> f32 {
    bf16::from_f32(v).to_f32()
}

/// A check from each device's inputs and outputs, `io(d)` for device `d`.
fn per_device(
    devices: i32,
    io: impl Fn(i32) -> Result<(Vec<HostArray>, Vec<HostArray>), HloError>,
) -> Result<Option<Check>, HloError> {
    let (inputs, outputs) = (0..devices).map(io).collect::<Result<_, _>>()?;
    Ok(Some(Check { inputs, outputs }))
}

fn single(inputs: Vec<HostArray>, outputs: Vec<HostArray>) -> Option<Check> {
    Some(Check {
        inputs: vec![inputs],
        outputs: vec![outputs],
    })
}

/// Builds `@main` of a fresh module with `partitions` partitions.
fn sample<F>(
    name: &'static str,
    partitions: u32,
    check: Option<Check>,
    body: F,
) -> Result<Sample, HloError>
where
    F: FnOnce(&mut FuncBuilder<'_>) -> Result<Vec<Value>, HloError>,
{
    let mut module = Module::new(name);
    module.set_num_partitions(partitions)?;
    let mut f = module.func("main");
    let results = body(&mut f)?;
    if partitions > 1 {
        let with: Vec<_> = results
            .iter()
            .map(|&v| (v, Some(Sharding::Manual)))
            .collect();
        f.finish_with_shardings(&with)?;
    } else {
        f.finish(&results)?;
    }
    Ok(Sample {
        name,
        module,
        check,
    })
}

/// An argument, `{manual}`-sharded in multi-partition modules.
fn arg(f: &mut FuncBuilder<'_>, ty: TensorType) -> Result<Value, HloError> {
    if f.num_partitions() > 1 {
        f.arg_with_sharding(ty, Sharding::Manual)
    } else {
        f.arg(ty)
    }
}

fn map(v: &[f32], g: impl Fn(f32) -> f32) -> Vec<f32> {
    v.iter().map(|&x| g(x)).collect()
}

fn zip(a: &[f32], b: &[f32], g: impl Fn(f32, f32) -> f32) -> Vec<f32> {
    a.iter().zip(b).map(|(&x, &y)| g(x, y)).collect()
}

fn zip_i(a: &[i32], b: &[i32], g: impl Fn(i32, i32) -> i32) -> Vec<i32> {
    a.iter().zip(b).map(|(&x, &y)| g(x, y)).collect()
}

/// Row-major index of a multi-index.
fn flat(dims: &[i64], idx: &[i64]) -> usize {
    dims.iter().zip(idx).fold(0i64, |acc, (&d, &i)| acc * d + i) as usize
}

/// Every multi-index of `dims`, row-major.
fn indices(dims: &[i64]) -> Vec<Vec<i64>> {
    let n: i64 = dims.iter().product();
    (0..n)
        .map(|mut k| {
            let mut idx = vec![0; dims.len()];
            for j in (0..dims.len()).rev() {
                idx[j] = k % dims[j];
                k /= dims[j];
            }
            idx
        })
        .collect()
}

fn seq(n: usize, scale: f32, offset: f32) -> Vec<f32> {
    (0..n).map(|i| i as f32 * scale + offset).collect()
}

const GROUP4: [i64; 4] = [0, 1, 2, 3];

fn group4() -> Vec<Vec<i64>> {
    vec![GROUP4.to_vec()]
}

// ----- samples -----

fn constants() -> Result<Sample, HloError> {
    let lits = vec![
        f32_lit(
            &[2, 3],
            vec![1.0, -2.5, 0.1, f32::INFINITY, f32::NEG_INFINITY, 1.0e-7],
        )?,
        f32_lit(&[4], vec![3.0e20, -0.0, f32::MAX, f32::MIN_POSITIVE])?,
        bf16_lit(&[3], &[0.1, f32::INFINITY, -3.0])?,
        splat_lit(0.5, &[2, 2], DType::BF16)?,
        i32_lit(&[3], vec![i32::MIN, 0, i32::MAX])?,
        i8_lit(&[2, 2], vec![-128, -1, 0, 127])?,
        bool_lit(&[3], vec![true, false, true])?,
        scalar_lit(7.0, DType::I32)?,
        splat_lit(1.0, &[2, 3], DType::Bool)?,
        f32_lit(&[0, 2], vec![])?,
    ];
    // NaN compares unequal: check it separately through is_finite / compare below.
    let nan = f32_lit(&[2], vec![f32::NAN, 1.0])?;
    sample(
        "constants",
        1,
        single(
            vec![],
            lits.iter()
                .cloned()
                .chain([bool_lit(&[2], vec![true, false])?])
                .collect(),
        ),
        |f| {
            let mut out = Vec::new();
            for l in &lits {
                out.push(f.constant(l)?);
            }
            let n = f.constant(&nan)?;
            out.push(f.ne(n, n)?);
            Ok(out)
        },
    )
}

fn unary_float() -> Result<Sample, HloError> {
    let x = vec![0.25f32, 0.5, 1.5, 2.0, 3.7, 2.5];
    let y = vec![-2.5f32, -0.5, 0.0, 0.5, 1.5, 2.5];
    let sign = |v: f32| if v == 0.0 { 0.0 } else { v.signum() };
    let outputs = vec![
        f32_lit(&[6], map(&x, f32::exp))?,
        f32_lit(&[6], map(&x, f32::exp_m1))?,
        f32_lit(&[6], map(&x, f32::ln))?,
        f32_lit(&[6], map(&x, f32::ln_1p))?,
        f32_lit(&[6], map(&x, f32::tanh))?,
        f32_lit(&[6], map(&x, |v| 1.0 / (1.0 + (-v).exp())))?,
        f32_lit(&[6], map(&x, f32::sqrt))?,
        f32_lit(&[6], map(&x, |v| 1.0 / v.sqrt()))?,
        f32_lit(&[6], map(&x, f32::cbrt))?,
        f32_lit(&[6], map(&x, f32::sin))?,
        f32_lit(&[6], map(&x, f32::cos))?,
        f32_lit(&[6], map(&y, f32::floor))?,
        f32_lit(&[6], map(&y, f32::ceil))?,
        f32_lit(&[6], map(&y, f32::round_ties_even))?,
        f32_lit(&[6], map(&y, f32::round))?,
        f32_lit(&[6], map(&y, |v| -v))?,
        f32_lit(&[6], map(&y, f32::abs))?,
        f32_lit(&[6], map(&y, sign))?,
        bool_lit(&[6], vec![true; 6])?,
    ];
    let check = single(vec![f32_lit(&[6], x)?, f32_lit(&[6], y)?], outputs);
    sample("unary_float", 1, check, |f| {
        let x = f.arg(t(&[6], DType::F32))?;
        let y = f.arg(t(&[6], DType::F32))?;
        Ok(vec![
            f.exp(x)?,
            f.expm1(x)?,
            f.log(x)?,
            f.log1p(x)?,
            f.tanh(x)?,
            f.logistic(x)?,
            f.sqrt(x)?,
            f.rsqrt(x)?,
            f.cbrt(x)?,
            f.sin(x)?,
            f.cos(x)?,
            f.floor(y)?,
            f.ceil(y)?,
            f.round_nearest_even(y)?,
            f.round_nearest_afz(y)?,
            f.neg(y)?,
            f.abs(y)?,
            f.sign(y)?,
            f.is_finite(x)?,
        ])
    })
}

fn unary_bf16() -> Result<Sample, HloError> {
    let x = [0.5f32, 1.0, 2.0, 4.0];
    let bf = |v: &[f32]| bf16_lit(&[v.len() as i64], v);
    let r = round_bf16;
    let check = single(
        vec![bf(&x)?],
        vec![
            bf(&map(&x, |v| r(v).exp()))?,
            bf(&map(&x, |v| r(v).sqrt()))?,
            bf(&map(&x, |v| -v))?,
        ],
    );
    sample("unary_bf16", 1, check, |f| {
        let x = f.arg(t(&[4], DType::BF16))?;
        Ok(vec![f.exp(x)?, f.sqrt(x)?, f.neg(x)?])
    })
}

fn unary_int() -> Result<Sample, HloError> {
    let x = vec![-7i32, -1, 0, 1, 12, i32::MAX];
    let b = vec![true, false, true, false, false, true];
    let outputs = vec![
        i32_lit(&[6], x.iter().map(|v| v.wrapping_neg()).collect())?,
        i32_lit(&[6], x.iter().map(|v| v.wrapping_abs()).collect())?,
        i32_lit(&[6], x.iter().map(|v| v.signum()).collect())?,
        i32_lit(&[6], x.iter().map(|v| !v).collect())?,
        i32_lit(&[6], x.iter().map(|v| v.count_ones() as i32).collect())?,
        i32_lit(&[6], x.iter().map(|v| v.leading_zeros() as i32).collect())?,
        bool_lit(&[6], b.iter().map(|v| !v).collect())?,
    ];
    let check = single(vec![i32_lit(&[6], x)?, bool_lit(&[6], b)?], outputs);
    sample("unary_int", 1, check, |f| {
        let x = f.arg(t(&[6], DType::I32))?;
        let b = f.arg(t(&[6], DType::Bool))?;
        Ok(vec![
            f.neg(x)?,
            f.abs(x)?,
            f.sign(x)?,
            f.not(x)?,
            f.popcnt(x)?,
            f.clz(x)?,
            f.not(b)?,
        ])
    })
}

fn binary_float() -> Result<Sample, HloError> {
    let a = vec![1.5f32, -2.0, 3.25, 0.5, 7.0];
    let b = vec![0.5f32, 4.0, -1.5, 2.0, 3.0];
    let outputs = vec![
        f32_lit(&[5], zip(&a, &b, |x, y| x + y))?,
        f32_lit(&[5], zip(&a, &b, |x, y| x - y))?,
        f32_lit(&[5], zip(&a, &b, |x, y| x * y))?,
        f32_lit(&[5], zip(&a, &b, |x, y| x / y))?,
        f32_lit(&[5], zip(&a, &b, |x, y| x % y))?,
        f32_lit(&[5], zip(&a, &b, |x, y| x.abs().powf(y)))?,
        f32_lit(&[5], zip(&a, &b, f32::max))?,
        f32_lit(&[5], zip(&a, &b, f32::min))?,
        f32_lit(&[5], zip(&a, &b, f32::atan2))?,
    ];
    let check = single(vec![f32_lit(&[5], a)?, f32_lit(&[5], b)?], outputs);
    sample("binary_float", 1, check, |f| {
        let a = f.arg(t(&[5], DType::F32))?;
        let b = f.arg(t(&[5], DType::F32))?;
        let abs_a = f.abs(a)?;
        Ok(vec![
            f.add(a, b)?,
            f.sub(a, b)?,
            f.mul(a, b)?,
            f.div(a, b)?,
            f.rem(a, b)?,
            f.pow(abs_a, b)?,
            f.max(a, b)?,
            f.min(a, b)?,
            f.atan2(a, b)?,
        ])
    })
}

fn binary_int() -> Result<Sample, HloError> {
    let a = vec![7i32, -9, 100, 5, -1];
    let b = vec![2i32, 4, -7, 3, 1];
    let shift = vec![1i32, 4, 3, 3, 1];
    let outputs = vec![
        i32_lit(&[5], zip_i(&a, &b, |x, y| x + y))?,
        i32_lit(&[5], zip_i(&a, &b, |x, y| x - y))?,
        i32_lit(&[5], zip_i(&a, &b, |x, y| x * y))?,
        i32_lit(&[5], zip_i(&a, &b, |x, y| x / y))?,
        i32_lit(&[5], zip_i(&a, &b, |x, y| x % y))?,
        i32_lit(&[5], zip_i(&a, &b, i32::max))?,
        i32_lit(&[5], zip_i(&a, &b, i32::min))?,
        i32_lit(&[5], zip_i(&a, &b, |x, y| x & y))?,
        i32_lit(&[5], zip_i(&a, &b, |x, y| x | y))?,
        i32_lit(&[5], zip_i(&a, &b, |x, y| x ^ y))?,
        i32_lit(&[5], zip_i(&a, &shift, |x, y| x.wrapping_shl(y as u32)))?,
        i32_lit(&[5], zip_i(&a, &shift, |x, y| x >> y))?,
        i32_lit(&[5], zip_i(&a, &shift, |x, y| ((x as u32) >> y) as i32))?,
        i32_lit(&[5], vec![49, 81, 10000, 25, 1])?,
    ];
    let check = single(vec![i32_lit(&[5], a)?, i32_lit(&[5], b)?], outputs);
    sample("binary_int", 1, check, |f| {
        let a = f.arg(t(&[5], DType::I32))?;
        let b = f.arg(t(&[5], DType::I32))?;
        let s = f.constant(&i32_lit(&[5], shift.clone())?)?;
        let two = f.splat(2.0, t(&[5], DType::I32))?;
        Ok(vec![
            f.add(a, b)?,
            f.sub(a, b)?,
            f.mul(a, b)?,
            f.div(a, b)?,
            f.rem(a, b)?,
            f.max(a, b)?,
            f.min(a, b)?,
            f.and(a, b)?,
            f.or(a, b)?,
            f.xor(a, b)?,
            f.shift_left(a, s)?,
            f.shift_right_arithmetic(a, s)?,
            f.shift_right_logical(a, s)?,
            f.pow(a, two)?,
        ])
    })
}

fn binary_bool() -> Result<Sample, HloError> {
    let a = vec![true, true, false, false];
    let b = vec![true, false, true, false];
    let z =
        |g: fn(bool, bool) -> bool| a.iter().zip(&b).map(|(&x, &y)| g(x, y)).collect::<Vec<_>>();
    let outputs = vec![
        bool_lit(&[4], z(|x, y| x & y))?,
        bool_lit(&[4], z(|x, y| x | y))?,
        bool_lit(&[4], z(|x, y| x ^ y))?,
        bool_lit(&[4], z(|x, y| x | y))?,
    ];
    let check = single(
        vec![bool_lit(&[4], a.clone())?, bool_lit(&[4], b.clone())?],
        outputs,
    );
    sample("binary_bool", 1, check, |f| {
        let a = f.arg(t(&[4], DType::Bool))?;
        let b = f.arg(t(&[4], DType::Bool))?;
        Ok(vec![f.and(a, b)?, f.or(a, b)?, f.xor(a, b)?, f.max(a, b)?])
    })
}

fn compare() -> Result<Sample, HloError> {
    let a = vec![1.0f32, 2.0, 3.0, -0.0];
    let b = vec![2.0f32, 2.0, 1.0, 0.0];
    let ai = vec![1i32, 2, 3, -4];
    let bi = vec![2i32, 2, 1, 4];
    let ab = vec![true, false, true, false];
    let bb = vec![true, true, false, false];
    let dirs = [Dir::Eq, Dir::Ne, Dir::Lt, Dir::Le, Dir::Gt, Dir::Ge];
    fn cmp<T: PartialOrd>(d: Dir, x: T, y: T) -> bool {
        match d {
            Dir::Eq => x == y,
            Dir::Ne => x != y,
            Dir::Lt => x < y,
            Dir::Le => x <= y,
            Dir::Gt => x > y,
            Dir::Ge => x >= y,
        }
    }
    let mut outputs = Vec::new();
    for d in dirs {
        outputs.push(bool_lit(
            &[4],
            a.iter().zip(&b).map(|(&x, &y)| cmp(d, x, y)).collect(),
        )?);
        outputs.push(bool_lit(
            &[4],
            ai.iter().zip(&bi).map(|(&x, &y)| cmp(d, x, y)).collect(),
        )?);
        outputs.push(bool_lit(
            &[4],
            ab.iter().zip(&bb).map(|(&x, &y)| cmp(d, x, y)).collect(),
        )?);
    }
    // TOTALORDER: -0.0 < 0.0.
    outputs.push(bool_lit(&[4], vec![true, false, false, true])?);
    let inputs = vec![
        f32_lit(&[4], a)?,
        f32_lit(&[4], b)?,
        i32_lit(&[4], ai)?,
        i32_lit(&[4], bi)?,
        bool_lit(&[4], ab)?,
        bool_lit(&[4], bb)?,
    ];
    sample("compare", 1, single(inputs, outputs), |f| {
        let a = f.arg(t(&[4], DType::F32))?;
        let b = f.arg(t(&[4], DType::F32))?;
        let ai = f.arg(t(&[4], DType::I32))?;
        let bi = f.arg(t(&[4], DType::I32))?;
        let ab = f.arg(t(&[4], DType::Bool))?;
        let bb = f.arg(t(&[4], DType::Bool))?;
        let mut out = Vec::new();
        for d in dirs {
            out.push(f.compare(d, a, b)?);
            out.push(f.compare(d, ai, bi)?);
            out.push(f.compare(d, ab, bb)?);
        }
        out.push(f.compare_with_type(Dir::Lt, a, b, ComparisonType::TotalOrder)?);
        Ok(out)
    })
}

fn select_clamp() -> Result<Sample, HloError> {
    let p = vec![true, false, true, false];
    let a = vec![1.0f32, 2.0, 3.0, 4.0];
    let b = vec![-1.0f32, -2.0, -3.0, -4.0];
    let outputs = vec![
        f32_lit(&[4], vec![1.0, -2.0, 3.0, -4.0])?,
        f32_lit(&[4], vec![-1.0, -2.0, -3.0, -4.0])?,
        f32_lit(&[4], vec![1.5, 2.0, 2.5, 2.5])?,
    ];
    let check = single(
        vec![bool_lit(&[4], p)?, f32_lit(&[4], a)?, f32_lit(&[4], b)?],
        outputs,
    );
    sample("select_clamp", 1, check, |f| {
        let p = f.arg(t(&[4], DType::Bool))?;
        let a = f.arg(t(&[4], DType::F32))?;
        let b = f.arg(t(&[4], DType::F32))?;
        let s = f.select(p, a, b)?;
        let no = f.scalar(0.0, DType::Bool)?;
        let s2 = f.select(no, a, b)?;
        let lo = f.scalar(1.5, DType::F32)?;
        let hi = f.scalar(2.5, DType::F32)?;
        let c = f.clamp(lo, a, hi)?;
        Ok(vec![s, s2, c])
    })
}

fn convert() -> Result<Sample, HloError> {
    let x = vec![1.7f32, -2.5, 100.25, 0.1];
    let r = round_bf16;
    let outputs = vec![
        bf16_lit(&[4], &x)?,
        f32_lit(&[4], map(&x, r))?,
        i32_lit(&[4], x.iter().map(|&v| v as i32).collect())?,
        f32_lit(&[3], vec![-3.0, 0.0, 42.0])?,
        i32_lit(&[2], vec![1, 0])?,
        f32_lit(&[2], vec![-128.0, 127.0])?,
        bool_lit(&[3], vec![true, false, true])?,
    ];
    let inputs = vec![
        f32_lit(&[4], x)?,
        i32_lit(&[3], vec![-3, 0, 42])?,
        bool_lit(&[2], vec![true, false])?,
        i8_lit(&[2], vec![-128, 127])?,
    ];
    sample("convert", 1, single(inputs, outputs), |f| {
        let x = f.arg(t(&[4], DType::F32))?;
        let i = f.arg(t(&[3], DType::I32))?;
        let b = f.arg(t(&[2], DType::Bool))?;
        let s = f.arg(t(&[2], DType::I8))?;
        let xb = f.convert(x, DType::BF16)?;
        Ok(vec![
            xb,
            f.convert(xb, DType::F32)?,
            f.convert(x, DType::I32)?,
            f.convert(i, DType::F32)?,
            f.convert(b, DType::I32)?,
            f.convert(s, DType::F32)?,
            f.convert(i, DType::Bool)?,
        ])
    })
}

fn iota() -> Result<Sample, HloError> {
    let outputs = vec![
        i32_lit(&[2, 3], vec![0, 1, 2, 0, 1, 2])?,
        f32_lit(&[2, 3], vec![0.0, 0.0, 0.0, 1.0, 1.0, 1.0])?,
        bf16_lit(&[3], &[0.0, 1.0, 2.0])?,
    ];
    sample("iota", 1, single(vec![], outputs), |f| {
        Ok(vec![
            f.iota(t(&[2, 3], DType::I32), 1)?,
            f.iota(t(&[2, 3], DType::F32), 0)?,
            f.iota(t(&[3], DType::BF16), 0)?,
        ])
    })
}

fn broadcast() -> Result<Sample, HloError> {
    let v = vec![1.0f32, 2.0, 3.0];
    let outputs = vec![
        f32_lit(&[3, 2], vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0])?,
        f32_lit(&[2, 3], vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0])?,
        i32_lit(&[2, 2], vec![5; 4])?,
    ];
    sample(
        "broadcast_in_dim",
        1,
        single(vec![f32_lit(&[3], v)?], outputs),
        |f| {
            let x = f.arg(t(&[3], DType::F32))?;
            let five = f.scalar(5.0, DType::I32)?;
            Ok(vec![
                f.broadcast_in_dim(x, &[3, 2], &[0])?,
                f.broadcast(x, &[2, 3])?,
                f.broadcast(five, &[2, 2])?,
            ])
        },
    )
}

fn reshape_transpose_reverse() -> Result<Sample, HloError> {
    let x = seq(24, 1.0, 0.0);
    let dims = [2i64, 3, 4];
    // transpose [2,3,4] by [2,0,1] -> [4,2,3]
    let mut tr = vec![0f32; 24];
    for idx in indices(&[4, 2, 3]) {
        tr[flat(&[4, 2, 3], &idx)] = x[flat(&dims, &[idx[1], idx[2], idx[0]])];
    }
    let mut rev = vec![0f32; 24];
    for idx in indices(&dims) {
        rev[flat(&dims, &idx)] = x[flat(&dims, &[idx[0], 2 - idx[1], 3 - idx[2]])];
    }
    let outputs = vec![
        f32_lit(&[6, 4], x.clone())?,
        f32_lit(&[4, 2, 3], tr)?,
        f32_lit(&dims, rev)?,
    ];
    sample(
        "reshape_transpose_reverse",
        1,
        single(vec![f32_lit(&dims, x)?], outputs),
        |f| {
            let x = f.arg(t(&dims, DType::F32))?;
            Ok(vec![
                f.reshape(x, &[6, 4])?,
                f.transpose(x, &[2, 0, 1])?,
                f.reverse(x, &[1, 2])?,
            ])
        },
    )
}

fn slice() -> Result<Sample, HloError> {
    let x = seq(30, 1.0, 0.0);
    let dims = [5i64, 6];
    let strided: Vec<f32> = [1i64, 3]
        .iter()
        .flat_map(|&r| [0i64, 2, 4].map(|c| x[flat(&dims, &[r, c])]))
        .collect();
    let plain: Vec<f32> = [2i64, 3, 4]
        .iter()
        .flat_map(|&r| [4i64, 5].map(|c| x[flat(&dims, &[r, c])]))
        .collect();
    let outputs = vec![f32_lit(&[2, 3], strided)?, f32_lit(&[3, 2], plain)?];
    sample("slice", 1, single(vec![f32_lit(&dims, x)?], outputs), |f| {
        let x = f.arg(t(&dims, DType::F32))?;
        Ok(vec![
            f.slice_strided(x, &[1, 0], &[5, 6], &[2, 2])?,
            f.slice(x, &[2, 4], &[5, 6])?,
        ])
    })
}

fn dynamic_slice() -> Result<Sample, HloError> {
    let x = seq(20, 1.0, 0.0);
    let dims = [4i64, 5];
    let win = |r: i64, c: i64| -> Vec<f32> {
        (r..r + 2)
            .flat_map(|i| (c..c + 3).map(move |j| (i * 5 + j) as f32))
            .collect()
    };
    let outputs = vec![f32_lit(&[2, 3], win(1, 2))?, f32_lit(&[2, 3], win(2, 2))?];
    // Second start (3, 9) is clamped to (2, 2).
    let inputs = vec![
        f32_lit(&dims, x)?,
        scalar_lit(1.0, DType::I32)?,
        scalar_lit(2.0, DType::I32)?,
    ];
    sample("dynamic_slice", 1, single(inputs, outputs), |f| {
        let x = f.arg(t(&dims, DType::F32))?;
        let r = f.arg(TensorType::scalar(DType::I32))?;
        let c = f.arg(TensorType::scalar(DType::I32))?;
        let a = f.dynamic_slice(x, &[r, c], &[2, 3])?;
        let r2 = f.scalar(3.0, DType::I32)?;
        let c2 = f.scalar(9.0, DType::I32)?;
        let b = f.dynamic_slice(x, &[r2, c2], &[2, 3])?;
        Ok(vec![a, b])
    })
}

fn dynamic_update_slice() -> Result<Sample, HloError> {
    let dims = [3i64, 4];
    let mut expect = vec![0f32; 12];
    for (k, (i, j)) in [(1usize, 1usize), (1, 2), (2, 1), (2, 2)]
        .into_iter()
        .enumerate()
    {
        expect[i * 4 + j] = (k + 1) as f32;
    }
    let upd = f32_lit(&[2, 2], vec![1.0, 2.0, 3.0, 4.0])?;
    let inputs = vec![upd.clone(), scalar_lit(1.0, DType::I32)?];
    sample(
        "dynamic_update_slice",
        1,
        single(inputs, vec![f32_lit(&dims, expect)?]),
        |f| {
            let u = f.arg(t(&[2, 2], DType::F32))?;
            let i = f.arg(TensorType::scalar(DType::I32))?;
            let z = f.splat(0.0, t(&dims, DType::F32))?;
            Ok(vec![f.dynamic_update_slice(z, u, &[i, i])?])
        },
    )
}

fn concatenate() -> Result<Sample, HloError> {
    let a = vec![1.0f32, 2.0, 3.0, 4.0];
    let b = vec![5.0f32, 6.0];
    let outputs = vec![
        f32_lit(&[2, 3], vec![1.0, 2.0, 5.0, 3.0, 4.0, 6.0])?,
        f32_lit(&[3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0])?,
    ];
    let inputs = vec![
        f32_lit(&[2, 2], a)?,
        f32_lit(&[2, 1], b.clone())?,
        f32_lit(&[1, 2], b)?,
    ];
    sample("concatenate", 1, single(inputs, outputs), |f| {
        let a = f.arg(t(&[2, 2], DType::F32))?;
        let b = f.arg(t(&[2, 1], DType::F32))?;
        let c = f.arg(t(&[1, 2], DType::F32))?;
        Ok(vec![f.concatenate(&[a, b], 1)?, f.concatenate(&[a, c], 0)?])
    })
}

fn pad() -> Result<Sample, HloError> {
    // [1, 2, 3] with low -1, high 2, interior 1: [1,2,3] -> [1,p,2,p,3] -> drop 1 -> [p,2,p,3,p,p]
    let outputs = vec![f32_lit(&[6], vec![9.0, 2.0, 9.0, 3.0, 9.0, 9.0])?];
    sample(
        "pad",
        1,
        single(vec![f32_lit(&[3], vec![1.0, 2.0, 3.0])?], outputs),
        |f| {
            let x = f.arg(t(&[3], DType::F32))?;
            let p = f.scalar(9.0, DType::F32)?;
            Ok(vec![f.pad(x, p, &[-1], &[2], &[1])?])
        },
    )
}

fn dot_general() -> Result<Sample, HloError> {
    // lhs [b=2, k=4, m=3], rhs [b=2, n=5, k=4]: contract lhs 1 with rhs 2 -> [2, 3, 5].
    let (b, k, m, n) = (2i64, 4i64, 3i64, 5i64);
    let l = seq((b * k * m) as usize, 0.5, -2.0);
    let r = seq((b * n * k) as usize, 0.25, -3.0);
    let mut out = vec![0f32; (b * m * n) as usize];
    for idx in indices(&[b, m, n]) {
        let (bi, mi, ni) = (idx[0], idx[1], idx[2]);
        out[flat(&[b, m, n], &idx)] = (0..k)
            .map(|ki| l[flat(&[b, k, m], &[bi, ki, mi])] * r[flat(&[b, n, k], &[bi, ni, ki])])
            .sum();
    }
    let inputs = vec![f32_lit(&[b, k, m], l)?, f32_lit(&[b, n, k], r)?];
    sample(
        "dot_general",
        1,
        single(inputs, vec![f32_lit(&[b, m, n], out)?]),
        |f| {
            let l = f.arg(t(&[b, k, m], DType::F32))?;
            let r = f.arg(t(&[b, n, k], DType::F32))?;
            let dims = DotDims::new([0], [0], [1], [2]);
            Ok(vec![f.dot_general(
                l,
                r,
                &dims,
                DType::F32,
                Some([Precision::Highest, Precision::Highest]),
            )?])
        },
    )
}

fn dot_general_mixed() -> Result<Sample, HloError> {
    // bf16 x bf16 -> f32 matmul, and i8 x i8 -> i32.
    let a = [1.0f32, 2.0, 0.5, -1.0, 3.0, 0.25];
    let bm = [2.0f32, -1.0, 0.5, 4.0, 1.0, 1.0];
    let mm = |x: &[f32], y: &[f32]| -> Vec<f32> {
        // [2,3] x [3,2]
        (0..2)
            .flat_map(|i| (0..2).map(move |j| (0..3).map(|kk| x[i * 3 + kk] * y[kk * 2 + j]).sum()))
            .collect()
    };
    let ai: Vec<i8> = vec![1, -2, 3, 4, 5, -6];
    let bi: Vec<i8> = vec![7, 8, -9, 10, 11, 12];
    let af: Vec<f32> = ai.iter().map(|&v| f32::from(v)).collect();
    let bf: Vec<f32> = bi.iter().map(|&v| f32::from(v)).collect();
    let outputs = vec![
        f32_lit(&[2, 2], mm(&a, &bm))?,
        i32_lit(&[2, 2], mm(&af, &bf).iter().map(|&v| v as i32).collect())?,
    ];
    let inputs = vec![
        bf16_lit(&[2, 3], &a)?,
        bf16_lit(&[3, 2], &bm)?,
        i8_lit(&[2, 3], ai)?,
        i8_lit(&[3, 2], bi)?,
    ];
    sample("dot_general_mixed", 1, single(inputs, outputs), |f| {
        let a = f.arg(t(&[2, 3], DType::BF16))?;
        let b = f.arg(t(&[3, 2], DType::BF16))?;
        let ai = f.arg(t(&[2, 3], DType::I8))?;
        let bi = f.arg(t(&[3, 2], DType::I8))?;
        Ok(vec![
            f.matmul(a, b, DType::F32)?,
            f.dot_general(ai, bi, &DotDims::contracting([1], [0]), DType::I32, None)?,
        ])
    })
}

fn reduce() -> Result<Sample, HloError> {
    let x = vec![3.0f32, -1.0, 4.0, 1.0, -5.0, 9.0, 2.0, 6.0];
    let dims = [2i64, 4];
    let row_sum: Vec<f32> = (0..2).map(|i| x[i * 4..i * 4 + 4].iter().sum()).collect();
    let col_max: Vec<f32> = (0..4).map(|j| x[j].max(x[4 + j])).collect();
    let total_min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let xi: Vec<i32> = x.iter().map(|&v| v as i32).collect();
    let prod: i32 = xi.iter().product();
    let outputs = vec![
        f32_lit(&[2], row_sum)?,
        f32_lit(&[4], col_max)?,
        f32_lit(&[], vec![total_min])?,
        i32_lit(&[], vec![prod])?,
        bool_lit(&[2], vec![false, true])?,
    ];
    let inputs = vec![
        f32_lit(&dims, x)?,
        i32_lit(&dims, xi)?,
        bool_lit(&[2, 2], vec![true, false, true, true])?,
    ];
    sample("reduce", 1, single(inputs, outputs), |f| {
        let x = f.arg(t(&dims, DType::F32))?;
        let xi = f.arg(t(&dims, DType::I32))?;
        let b = f.arg(t(&[2, 2], DType::Bool))?;
        Ok(vec![
            f.reduce(x, &[1], Reducer::Sum)?,
            f.reduce(x, &[0], Reducer::Max)?,
            f.reduce(x, &[0, 1], Reducer::Min)?,
            f.reduce(xi, &[0, 1], Reducer::Prod)?,
            f.reduce(b, &[1], Reducer::And)?,
        ])
    })
}

fn reduce_with() -> Result<Sample, HloError> {
    // Argmax along dim 1 with a two-input reduce (values, indices).
    let x = vec![3.0f32, 7.0, 1.0, 9.0, 2.0, 8.0];
    let outputs = vec![f32_lit(&[2], vec![7.0, 9.0])?, i32_lit(&[2], vec![1, 0])?];
    sample(
        "reduce_with",
        1,
        single(vec![f32_lit(&[2, 3], x)?], outputs),
        |f| {
            let x = f.arg(t(&[2, 3], DType::F32))?;
            let idx = f.iota(t(&[2, 3], DType::I32), 1)?;
            let ninf = f.scalar(f64::NEG_INFINITY, DType::F32)?;
            let zero = f.scalar(0.0, DType::I32)?;
            f.reduce_with(&[x, idx], &[ninf, zero], &[1], |b, a| {
                // a = [acc_val, acc_idx, val, idx]
                let take = b.gt(a[2], a[0])?;
                Ok::<_, HloError>(vec![
                    b.select(take, a[2], a[0])?,
                    b.select(take, a[3], a[1])?,
                ])
            })
        },
    )
}

fn while_loop() -> Result<Sample, HloError> {
    // sum = 0; i = 0; while i < n: sum += x * i; i += 1  (x captured from outside the loop)
    let x = vec![1.0f32, 2.0];
    let n = 5;
    let tri = (0..n).sum::<i32>() as f32;
    let outputs = vec![i32_lit(&[], vec![n])?, f32_lit(&[2], map(&x, |v| v * tri))?];
    let inputs = vec![f32_lit(&[2], x)?, scalar_lit(f64::from(n), DType::I32)?];
    sample("while", 1, single(inputs, outputs), |f| {
        let x = f.arg(t(&[2], DType::F32))?;
        let n = f.arg(TensorType::scalar(DType::I32))?;
        let i0 = f.scalar(0.0, DType::I32)?;
        let s0 = f.splat(0.0, t(&[2], DType::F32))?;
        f.while_loop(
            &[i0, s0],
            |b, a| b.lt(a[0], n),
            |b, a| {
                let fi = b.convert(a[0], DType::F32)?;
                let fi = b.broadcast(fi, &[2])?;
                let xi = b.mul(x, fi)?;
                let s = b.add(a[1], xi)?;
                let one = b.scalar(1.0, DType::I32)?;
                Ok::<_, HloError>(vec![b.add(a[0], one)?, s])
            },
        )
    })
}

fn fori_loop() -> Result<Sample, HloError> {
    // x = x * 2 + i for i in 0..4
    let mut v = [1.0f32, -1.0];
    for i in 0..4 {
        v = v.map(|x| x * 2.0 + i as f32);
    }
    let check = single(
        vec![f32_lit(&[2], vec![1.0, -1.0])?],
        vec![f32_lit(&[2], v.to_vec())?],
    );
    sample("fori_loop", 1, check, |f| {
        let x = f.arg(t(&[2], DType::F32))?;
        let lo = f.scalar(0.0, DType::I32)?;
        let hi = f.scalar(4.0, DType::I32)?;
        let out = f.fori_loop(lo, hi, &[x], |b, i, c| {
            let two = b.splat(2.0, t(&[2], DType::F32))?;
            let fi = b.convert(i, DType::F32)?;
            let fi = b.broadcast(fi, &[2])?;
            let y = b.mul(c[0], two)?;
            Ok::<_, HloError>(vec![b.add(y, fi)?])
        })?;
        Ok(out)
    })
}

fn if_else() -> Result<Sample, HloError> {
    let x = vec![1.0f32, 4.0];
    let check = Some(Check {
        inputs: vec![vec![
            scalar_lit(1.0, DType::Bool)?,
            f32_lit(&[2], x.clone())?,
        ]],
        outputs: vec![vec![f32_lit(&[2], vec![2.0, 8.0])?, i32_lit(&[], vec![1])?]],
    });
    sample("if", 1, check, |f| {
        let p = f.arg(TensorType::scalar(DType::Bool))?;
        let x = f.arg(t(&[2], DType::F32))?;
        f.if_else(
            p,
            |b| {
                let y = b.add(x, x)?;
                Ok::<_, HloError>(vec![y, b.scalar(1.0, DType::I32)?])
            },
            |b| Ok(vec![b.sqrt(x)?, b.scalar(0.0, DType::I32)?]),
        )
    })
}

fn case() -> Result<Sample, HloError> {
    let check = single(
        vec![
            scalar_lit(2.0, DType::I32)?,
            f32_lit(&[2], vec![3.0, -4.0])?,
        ],
        vec![f32_lit(&[2], vec![3.0, 4.0])?],
    );
    sample("case", 1, check, |f| {
        let i = f.arg(TensorType::scalar(DType::I32))?;
        let x = f.arg(t(&[2], DType::F32))?;
        f.case(i, 3, |b, k| {
            Ok::<_, HloError>(vec![match k {
                0 => b.neg(x)?,
                1 => b.add(x, x)?,
                _ => b.abs(x)?,
            }])
        })
    })
}

fn call() -> Result<Sample, HloError> {
    let mut module = Module::new("call");
    let mut h = module.func("square_plus");
    h.set_public(false);
    let a = h.arg(t(&[3], DType::F32))?;
    let b = h.arg(t(&[3], DType::F32))?;
    let sq = h.mul(a, a)?;
    let r = h.add(sq, b)?;
    h.finish(&[r, sq])?;
    let mut f = module.func("main");
    let x = f.arg(t(&[3], DType::F32))?;
    let one = f.splat(1.0, t(&[3], DType::F32))?;
    let out = f.call("square_plus", &[x, one])?;
    f.finish(&out)?;
    let check = single(
        vec![f32_lit(&[3], vec![1.0, 2.0, 3.0])?],
        vec![
            f32_lit(&[3], vec![2.0, 5.0, 10.0])?,
            f32_lit(&[3], vec![1.0, 4.0, 9.0])?,
        ],
    );
    Ok(Sample {
        name: "call",
        module,
        check,
    })
}

fn custom_call() -> Result<Sample, HloError> {
    // `Sharding` is a custom call every XLA backend understands (the SPMD partitioner
    // consumes it); a runtime test can compile and run it.
    let check = single(
        vec![f32_lit(&[4], vec![1.0, 2.0, 3.0, 4.0])?],
        vec![f32_lit(&[4], vec![2.0, 4.0, 6.0, 8.0])?],
    );
    sample("custom_call", 1, check, |f| {
        let x = f.arg(t(&[4], DType::F32))?;
        let mut spec = CustomCall::new("Sharding");
        spec.sharding = Some(Sharding::Replicated);
        let y = f.custom_call(spec, &[x], &[t(&[4], DType::F32)])?;
        Ok(vec![f.add(y[0], y[0])?])
    })
}

/// Per-device inputs `[B=1, H=4, S/4=2, D=2]`, values encode (device, h, s, d).
fn ulysses_input(dev: usize) -> Vec<f32> {
    indices(&[1, 4, 2, 2])
        .iter()
        .map(|i| (dev * 1000 + i[1] as usize * 100 + i[2] as usize * 10 + i[3] as usize) as f32)
        .collect()
}

fn all_to_all() -> Result<Sample, HloError> {
    // [1, 4, 2, 2] split heads (dim 1) over 4 devices, concat sequence (dim 2): [1, 1, 8, 2].
    // Device j gets head j of every device, device i's block at sequence offset 2 * i.
    let mut inputs = Vec::new();
    let mut outputs = Vec::new();
    for j in 0..4usize {
        inputs.push(vec![f32_lit(&[1, 4, 2, 2], ulysses_input(j))?]);
        let mut out = Vec::new();
        for i in 0..4usize {
            for s in 0..2usize {
                for d in 0..2usize {
                    out.push((i * 1000 + j * 100 + s * 10 + d) as f32);
                }
            }
        }
        outputs.push(vec![f32_lit(&[1, 1, 8, 2], out)?]);
    }
    sample("all_to_all", 4, Some(Check { inputs, outputs }), |f| {
        let x = arg(f, t(&[1, 4, 2, 2], DType::F32))?;
        Ok(vec![f.all_to_all(
            x,
            1,
            2,
            &group4(),
            Grouping::FlattenedIds,
        )?])
    })
}

fn all_gather() -> Result<Sample, HloError> {
    let inputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| Ok(vec![f32_lit(&[2], vec![d as f32, d as f32 + 0.5])?]))
        .collect::<Result<_, HloError>>()?;
    let gathered: Vec<f32> = (0..4).flat_map(|d| [d as f32, d as f32 + 0.5]).collect();
    // Pairs {0,1} and {2,3} gather bf16 along a new leading axis as well.
    let outputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| {
            let base = (d / 2) * 2;
            let pair: Vec<f32> = (base..base + 2)
                .flat_map(|e| [e as f32, e as f32 + 0.5])
                .collect();
            Ok(vec![
                f32_lit(&[8], gathered.clone())?,
                bf16_lit(&[2, 2], &pair)?,
            ])
        })
        .collect::<Result<_, HloError>>()?;
    sample("all_gather", 4, Some(Check { inputs, outputs }), |f| {
        let x = arg(f, t(&[2], DType::F32))?;
        let all = f.all_gather(x, 0, &group4(), Grouping::FlattenedIds)?;
        let xb = f.convert(x, DType::BF16)?;
        let xb = f.reshape(xb, &[1, 2])?;
        let pairs = f.all_gather(xb, 0, &[vec![0, 1], vec![2, 3]], Grouping::FlattenedIds)?;
        Ok(vec![all, pairs])
    })
}

fn collective_permute() -> Result<Sample, HloError> {
    // Ring shift: device i sends to i + 1 (mod 4).
    let inputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| Ok(vec![f32_lit(&[2], vec![d as f32, 10.0 * d as f32])?]))
        .collect::<Result<_, HloError>>()?;
    let outputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| {
            let s = (d + 3) % 4;
            Ok(vec![f32_lit(&[2], vec![s as f32, 10.0 * s as f32])?])
        })
        .collect::<Result<_, HloError>>()?;
    sample(
        "collective_permute",
        4,
        Some(Check { inputs, outputs }),
        |f| {
            let x = arg(f, t(&[2], DType::F32))?;
            let pairs: Vec<(i64, i64)> = (0..4).map(|i| (i, (i + 1) % 4)).collect();
            Ok(vec![f.collective_permute(
                x,
                &pairs,
                Grouping::FlattenedIds,
            )?])
        },
    )
}

fn all_reduce() -> Result<Sample, HloError> {
    let inputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| {
            Ok(vec![
                f32_lit(&[2], vec![d as f32, 1.0])?,
                i32_lit(&[], vec![d * 3])?,
            ])
        })
        .collect::<Result<_, HloError>>()?;
    let outputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| {
            let pair_sum = if d < 2 { 1.0 } else { 5.0 };
            Ok(vec![
                f32_lit(&[2], vec![6.0, 4.0])?,
                i32_lit(&[], vec![9])?,
                f32_lit(&[2], vec![pair_sum, 2.0])?,
            ])
        })
        .collect::<Result<_, HloError>>()?;
    sample("all_reduce", 4, Some(Check { inputs, outputs }), |f| {
        let x = arg(f, t(&[2], DType::F32))?;
        let i = arg(f, TensorType::scalar(DType::I32))?;
        let sum = f.all_reduce(x, Reducer::Sum, &group4(), Grouping::FlattenedIds)?;
        let max = f.all_reduce_with(i, &group4(), Grouping::FlattenedIds, |b, a| {
            Ok::<_, HloError>(vec![b.max(a[0], a[1])?])
        })?;
        let pairs = f.all_reduce(
            x,
            Reducer::Sum,
            &[vec![0, 1], vec![2, 3]],
            Grouping::FlattenedIds,
        )?;
        Ok(vec![sum, max, pairs])
    })
}

fn reduce_scatter() -> Result<Sample, HloError> {
    // Every device holds [0..8) + d; the sum is 4 * [0..8) + 6; device d keeps block d.
    let inputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| Ok(vec![f32_lit(&[8], seq(8, 1.0, d as f32))?]))
        .collect::<Result<_, HloError>>()?;
    let total = seq(8, 4.0, 6.0);
    let outputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| Ok(vec![f32_lit(&[2], total[2 * d..2 * d + 2].to_vec())?]))
        .collect::<Result<_, HloError>>()?;
    sample("reduce_scatter", 4, Some(Check { inputs, outputs }), |f| {
        let x = arg(f, t(&[8], DType::F32))?;
        Ok(vec![f.reduce_scatter(
            x,
            0,
            Reducer::Sum,
            &group4(),
            Grouping::FlattenedIds,
        )?])
    })
}

fn device_ids() -> Result<Sample, HloError> {
    let outputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| Ok(vec![i32_lit(&[], vec![d])?, i32_lit(&[], vec![0])?]))
        .collect::<Result<_, HloError>>()?;
    let check = Some(Check {
        inputs: vec![vec![]; 4],
        outputs,
    });
    sample("partition_replica_id", 4, check, |f| {
        Ok(vec![f.partition_id(), f.replica_id()])
    })
}

fn cross_replica() -> Result<Sample, HloError> {
    // The replica form: mhlo.num_replicas = 4, no channel handles.
    let mut module = Module::new("cross_replica");
    module.set_num_replicas(4)?;
    let mut f = module.func("main");
    let x = f.arg(t(&[4], DType::F32))?;
    let s = f.all_reduce(x, Reducer::Sum, &group4(), Grouping::CrossReplica)?;
    let a = f.all_to_all(x, 0, 0, &group4(), Grouping::CrossReplica)?;
    let r = f.replica_id();
    f.finish(&[s, a, r])?;
    let inputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| Ok(vec![f32_lit(&[4], seq(4, 1.0, 10.0 * d as f32))?]))
        .collect::<Result<_, HloError>>()?;
    let sum: Vec<f32> = (0..4)
        .map(|j| (0..4).map(|d| 10.0 * d as f32 + j as f32).sum())
        .collect();
    let outputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| {
            let a2a: Vec<f32> = (0..4).map(|src| 10.0 * src as f32 + d as f32).collect();
            Ok(vec![
                f32_lit(&[4], sum.clone())?,
                f32_lit(&[4], a2a)?,
                i32_lit(&[], vec![d])?,
            ])
        })
        .collect::<Result<_, HloError>>()?;
    Ok(Sample {
        name: "cross_replica",
        module,
        check: Some(Check { inputs, outputs }),
    })
}

fn mesh_2x2() -> Result<Sample, HloError> {
    // 2 replicas x 2 partitions; device d = 2 * replica + partition holds [d, 10 + d].
    // all_gather over the partitions of one replica (cross_replica_and_partition), and
    // all_reduce over the replicas of one partition (flattened ids {0, 2}, {1, 3}).
    let mut module = Module::new("mesh_2x2");
    module.set_num_replicas(2)?;
    module.set_num_partitions(2)?;
    let mut f = module.func("main");
    let x = f.arg_with_sharding(t(&[2], DType::F32), Sharding::Manual)?;
    let g = f.all_gather(x, 0, &[vec![0], vec![1]], Grouping::CrossPartition)?;
    let s = f.all_reduce(
        x,
        Reducer::Sum,
        &[vec![0, 2], vec![1, 3]],
        Grouping::FlattenedIds,
    )?;
    let p = f.partition_id();
    let r = f.replica_id();
    let results: Vec<_> = [g, s, p, r]
        .into_iter()
        .map(|v| (v, Some(Sharding::Manual)))
        .collect();
    f.finish_with_shardings(&results)?;
    let check = per_device(4, |d| {
        let (r, p) = (d / 2, d % 2);
        let base = (2 * r) as f32;
        let inputs = vec![f32_lit(&[2], vec![d as f32, 10.0 + d as f32])?];
        let outputs = vec![
            f32_lit(&[4], vec![base, 10.0 + base, base + 1.0, 11.0 + base])?,
            f32_lit(&[2], vec![2.0 + 2.0 * p as f32, 22.0 + 2.0 * p as f32])?,
            i32_lit(&[], vec![p])?,
            i32_lit(&[], vec![r])?,
        ];
        Ok((inputs, outputs))
    })?;
    Ok(Sample {
        name: "mesh_2x2",
        module,
        check,
    })
}

fn shardy_blocks() -> Result<Sample, HloError> {
    // Shardy's form on a 2 x 2 mesh (`rows` major): x[4, 2] (x[i][j] = 10 i + j) split over
    // `rows` on dim 0 and `cols` on dim 1 ([2, 1] per device), a scalar s = 1.5 split nowhere.
    // Device d = 2 * row + col. Results: x gathered over `cols` and doubled by a private
    // function (split over `rows` only: [2, 2] per device), and s summed over all devices.
    let mut module = Module::new("shardy_blocks");
    module.set_mesh(&[("rows", 2), ("cols", 2)])?;
    let split = |axes: &[Option<&str>]| {
        Sharding::ManualSplit(axes.iter().map(|a| a.map(String::from)).collect())
    };
    {
        let mut double = module.func("double");
        double.set_public(false);
        let a = double.arg(t(&[2, 2], DType::F32))?;
        let r = double.add(a, a)?;
        double.finish(&[r])?;
    }
    let mut f = module.func("main");
    let x = f.arg_with_sharding(t(&[2, 1], DType::F32), split(&[Some("rows"), Some("cols")]))?;
    let s = f.arg_with_sharding(t(&[], DType::F32), split(&[]))?;
    let g = f.all_gather(x, 1, &[vec![0, 1], vec![2, 3]], Grouping::FlattenedIds)?;
    let g = f.call("double", &[g])?[0];
    let total = f.all_reduce(s, Reducer::Sum, &group4(), Grouping::FlattenedIds)?;
    f.finish_with_shardings(&[
        (g, Some(split(&[Some("rows"), None]))),
        (total, Some(split(&[]))),
    ])?;
    let x = |i: i32, j: i32| (10 * i + j) as f32;
    let check = per_device(4, |d| {
        let (row, col) = (d / 2, d % 2);
        let rows = [2 * row, 2 * row + 1];
        let inputs = vec![
            f32_lit(&[2, 1], rows.iter().map(|&i| x(i, col)).collect())?,
            f32_lit(&[], vec![1.5])?,
        ];
        let doubled = rows.iter().flat_map(|&i| [2.0 * x(i, 0), 2.0 * x(i, 1)]);
        let outputs = vec![
            f32_lit(&[2, 2], doubled.collect())?,
            f32_lit(&[], vec![6.0])?,
        ];
        Ok((inputs, outputs))
    })?;
    Ok(Sample {
        name: "shardy_blocks",
        module,
        check,
    })
}

fn shardy_no_results() -> Result<Sample, HloError> {
    // Shardy's form of a function with no arguments and no results.
    let mut module = Module::new("shardy_no_results");
    module.set_mesh(&[("all", 4)])?;
    let mut f = module.func("main");
    let _ = f.partition_id();
    f.finish(&[])?;
    Ok(Sample {
        name: "shardy_no_results",
        module,
        check: None,
    })
}

fn sharded_matmul_psum() -> Result<Sample, HloError> {
    // Row-parallel matmul: x[2, 8] and w[8, 3] sharded on the contracting dimension over 4
    // devices ([2, 2] x [2, 3] each), partial products summed with all_reduce.
    let x = seq(16, 0.5, -1.0);
    let w = seq(24, 0.25, -2.0);
    let full: Vec<f32> = (0..2)
        .flat_map(|i| {
            let (x, w) = (&x, &w);
            (0..3).map(move |j| (0..8).map(|k| x[i * 8 + k] * w[k * 3 + j]).sum())
        })
        .collect();
    let inputs: Vec<Vec<HostArray>> = (0..4)
        .map(|d| {
            let xs: Vec<f32> = (0..2)
                .flat_map(|i| x[i * 8 + 2 * d..i * 8 + 2 * d + 2].to_vec())
                .collect();
            let ws = w[6 * d..6 * d + 6].to_vec();
            Ok(vec![f32_lit(&[2, 2], xs)?, f32_lit(&[2, 3], ws)?])
        })
        .collect::<Result<_, HloError>>()?;
    let outputs = (0..4)
        .map(|_| Ok(vec![f32_lit(&[2, 3], full.clone())?]))
        .collect::<Result<_, HloError>>()?;
    sample(
        "sharded_matmul_psum",
        4,
        Some(Check { inputs, outputs }),
        |f| {
            let x = arg(f, t(&[2, 2], DType::F32))?;
            let w = arg(f, t(&[2, 3], DType::F32))?;
            let p = f.dot_general(
                x,
                w,
                &DotDims::contracting([1], [0]),
                DType::F32,
                Some([Precision::Highest; 2]),
            )?;
            Ok(vec![f.all_reduce(
                p,
                Reducer::Sum,
                &group4(),
                Grouping::FlattenedIds,
            )?])
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_hlo::{BinaryOp, Op, UnaryOp};

    fn collect_names(ops: &[Op], names: &mut std::collections::BTreeSet<&'static str>) {
        for op in ops {
            names.insert(op.kind.name());
            for r in &op.regions {
                collect_names(&r.ops, names);
            }
        }
    }

    #[test]
    fn samples_cover_every_op() {
        let mut names = std::collections::BTreeSet::new();
        for s in sample_modules().unwrap() {
            for f in s.module.funcs() {
                collect_names(&f.body().ops, &mut names);
            }
        }
        let mut expected: Vec<&str> = vec![
            "stablehlo.constant",
            "stablehlo.compare",
            "stablehlo.select",
            "stablehlo.clamp",
            "stablehlo.convert",
            "stablehlo.iota",
            "stablehlo.broadcast_in_dim",
            "stablehlo.reshape",
            "stablehlo.transpose",
            "stablehlo.reverse",
            "stablehlo.slice",
            "stablehlo.dynamic_slice",
            "stablehlo.dynamic_update_slice",
            "stablehlo.concatenate",
            "stablehlo.pad",
            "stablehlo.dot_general",
            "stablehlo.reduce",
            "stablehlo.while",
            "stablehlo.case",
            "stablehlo.if",
            "stablehlo.custom_call",
            "func.call",
            "stablehlo.all_to_all",
            "stablehlo.all_gather",
            "stablehlo.collective_permute",
            "stablehlo.all_reduce",
            "stablehlo.reduce_scatter",
            "stablehlo.partition_id",
            "stablehlo.replica_id",
        ];
        expected.extend(UnaryOp::ALL.iter().map(|u| u.op_name()));
        expected.extend(BinaryOp::ALL.iter().map(|b| b.op_name()));
        let missing: Vec<&str> = expected
            .into_iter()
            .filter(|n| !names.contains(n))
            .collect();
        assert!(missing.is_empty(), "ops without a sample: {missing:?}");
    }

    #[test]
    fn samples_build_and_are_consistent() {
        let samples = sample_modules().unwrap();
        let mut names: Vec<&str> = samples.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), samples.len(), "sample names are unique");
        for s in &samples {
            s.module.verify().unwrap();
            let main = s.module.get_func("main").unwrap();
            if let Some(c) = &s.check {
                assert_eq!(c.inputs.len(), s.num_devices(), "{}", s.name);
                assert_eq!(c.outputs.len(), s.num_devices(), "{}", s.name);
                for (ins, outs) in c.inputs.iter().zip(&c.outputs) {
                    let it: Vec<TensorType> = ins.iter().map(type_of).collect();
                    let ot: Vec<TensorType> = outs.iter().map(type_of).collect();
                    assert_eq!(it, main.arg_types(), "{} inputs", s.name);
                    assert_eq!(ot, main.result_types(), "{} outputs", s.name);
                }
            }
        }
    }
}

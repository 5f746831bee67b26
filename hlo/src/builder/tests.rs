//! Builder tests: exact emitted text for representative ops, and one test per check that the
//! error names the op and the mismatch.

use crate::ops::{
    ComparisonDirection, ComparisonType, CustomCall, CustomCallApiVersion, DotDims, Grouping,
    OutputOperandAlias, Precision, Reducer, Sharding, UnaryOp, Value,
};
use half::bf16;

use crate::{DType, FuncBuilder, HloError, HostArray, Module, TensorType};

fn t(dims: &[i64], dtype: DType) -> TensorType {
    TensorType::new(dims.to_vec(), dtype)
}

fn f32t(dims: &[i64]) -> TensorType {
    t(dims, DType::F32)
}

/// Builds `@main` in a module with `partitions` partitions and returns the text.
fn text(
    partitions: u32,
    body: impl FnOnce(&mut FuncBuilder<'_>) -> Result<Vec<Value>, HloError>,
) -> String {
    let mut m = Module::new("t");
    m.set_num_partitions(partitions).unwrap();
    let mut f = m.func("main");
    let r = body(&mut f).unwrap();
    f.finish(&r).unwrap();
    m.to_mlir()
}

/// The body lines of `@main` (between the signature and the closing brace), dedented.
fn body(
    partitions: u32,
    f: impl FnOnce(&mut FuncBuilder<'_>) -> Result<Vec<Value>, HloError>,
) -> String {
    let full = text(partitions, f);
    let lines: Vec<&str> = full.lines().collect();
    lines[2..lines.len() - 2]
        .iter()
        .map(|l| &l[4..])
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `f` in a fresh builder and returns its error.
fn err(f: impl FnOnce(&mut FuncBuilder<'_>) -> Result<(), HloError>) -> HloError {
    err_in(1, f)
}

fn err_in(
    partitions: u32,
    f: impl FnOnce(&mut FuncBuilder<'_>) -> Result<(), HloError>,
) -> HloError {
    let mut m = Module::new("t");
    m.set_num_partitions(partitions).unwrap();
    let mut b = m.func("main");
    f(&mut b).expect_err("expected an error")
}

/// Asserts the message starts with the op name and contains `needle`.
#[track_caller]
fn expect(e: HloError, op: &str, needle: &str) {
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("{op}:")),
        "message does not start with {op}: {msg}"
    );
    assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    assert_eq!(e.op(), op);
}

// ---------------------------------------------------------------- exact text

#[test]
fn module_and_signature_text() {
    let mut m = Module::new("sig");
    m.set_num_partitions(4).unwrap();
    m.set_num_replicas(1).unwrap();
    let mut h = m.func("helper");
    h.set_public(false);
    let a = h.arg(f32t(&[2])).unwrap();
    let n = h.neg(a).unwrap();
    h.finish(&[n]).unwrap();
    let mut f = m.func("main");
    let x = f.arg_with_sharding(f32t(&[2]), Sharding::Manual).unwrap();
    let y = f.arg(TensorType::scalar(DType::I32)).unwrap();
    let r = f.call("helper", &[x]).unwrap();
    f.finish_with_shardings(&[(r[0], Some(Sharding::Manual)), (y, None)])
        .unwrap();
    let expected = r#"module @sig attributes {mhlo.num_partitions = 4 : i32, mhlo.num_replicas = 1 : i32} {
  func.func private @helper(%arg0: tensor<2xf32>) -> (tensor<2xf32>) {
    %0 = "stablehlo.negate"(%arg0) : (tensor<2xf32>) -> tensor<2xf32>
    "func.return"(%0) : (tensor<2xf32>) -> ()
  }

  func.func public @main(%arg0: tensor<2xf32> {mhlo.sharding = "{manual}"}, %arg1: tensor<i32>) -> (tensor<2xf32> {mhlo.sharding = "{manual}"}, tensor<i32>) {
    %0 = "func.call"(%arg0) {callee = @helper} : (tensor<2xf32>) -> tensor<2xf32>
    "func.return"(%0, %arg1) : (tensor<2xf32>, tensor<i32>) -> ()
  }
}
"#;
    assert_eq!(m.to_mlir(), expected);
    assert_eq!(m.to_string(), expected);
}

#[test]
fn elementwise_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[4]))?;
        let c = f.splat(1.5, f32t(&[4]))?;
        let s = f.add(x, c)?;
        let e = f.unary(UnaryOp::Exp, s)?;
        let lt = f.lt(e, x)?;
        let tot = f.compare_with_type(ComparisonDirection::Ge, e, x, ComparisonType::TotalOrder)?;
        let both = f.and(lt, tot)?;
        let sel = f.select(both, e, x)?;
        let i = f.convert(sel, DType::BF16)?;
        Ok(vec![i])
    });
    let expected = r#"%0 = "stablehlo.constant"() {value = dense<1.5> : tensor<4xf32>} : () -> tensor<4xf32>
%1 = "stablehlo.add"(%arg0, %0) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
%2 = "stablehlo.exponential"(%1) : (tensor<4xf32>) -> tensor<4xf32>
%3 = "stablehlo.compare"(%2, %arg0) {compare_type = #stablehlo<comparison_type FLOAT>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
%4 = "stablehlo.compare"(%2, %arg0) {compare_type = #stablehlo<comparison_type TOTALORDER>, comparison_direction = #stablehlo<comparison_direction GE>} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>
%5 = "stablehlo.and"(%3, %4) : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
%6 = "stablehlo.select"(%5, %2, %arg0) : (tensor<4xi1>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
%7 = "stablehlo.convert"(%6) : (tensor<4xf32>) -> tensor<4xbf16>
"func.return"(%7) : (tensor<4xbf16>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn constants_text() {
    let b = body(1, |f| {
        Ok(vec![
            f.constant(
                &HostArray::f32([2, 2], vec![1.0, f32::INFINITY, f32::NAN, -0.25]).unwrap(),
            )?,
            f.constant(
                &HostArray::bf16([2], vec![bf16::from_f32(0.1), bf16::NEG_INFINITY]).unwrap(),
            )?,
            f.scalar(-3.0, DType::I8)?,
            f.scalar(1.0, DType::Bool)?,
            f.splat(7.0, t(&[3], DType::I32))?,
        ])
    });
    let expected = r#"%0 = "stablehlo.constant"() {value = dense<[[1.0, 0x7F800000], [0x7FC00000, -0.25]]> : tensor<2x2xf32>} : () -> tensor<2x2xf32>
%1 = "stablehlo.constant"() {value = dense<[0.1, 0xFF80]> : tensor<2xbf16>} : () -> tensor<2xbf16>
%2 = "stablehlo.constant"() {value = dense<-3> : tensor<i8>} : () -> tensor<i8>
%3 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
%4 = "stablehlo.constant"() {value = dense<7> : tensor<3xi32>} : () -> tensor<3xi32>
"func.return"(%0, %1, %2, %3, %4) : (tensor<2x2xf32>, tensor<2xbf16>, tensor<i8>, tensor<i1>, tensor<3xi32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn shape_ops_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[2, 3]))?;
        let i = f.arg(TensorType::scalar(DType::I32))?;
        let p = f.scalar(0.0, DType::F32)?;
        Ok(vec![
            f.iota(t(&[2, 3], DType::I32), 1)?,
            f.broadcast_in_dim(x, &[4, 2, 3], &[1, 2])?,
            f.reshape(x, &[3, 2])?,
            f.transpose(x, &[1, 0])?,
            f.reverse(x, &[0])?,
            f.slice_strided(x, &[0, 1], &[2, 3], &[1, 2])?,
            f.dynamic_slice(x, &[i, i], &[1, 2])?,
            f.dynamic_update_slice(x, x, &[i, i])?,
            f.concatenate(&[x, x], 0)?,
            f.pad(x, p, &[0, 1], &[1, -1], &[1, 0])?,
        ])
    });
    let expected = r#"%0 = "stablehlo.constant"() {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
%1 = "stablehlo.iota"() {iota_dimension = 1 : i64} : () -> tensor<2x3xi32>
%2 = "stablehlo.broadcast_in_dim"(%arg0) {broadcast_dimensions = array<i64: 1, 2>} : (tensor<2x3xf32>) -> tensor<4x2x3xf32>
%3 = "stablehlo.reshape"(%arg0) : (tensor<2x3xf32>) -> tensor<3x2xf32>
%4 = "stablehlo.transpose"(%arg0) {permutation = array<i64: 1, 0>} : (tensor<2x3xf32>) -> tensor<3x2xf32>
%5 = "stablehlo.reverse"(%arg0) {dimensions = array<i64: 0>} : (tensor<2x3xf32>) -> tensor<2x3xf32>
%6 = "stablehlo.slice"(%arg0) {limit_indices = array<i64: 2, 3>, start_indices = array<i64: 0, 1>, strides = array<i64: 1, 2>} : (tensor<2x3xf32>) -> tensor<2x1xf32>
%7 = "stablehlo.dynamic_slice"(%arg0, %arg1, %arg1) {slice_sizes = array<i64: 1, 2>} : (tensor<2x3xf32>, tensor<i32>, tensor<i32>) -> tensor<1x2xf32>
%8 = "stablehlo.dynamic_update_slice"(%arg0, %arg0, %arg1, %arg1) : (tensor<2x3xf32>, tensor<2x3xf32>, tensor<i32>, tensor<i32>) -> tensor<2x3xf32>
%9 = "stablehlo.concatenate"(%arg0, %arg0) {dimension = 0 : i64} : (tensor<2x3xf32>, tensor<2x3xf32>) -> tensor<4x3xf32>
%10 = "stablehlo.pad"(%arg0, %0) {edge_padding_high = array<i64: 1, -1>, edge_padding_low = array<i64: 0, 1>, interior_padding = array<i64: 1, 0>} : (tensor<2x3xf32>, tensor<f32>) -> tensor<4x3xf32>
"func.return"(%1, %2, %3, %4, %5, %6, %7, %8, %9, %10) : (tensor<2x3xi32>, tensor<4x2x3xf32>, tensor<3x2xf32>, tensor<3x2xf32>, tensor<2x3xf32>, tensor<2x1xf32>, tensor<1x2xf32>, tensor<2x3xf32>, tensor<4x3xf32>, tensor<4x3xf32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn row_gather_and_scatter_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[5, 2, 3]))?;
        let ids = f.arg(t(&[4], DType::I32))?;
        let rows = f.arg(f32t(&[4, 2, 3]))?;
        let v = f.arg(f32t(&[5]))?;
        Ok(vec![
            f.gather_rows(x, ids)?,
            f.scatter_add_rows(x, ids, rows)?,
            f.gather_rows(v, ids)?,
        ])
    });
    let expected = r#"%0 = "stablehlo.gather"(%arg0, %arg1) {dimension_numbers = #stablehlo.gather<offset_dims = [1, 2], collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1, 2, 3>} : (tensor<5x2x3xf32>, tensor<4xi32>) -> tensor<4x2x3xf32>
%1 = "stablehlo.scatter"(%arg0, %arg1, %arg2) ({
^bb0(%2: tensor<f32>, %3: tensor<f32>):
  %4 = "stablehlo.add"(%2, %3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  "stablehlo.return"(%4) : (tensor<f32>) -> ()
}) {indices_are_sorted = false, scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1, 2], inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, unique_indices = false} : (tensor<5x2x3xf32>, tensor<4xi32>, tensor<4x2x3xf32>) -> tensor<5x2x3xf32>
%5 = "stablehlo.gather"(%arg3, %arg1) {dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], start_index_map = [0], index_vector_dim = 1>, indices_are_sorted = false, slice_sizes = array<i64: 1>} : (tensor<5xf32>, tensor<4xi32>) -> tensor<4xf32>
"func.return"(%0, %1, %5) : (tensor<4x2x3xf32>, tensor<5x2x3xf32>, tensor<4xf32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn row_gather_and_scatter_errors() {
    let ids = |f: &mut FuncBuilder<'_>, dims: &[i64], dtype| f.arg(t(dims, dtype));
    expect(
        with_x(&[5, 2], |f, x| {
            let i = ids(f, &[4], DType::I8)?;
            f.gather_rows(x, i)
        }),
        "stablehlo.gather",
        "indices has element type i8, expected i32",
    );
    expect(
        with_x(&[5, 2], |f, x| {
            let i = ids(f, &[4, 1], DType::I32)?;
            f.gather_rows(x, i)
        }),
        "stablehlo.gather",
        "the indices must be one row index each, [N], got tensor<4x1xi32>",
    );
    expect(
        with_x(&[], |f, x| {
            let i = ids(f, &[4], DType::I32)?;
            f.gather_rows(x, i)
        }),
        "stablehlo.gather",
        "the operand is a scalar; it has no rows",
    );
    expect(
        with_x(&[5, 2], |f, x| {
            let i = ids(f, &[4], DType::I32)?;
            let u = f.arg(f32t(&[3, 2]))?;
            f.scatter_add_rows(x, i, u)
        }),
        "stablehlo.scatter",
        "updates must be 4 rows of the operand's rows (same dtype), one per index",
    );
}

#[test]
fn optimization_barrier_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[2, 3]))?;
        Ok(vec![f.optimization_barrier(x)?])
    });
    let expected = r#"%0 = "stablehlo.optimization_barrier"(%arg0) : (tensor<2x3xf32>) -> tensor<2x3xf32>
"func.return"(%0) : (tensor<2x3xf32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn optimization_barrier_of_several_values_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[2, 3]))?;
        let y = f.arg(t(&[4], DType::I32))?;
        let both = f.optimization_barrier_all(&[x, y])?;
        assert!(f.optimization_barrier_all(&[]).is_err());
        Ok(both)
    });
    let expected = r#"%0, %1 = "stablehlo.optimization_barrier"(%arg0, %arg1) : (tensor<2x3xf32>, tensor<4xi32>) -> (tensor<2x3xf32>, tensor<4xi32>)
"func.return"(%0, %1) : (tensor<2x3xf32>, tensor<4xi32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn dot_general_text_and_shape() {
    let b = body(1, |f| {
        // [b=2, m=3, k=4] x [b=2, k=4, n=5] in bf16, accumulated in f32.
        let l = f.arg(t(&[2, 3, 4], DType::BF16))?;
        let r = f.arg(t(&[2, 4, 5], DType::BF16))?;
        let d = DotDims::new([0], [0], [2], [1]);
        let a = f.dot_general(
            l,
            r,
            &d,
            DType::F32,
            Some([Precision::Default, Precision::Highest]),
        )?;
        let m = f.matmul(l, r, DType::BF16)?;
        Ok(vec![a, m])
    });
    let expected = r#"%0 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>, precision_config = [#stablehlo<precision DEFAULT>, #stablehlo<precision HIGHEST>]} : (tensor<2x3x4xbf16>, tensor<2x4x5xbf16>) -> tensor<2x3x5xf32>
%1 = "stablehlo.dot_general"(%arg0, %arg1) {dot_dimension_numbers = #stablehlo.dot<lhs_batching_dimensions = [0], rhs_batching_dimensions = [0], lhs_contracting_dimensions = [2], rhs_contracting_dimensions = [1]>} : (tensor<2x3x4xbf16>, tensor<2x4x5xbf16>) -> tensor<2x3x5xbf16>
"func.return"(%0, %1) : (tensor<2x3x5xf32>, tensor<2x3x5xbf16>) -> ()"#;
    assert_eq!(b, expected);
    // Free dimensions keep their order: lhs [k, m, b] x rhs [n, b, k] -> [b, m, n].
    let b = body(1, |f| {
        let l = f.arg(f32t(&[4, 3, 2]))?;
        let r = f.arg(f32t(&[5, 2, 4]))?;
        let a = f.dot_general(l, r, &DotDims::new([2], [1], [0], [2]), DType::F32, None)?;
        assert_eq!(f.value_type(a)?, &f32t(&[2, 3, 5]));
        Ok(vec![a])
    });
    assert!(b.contains("-> tensor<2x3x5xf32>"), "{b}");
}

#[test]
fn reduce_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[4, 8]))?;
        Ok(vec![f.reduce(x, &[1], Reducer::Max)?])
    });
    let expected = r#"%0 = "stablehlo.constant"() {value = dense<0xFF800000> : tensor<f32>} : () -> tensor<f32>
%1 = "stablehlo.reduce"(%arg0, %0) ({
^bb0(%2: tensor<f32>, %3: tensor<f32>):
  %4 = "stablehlo.maximum"(%2, %3) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  "stablehlo.return"(%4) : (tensor<f32>) -> ()
}) {dimensions = array<i64: 1>} : (tensor<4x8xf32>, tensor<f32>) -> tensor<4xf32>
"func.return"(%1) : (tensor<4xf32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn while_and_if_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[2]))?;
        let i0 = f.scalar(0.0, DType::I32)?;
        let out = f.while_loop(
            &[i0, x],
            |c, a| {
                let n = c.scalar(3.0, DType::I32)?;
                c.lt(a[0], n)
            },
            |c, a| {
                let one = c.scalar(1.0, DType::I32)?;
                Ok::<_, HloError>(vec![c.add(a[0], one)?, c.add(a[1], x)?])
            },
        )?;
        let p = f.scalar(1.0, DType::Bool)?;
        let r = f.if_else(
            p,
            |b| Ok::<_, HloError>(vec![b.neg(out[1])?]),
            |_| Ok(vec![x]),
        )?;
        Ok(r)
    });
    let expected = r#"%0 = "stablehlo.constant"() {value = dense<0> : tensor<i32>} : () -> tensor<i32>
%1, %2 = "stablehlo.while"(%0, %arg0) ({
^bb0(%3: tensor<i32>, %4: tensor<2xf32>):
  %5 = "stablehlo.constant"() {value = dense<3> : tensor<i32>} : () -> tensor<i32>
  %6 = "stablehlo.compare"(%3, %5) {compare_type = #stablehlo<comparison_type SIGNED>, comparison_direction = #stablehlo<comparison_direction LT>} : (tensor<i32>, tensor<i32>) -> tensor<i1>
  "stablehlo.return"(%6) : (tensor<i1>) -> ()
}, {
^bb0(%7: tensor<i32>, %8: tensor<2xf32>):
  %9 = "stablehlo.constant"() {value = dense<1> : tensor<i32>} : () -> tensor<i32>
  %10 = "stablehlo.add"(%7, %9) : (tensor<i32>, tensor<i32>) -> tensor<i32>
  %11 = "stablehlo.add"(%8, %arg0) : (tensor<2xf32>, tensor<2xf32>) -> tensor<2xf32>
  "stablehlo.return"(%10, %11) : (tensor<i32>, tensor<2xf32>) -> ()
}) : (tensor<i32>, tensor<2xf32>) -> (tensor<i32>, tensor<2xf32>)
%12 = "stablehlo.constant"() {value = dense<true> : tensor<i1>} : () -> tensor<i1>
%13 = "stablehlo.if"(%12) ({
  %14 = "stablehlo.negate"(%2) : (tensor<2xf32>) -> tensor<2xf32>
  "stablehlo.return"(%14) : (tensor<2xf32>) -> ()
}, {
  "stablehlo.return"(%arg0) : (tensor<2xf32>) -> ()
}) : (tensor<i1>) -> tensor<2xf32>
"func.return"(%13) : (tensor<2xf32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn case_text() {
    let b = body(1, |f| {
        let i = f.arg(TensorType::scalar(DType::I32))?;
        let x = f.arg(f32t(&[2]))?;
        f.case(i, 2, |b, k| {
            Ok::<_, HloError>(vec![if k == 0 { b.abs(x)? } else { x }])
        })
    });
    let expected = r#"%0 = "stablehlo.case"(%arg0) ({
  %1 = "stablehlo.abs"(%arg1) : (tensor<2xf32>) -> tensor<2xf32>
  "stablehlo.return"(%1) : (tensor<2xf32>) -> ()
}, {
  "stablehlo.return"(%arg1) : (tensor<2xf32>) -> ()
}) : (tensor<i32>) -> tensor<2xf32>
"func.return"(%0) : (tensor<2xf32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn collectives_text_and_unique_channels() {
    let b = body(4, |f| {
        let x = f.arg(f32t(&[1, 4, 2, 8]))?;
        let g = vec![vec![0, 1, 2, 3]];
        let a = f.all_to_all(x, 1, 2, &g, Grouping::FlattenedIds)?;
        let ag = f.all_gather(x, 0, &[vec![0, 1], vec![2, 3]], Grouping::FlattenedIds)?;
        let cp =
            f.collective_permute(x, &[(0, 1), (1, 2), (2, 3), (3, 0)], Grouping::FlattenedIds)?;
        let ar = f.all_reduce(x, Reducer::Sum, &g, Grouping::FlattenedIds)?;
        let rs = f.reduce_scatter(x, 3, Reducer::Sum, &g, Grouping::FlattenedIds)?;
        let p = f.partition_id();
        Ok(vec![a, ag, cp, ar, rs, p])
    });
    let expected = r#"%0 = "stablehlo.all_to_all"(%arg0) {channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>, concat_dimension = 2 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, split_count = 4 : i64, split_dimension = 1 : i64} : (tensor<1x4x2x8xf32>) -> tensor<1x1x8x8xf32>
%1 = "stablehlo.all_gather"(%arg0) {all_gather_dim = 0 : i64, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>, replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>, use_global_device_ids} : (tensor<1x4x2x8xf32>) -> tensor<2x4x2x8xf32>
%2 = "stablehlo.collective_permute"(%arg0) {channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
%3 = "stablehlo.all_reduce"(%arg0) ({
^bb0(%4: tensor<f32>, %5: tensor<f32>):
  %6 = "stablehlo.add"(%4, %5) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  "stablehlo.return"(%6) : (tensor<f32>) -> ()
}) {channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, use_global_device_ids} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
%7 = "stablehlo.reduce_scatter"(%arg0) ({
^bb0(%8: tensor<f32>, %9: tensor<f32>):
  %10 = "stablehlo.add"(%8, %9) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  "stablehlo.return"(%10) : (tensor<f32>) -> ()
}) {channel_handle = #stablehlo.channel_handle<handle = 5, type = 1>, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, scatter_dimension = 3 : i64, use_global_device_ids} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x2xf32>
%11 = "stablehlo.partition_id"() : () -> tensor<ui32>
%12 = "stablehlo.convert"(%11) : (tensor<ui32>) -> tensor<i32>
"func.return"(%0, %1, %2, %3, %7, %12) : (tensor<1x1x8x8xf32>, tensor<2x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x2xf32>, tensor<i32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn channels_are_unique_across_functions() {
    let mut m = Module::new("c");
    m.set_num_partitions(2).unwrap();
    for name in ["a", "main"] {
        let mut f = m.func(name);
        let x = f.arg(f32t(&[2])).unwrap();
        let y = f
            .all_reduce(x, Reducer::Sum, &[vec![0, 1]], Grouping::FlattenedIds)
            .unwrap();
        f.finish(&[y]).unwrap();
    }
    let text = m.to_mlir();
    assert!(text.contains("handle = 1, type = 1"));
    assert!(text.contains("handle = 2, type = 1"));
}

#[test]
fn cross_replica_has_no_channel() {
    let mut m = Module::new("r");
    m.set_num_replicas(2).unwrap();
    let mut f = m.func("main");
    let x = f.arg(f32t(&[2])).unwrap();
    let y = f
        .all_gather(x, 0, &[vec![0, 1]], Grouping::CrossReplica)
        .unwrap();
    let z = f
        .collective_permute(x, &[(0, 1)], Grouping::CrossReplica)
        .unwrap();
    f.finish(&[y, z]).unwrap();
    let text = m.to_mlir();
    assert!(text.contains(
        r#"{all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<2xf32>) -> tensor<4xf32>"#
    ));
    assert!(text.contains(r#"{source_target_pairs = dense<[[0, 1]]> : tensor<1x2xi64>}"#));
    assert!(!text.contains("channel_handle"));
}

#[test]
fn custom_call_text() {
    let b = body(1, |f| {
        let x = f.arg(f32t(&[2, 3]))?;
        let s = f.arg(TensorType::scalar(DType::I32))?;
        let mut c = CustomCall::new("tpu_custom_call");
        c.backend_config = "{\"k\": \"v\"}".into();
        c.api_version = CustomCallApiVersion::StatusReturning;
        c.has_side_effect = true;
        c.operand_layouts = Some(vec![vec![1, 0], vec![]]);
        c.result_layouts = Some(vec![vec![0, 1]]);
        c.output_operand_aliases = vec![OutputOperandAlias {
            output: 0,
            operand: 0,
        }];
        c.sharding = Some(Sharding::Raw("{maximal device=0}".into()));
        c.extra_attrs = vec![("kernel_name".into(), "\"k0\"".into())];
        f.custom_call(c, &[x, s], &[f32t(&[2, 3])])
    });
    let expected = r#"%0 = "stablehlo.custom_call"(%arg0, %arg1) {api_version = 2 : i32, backend_config = "{\"k\": \"v\"}", call_target_name = "tpu_custom_call", has_side_effect = true, operand_layouts = [dense<[1, 0]> : tensor<2xindex>, dense<> : tensor<0xindex>], output_operand_aliases = [#stablehlo.output_operand_alias<output_tuple_indices = [], operand_index = 0, operand_tuple_indices = []>], result_layouts = [dense<[0, 1]> : tensor<2xindex>], mhlo.sharding = "{maximal device=0}", kernel_name = "k0"} : (tensor<2x3xf32>, tensor<i32>) -> tensor<2x3xf32>
"func.return"(%0) : (tensor<2x3xf32>) -> ()"#;
    assert_eq!(b, expected);
}

#[test]
fn output_is_deterministic() {
    let build = || {
        text(4, |f| {
            let x = f.arg(f32t(&[4]))?;
            let y = f.all_reduce(x, Reducer::Max, &[vec![0, 1, 2, 3]], Grouping::FlattenedIds)?;
            Ok(vec![f.tanh(y)?])
        })
    };
    assert_eq!(build(), build());
}

#[test]
fn ops_are_data() {
    let mut m = Module::new("d");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[3])).unwrap();
    let y = f.exp(x).unwrap();
    let s = f.reduce(y, &[0], Reducer::Sum).unwrap();
    f.finish(&[s]).unwrap();
    let main = m.get_func("main").unwrap();
    let ops = &main.body().ops;
    assert_eq!(ops.len(), 3);
    assert_eq!(ops[0].kind, crate::OpKind::Unary(UnaryOp::Exp));
    assert_eq!(ops[0].operands, vec![x]);
    assert_eq!(ops[2].kind.name(), "stablehlo.reduce");
    assert_eq!(ops[2].regions[0].args.len(), 2);
    assert_eq!(main.value_type(s), Some(&TensorType::scalar(DType::F32)));
    assert_eq!(main.arg_types(), vec![f32t(&[3])]);
    assert_eq!(main.result_types(), vec![TensorType::scalar(DType::F32)]);
}

// ---------------------------------------------------------------- errors: values and funcs

#[test]
fn value_from_another_function() {
    let mut m = Module::new("m");
    let mut a = m.func("a");
    let xa = a.arg(f32t(&[2])).unwrap();
    a.finish(&[xa]).unwrap();
    let mut b = m.func("main");
    let xb = b.arg(f32t(&[2])).unwrap();
    expect(
        b.add(xa, xb).unwrap_err(),
        "stablehlo.add",
        "operand #0 belongs to another function",
    );
    expect(
        b.value_type(xa).unwrap_err(),
        "value_type",
        "another function",
    );
    let e = b.finish(&[xa]).unwrap_err();
    assert!(e.to_string().starts_with("func @main:"), "{e}");
    assert!(e.to_string().contains("another function"), "{e}");
}

#[test]
fn value_out_of_scope() {
    // A value defined inside a closed region cannot be used after it.
    expect(
        err(|f| {
            let x = f.arg(f32t(&[2]))?;
            let mut leaked = None;
            let p = f.scalar(1.0, DType::Bool)?;
            f.if_else(
                p,
                |b| {
                    let y = b.neg(x)?;
                    leaked = Some(y);
                    Ok::<_, HloError>(vec![y])
                },
                |_| Ok(vec![x]),
            )?;
            f.abs(leaked.unwrap_or(x))?;
            Ok(())
        }),
        "stablehlo.abs",
        "not in scope",
    );
    // A reduction body cannot capture outer values.
    expect(
        err(|f| {
            let x = f.arg(f32t(&[2]))?;
            let c = f.scalar(2.0, DType::F32)?;
            let z = f.scalar(0.0, DType::F32)?;
            f.reduce_with(&[x], &[z], &[0], |b, a| {
                Ok::<_, HloError>(vec![b.mul(a[0], c)?])
            })?;
            Ok(())
        }),
        "stablehlo.multiply",
        "cannot capture",
    );
    // A region result must be in scope too.
    expect(
        err(|f| {
            let x = f.arg(f32t(&[2]))?;
            let z = f.scalar(0.0, DType::F32)?;
            let c = f.scalar(2.0, DType::F32)?;
            f.reduce_with(&[x], &[z], &[0], |_, _| Ok::<_, HloError>(vec![c]))?;
            Ok(())
        }),
        "stablehlo.reduce",
        "body result #0",
    );
}

#[test]
fn func_errors() {
    let mut m = Module::new("m");
    let f = m.func("main");
    f.finish(&[]).unwrap();
    let f = m.func("main");
    let e = f.finish(&[]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "func @main: a function with this name is already in the module"
    );
    let mut m = Module::new("m");
    let mut f = m.func("main");
    f.set_public(false);
    assert!(f
        .finish(&[])
        .unwrap_err()
        .to_string()
        .contains("@main must be public"));
    assert!(m.verify().unwrap_err().to_string().contains("no @main"));
    let mut m = Module::new("m");
    let mut f = m.func("main");
    expect(
        f.arg(f32t(&[-1])).unwrap_err(),
        "func.func",
        "argument #0 has invalid dimensions",
    );
    assert!(Module::new("m")
        .set_num_partitions(0)
        .unwrap_err()
        .to_string()
        .starts_with("module:"));
    assert!(Module::new("m").set_num_replicas(0).is_err());
}

#[test]
fn call_errors() {
    let mut m = Module::new("m");
    let mut h = m.func("h");
    let a = h.arg(f32t(&[2])).unwrap();
    h.finish(&[a]).unwrap();
    let mut f = m.func("main");
    let x = f.arg(f32t(&[3])).unwrap();
    let e = f.call("nope", &[x]).unwrap_err();
    assert!(e.to_string().contains("func.call: no such function"), "{e}");
    expect(
        f.call("h", &[]).unwrap_err(),
        "func.call",
        "takes 1 arguments, got 0",
    );
    expect(
        f.call("h", &[x]).unwrap_err(),
        "func.call",
        "argument #0 of @h: tensor<3xf32> vs tensor<2xf32>",
    );
}

// ---------------------------------------------------------------- errors: elementwise

#[test]
fn elementwise_errors() {
    expect(
        err(|f| {
            let x = f.arg(t(&[2], DType::I32))?;
            f.exp(x)?;
            Ok(())
        }),
        "stablehlo.exponential",
        "operand has element type i32, expected a float type",
    );
    expect(
        err(|f| {
            let x = f.arg(f32t(&[2]))?;
            f.not(x)?;
            Ok(())
        }),
        "stablehlo.not",
        "expected an integer or bool type",
    );
    expect(
        err(|f| {
            let x = f.arg(f32t(&[2]))?;
            f.popcnt(x)?;
            Ok(())
        }),
        "stablehlo.popcnt",
        "an integer type",
    );
    expect(
        err(|f| {
            let x = f.arg(t(&[2], DType::Bool))?;
            f.neg(x)?;
            Ok(())
        }),
        "stablehlo.negate",
        "element type bool",
    );
    expect(
        err(|f| {
            let a = f.arg(f32t(&[2]))?;
            let b = f.arg(f32t(&[3]))?;
            f.add(a, b)?;
            Ok(())
        }),
        "stablehlo.add",
        "operand types differ: tensor<2xf32> vs tensor<3xf32>",
    );
    expect(
        err(|f| {
            let a = f.arg(f32t(&[2]))?;
            let b = f.arg(t(&[2], DType::BF16))?;
            f.mul(a, b)?;
            Ok(())
        }),
        "stablehlo.multiply",
        "tensor<2xf32> vs tensor<2xbf16>",
    );
    for (op, name, dtype) in [
        (crate::BinaryOp::Sub, "stablehlo.subtract", DType::Bool),
        (
            crate::BinaryOp::ShiftLeft,
            "stablehlo.shift_left",
            DType::F32,
        ),
        (crate::BinaryOp::And, "stablehlo.and", DType::BF16),
        (crate::BinaryOp::Atan2, "stablehlo.atan2", DType::I32),
    ] {
        expect(
            err(|f| {
                let a = f.arg(t(&[2], dtype))?;
                f.binary(op, a, a)?;
                Ok(())
            }),
            name,
            &format!("operands has element type {dtype}"),
        );
    }
}

#[test]
fn compare_select_clamp_errors() {
    expect(
        err(|f| {
            let a = f.arg(f32t(&[2]))?;
            let b = f.arg(t(&[2], DType::I32))?;
            f.lt(a, b)?;
            Ok(())
        }),
        "stablehlo.compare",
        "operand types differ",
    );
    expect(
        err(|f| {
            let a = f.arg(t(&[2], DType::I32))?;
            f.compare_with_type(ComparisonDirection::Eq, a, a, ComparisonType::Float)?;
            Ok(())
        }),
        "stablehlo.compare",
        "compare_type FLOAT",
    );
    expect(
        err(|f| {
            let a = f.arg(t(&[2], DType::Bool))?;
            f.compare_with_type(ComparisonDirection::Eq, a, a, ComparisonType::Signed)?;
            Ok(())
        }),
        "stablehlo.compare",
        "compare_type SIGNED",
    );
    expect(
        err(|f| {
            let p = f.arg(t(&[2], DType::I32))?;
            let a = f.arg(f32t(&[2]))?;
            f.select(p, a, a)?;
            Ok(())
        }),
        "stablehlo.select",
        "pred has element type i32, expected i1",
    );
    expect(
        err(|f| {
            let p = f.arg(t(&[2], DType::Bool))?;
            let a = f.arg(f32t(&[2]))?;
            let b = f.arg(f32t(&[3]))?;
            f.select(p, a, b)?;
            Ok(())
        }),
        "stablehlo.select",
        "on_true and on_false types differ",
    );
    expect(
        err(|f| {
            let p = f.arg(t(&[3], DType::Bool))?;
            let a = f.arg(f32t(&[2]))?;
            f.select(p, a, a)?;
            Ok(())
        }),
        "stablehlo.select",
        "must be a scalar or have the shape",
    );
    expect(
        err(|f| {
            let lo = f.arg(t(&[], DType::I32))?;
            let x = f.arg(f32t(&[2]))?;
            f.clamp(lo, x, lo)?;
            Ok(())
        }),
        "stablehlo.clamp",
        "min dtype differs",
    );
    expect(
        err(|f| {
            let lo = f.arg(f32t(&[3]))?;
            let x = f.arg(f32t(&[2]))?;
            f.clamp(lo, x, lo)?;
            Ok(())
        }),
        "stablehlo.clamp",
        "min tensor<3xf32> must be a scalar",
    );
    expect(
        err(|f| {
            let x = f.arg(t(&[2], DType::Bool))?;
            f.clamp(x, x, x)?;
            Ok(())
        }),
        "stablehlo.clamp",
        "element type bool",
    );
}

#[test]
fn iota_errors() {
    expect(
        err(|f| f.iota(f32t(&[2]), 1).map(drop)),
        "stablehlo.iota",
        "dimension 1 out of range",
    );
    expect(
        err(|f| f.iota(t(&[2], DType::Bool), 0).map(drop)),
        "stablehlo.iota",
        "element type bool",
    );
    expect(
        err(|f| f.iota(f32t(&[-2]), 0).map(drop)),
        "stablehlo.iota",
        "invalid dimensions",
    );
}

// ---------------------------------------------------------------- errors: shape ops

fn with_x<R>(
    dims: &[i64],
    g: impl FnOnce(&mut FuncBuilder<'_>, Value) -> Result<R, HloError>,
) -> HloError {
    let dims = dims.to_vec();
    err(move |f| {
        let x = f.arg(f32t(&dims))?;
        g(f, x).map(drop)
    })
}

#[test]
fn broadcast_errors() {
    const OP: &str = "stablehlo.broadcast_in_dim";
    expect(
        with_x(&[2], |f, x| f.broadcast_in_dim(x, &[2, 3], &[])),
        OP,
        "has 0 entries for an operand of rank 1",
    );
    expect(
        with_x(&[2], |f, x| f.broadcast_in_dim(x, &[2, 3], &[2])),
        OP,
        "dimension 2 out of range",
    );
    expect(
        with_x(&[2, 2], |f, x| f.broadcast_in_dim(x, &[2, 2], &[0, 0])),
        OP,
        "dimension 0 repeated",
    );
    expect(
        with_x(&[2], |f, x| f.broadcast_in_dim(x, &[3], &[0])),
        OP,
        "operand dimension 0 has size 2",
    );
    expect(
        with_x(&[2], |f, x| f.broadcast_in_dim(x, &[-1], &[0])),
        OP,
        "result shape has invalid dimensions",
    );
    expect(
        with_x(&[2, 2], |f, x| f.broadcast(x, &[2])),
        OP,
        "cannot broadcast rank 2 to rank 1",
    );
}

#[test]
fn reshape_transpose_reverse_errors() {
    expect(
        with_x(&[2, 3], |f, x| f.reshape(x, &[5])),
        "stablehlo.reshape",
        "element count differs",
    );
    expect(
        with_x(&[2, 3], |f, x| f.transpose(x, &[0])),
        "stablehlo.transpose",
        "permutation: has 1 entries",
    );
    expect(
        with_x(&[2, 3], |f, x| f.transpose(x, &[1, 1])),
        "stablehlo.transpose",
        "dimension 1 repeated",
    );
    expect(
        with_x(&[2, 3], |f, x| f.reverse(x, &[2])),
        "stablehlo.reverse",
        "dimension 2 out of range",
    );
}

#[test]
fn slice_errors() {
    const OP: &str = "stablehlo.slice";
    expect(
        with_x(&[4], |f, x| f.slice(x, &[0, 0], &[1, 1])),
        OP,
        "start_indices: has 2 entries",
    );
    expect(
        with_x(&[4], |f, x| f.slice(x, &[3], &[2])),
        OP,
        "need 0 <= start 3 <= limit 2 <= size 4",
    );
    expect(
        with_x(&[4], |f, x| f.slice(x, &[0], &[5])),
        OP,
        "limit 5 <= size 4",
    );
    expect(
        with_x(&[4], |f, x| f.slice_strided(x, &[0], &[4], &[0])),
        OP,
        "stride 0 < 1",
    );
}

#[test]
fn dynamic_slice_errors() {
    const OP: &str = "stablehlo.dynamic_slice";
    expect(
        with_x(&[4, 4], |f, x| f.dynamic_slice(x, &[], &[1, 1])),
        OP,
        "needs 2 start indices",
    );
    expect(
        with_x(&[4], |f, x| {
            let i = f.arg(t(&[1], DType::I32))?;
            f.dynamic_slice(x, &[i], &[1])
        }),
        OP,
        "start index #0 must be a scalar",
    );
    expect(
        with_x(&[4], |f, x| {
            let i = f.arg(TensorType::scalar(DType::F32))?;
            f.dynamic_slice(x, &[i], &[1])
        }),
        OP,
        "start index #0 has element type f32",
    );
    expect(
        with_x(&[4, 4], |f, x| {
            let i = f.arg(TensorType::scalar(DType::I32))?;
            let j = f.arg(TensorType::scalar(DType::I8))?;
            f.dynamic_slice(x, &[i, j], &[1, 1])
        }),
        OP,
        "start index #1 has element type i8, expected the dtype of the other start indices",
    );
    expect(
        with_x(&[4], |f, x| {
            let i = f.arg(TensorType::scalar(DType::I32))?;
            f.dynamic_slice(x, &[i], &[5])
        }),
        OP,
        "slice_sizes: dimension 0: size 5 not in 0..=4",
    );
    expect(
        with_x(&[4], |f, x| {
            let i = f.arg(TensorType::scalar(DType::I32))?;
            let u = f.arg(f32t(&[5]))?;
            f.dynamic_update_slice(x, u, &[i])
        }),
        "stablehlo.dynamic_update_slice",
        "update must have the operand's dtype and rank and fit inside it",
    );
    expect(
        with_x(&[4], |f, x| f.dynamic_update_slice(x, x, &[])),
        "stablehlo.dynamic_update_slice",
        "needs 1 start indices",
    );
}

#[test]
fn concatenate_pad_errors() {
    expect(
        err(|f| f.concatenate(&[], 0).map(drop)),
        "stablehlo.concatenate",
        "at least one operand",
    );
    expect(
        with_x(&[2], |f, x| f.concatenate(&[x], 1)),
        "stablehlo.concatenate",
        "dimension 1 out of range",
    );
    expect(
        with_x(&[2, 3], |f, x| {
            let y = f.arg(f32t(&[2, 4]))?;
            f.concatenate(&[x, y], 0)
        }),
        "stablehlo.concatenate",
        "operand #1 must match operand #0 except in dimension 0",
    );
    const OP: &str = "stablehlo.pad";
    expect(
        with_x(&[2], |f, x| f.pad(x, x, &[0], &[0], &[0])),
        OP,
        "padding_value must be a scalar",
    );
    expect(
        with_x(&[2], |f, x| {
            let p = f.scalar(0.0, DType::I32)?;
            f.pad(x, p, &[0], &[0], &[0])
        }),
        OP,
        "padding_value dtype differs",
    );
    expect(
        with_x(&[2], |f, x| {
            let p = f.scalar(0.0, DType::F32)?;
            f.pad(x, p, &[0], &[0], &[-1])
        }),
        OP,
        "interior_padding: dimension 0: -1 < 0",
    );
    expect(
        with_x(&[2], |f, x| {
            let p = f.scalar(0.0, DType::F32)?;
            f.pad(x, p, &[-2], &[-1], &[0])
        }),
        OP,
        "padded size is negative",
    );
    expect(
        with_x(&[2], |f, x| {
            let p = f.scalar(0.0, DType::F32)?;
            f.pad(x, p, &[0, 0], &[0], &[0])
        }),
        OP,
        "edge_padding_low: has 2 entries",
    );
}

#[test]
fn dot_general_errors() {
    const OP: &str = "stablehlo.dot_general";
    let dot = |l: TensorType, r: TensorType, d: DotDims, out: DType| {
        err(move |f| {
            let a = f.arg(l)?;
            let b = f.arg(r)?;
            f.dot_general(a, b, &d, out, None).map(drop)
        })
    };
    let mm = DotDims::contracting([1], [0]);
    expect(
        dot(
            f32t(&[2, 3]),
            t(&[3, 2], DType::BF16),
            mm.clone(),
            DType::F32,
        ),
        OP,
        "lhs and rhs dtypes differ",
    );
    expect(
        dot(
            t(&[2, 3], DType::Bool),
            t(&[3, 2], DType::Bool),
            mm.clone(),
            DType::I32,
        ),
        OP,
        "lhs has element type bool",
    );
    expect(
        dot(f32t(&[2, 3]), f32t(&[3, 2]), mm.clone(), DType::I32),
        OP,
        "result has element type i32, expected a float result type",
    );
    expect(
        dot(
            t(&[2, 3], DType::I8),
            t(&[3, 2], DType::I8),
            mm.clone(),
            DType::F32,
        ),
        OP,
        "expected a integer result type",
    );
    expect(
        dot(f32t(&[2, 3]), f32t(&[4, 2]), mm.clone(), DType::F32),
        OP,
        "contracting dimension sizes differ: lhs dim 1 = 3, rhs dim 0 = 4",
    );
    expect(
        dot(
            f32t(&[2, 3]),
            f32t(&[3, 2]),
            DotDims::contracting([1], []),
            DType::F32,
        ),
        OP,
        "lhs has 1 contracting dimensions, rhs 0",
    );
    expect(
        dot(
            f32t(&[2, 3]),
            f32t(&[3, 2]),
            DotDims::new([0], [], [1], [0]),
            DType::F32,
        ),
        OP,
        "lhs has 1 batch dimensions, rhs 0",
    );
    expect(
        dot(
            f32t(&[2, 3]),
            f32t(&[3, 2]),
            DotDims::contracting([2], [0]),
            DType::F32,
        ),
        OP,
        "dot_dimension_numbers (lhs): dimension 2 out of range",
    );
    expect(
        dot(
            f32t(&[3, 3]),
            f32t(&[3, 3]),
            DotDims::new([1], [1], [1], [0]),
            DType::F32,
        ),
        OP,
        "dimension 1 repeated",
    );
    expect(
        dot(
            f32t(&[2, 3, 4]),
            f32t(&[5, 4, 3]),
            DotDims::new([0], [0], [2], [1]),
            DType::F32,
        ),
        OP,
        "batch dimension sizes differ",
    );
    expect(
        err(|f| {
            let a = f.arg(f32t(&[3]))?;
            f.matmul(a, a, DType::F32).map(drop)
        }),
        OP,
        "matmul needs operands of equal rank >= 2",
    );
}

// ---------------------------------------------------------------- errors: regions

#[test]
fn reduce_errors() {
    const OP: &str = "stablehlo.reduce";
    expect(
        with_x(&[2, 3], |f, x| f.reduce(x, &[2], Reducer::Sum)),
        OP,
        "dimensions: dimension 2 out of range",
    );
    expect(
        with_x(&[2, 3], |f, x| f.reduce(x, &[0], Reducer::And)),
        OP,
        "reducer And",
    );
    let z = |f: &mut FuncBuilder<'_>| f.scalar(0.0, DType::F32);
    let sum = |b: &mut FuncBuilder<'_>, a: &[Value]| Ok::<_, HloError>(vec![b.add(a[0], a[1])?]);
    expect(
        with_x(&[2], |f, x| f.reduce_with(&[x], &[], &[0], sum)),
        OP,
        "got 1 inputs and 0 inits",
    );
    expect(
        with_x(&[2], |f, x| {
            let y = f.arg(f32t(&[3]))?;
            let i = z(f)?;
            f.reduce_with(&[x, y], &[i, i], &[0], |b, a| {
                Ok::<_, HloError>(vec![b.add(a[0], a[2])?, a[1]])
            })
        }),
        OP,
        "inputs must have the same shape",
    );
    expect(
        with_x(&[2], |f, x| f.reduce_with(&[x], &[x], &[0], sum)),
        OP,
        "init #0 must be a scalar",
    );
    expect(
        with_x(&[2], |f, x| {
            let i = f.scalar(0.0, DType::I32)?;
            f.reduce_with(&[x], &[i], &[0], sum)
        }),
        OP,
        "init #0 dtype differs from input",
    );
    expect(
        with_x(&[2], |f, x| {
            let i = z(f)?;
            f.reduce_with(&[x], &[i], &[0], |b, a| {
                Ok::<_, HloError>(vec![a[0], b.add(a[0], a[1])?])
            })
        }),
        OP,
        "body must return (tensor<f32>), returned (tensor<f32>, tensor<f32>)",
    );
}

#[test]
fn while_errors() {
    const OP: &str = "stablehlo.while";
    let id = |_: &mut FuncBuilder<'_>, a: &[Value]| Ok::<_, HloError>(a.to_vec());
    expect(
        err(|f| {
            f.while_loop(&[], |b, _| b.scalar(1.0, DType::Bool), id)
                .map(drop)
        }),
        OP,
        "at least one loop-carried value",
    );
    expect(
        with_x(&[2], |f, x| {
            f.while_loop(&[x], |_, a| Ok::<_, HloError>(a[0]), id)
        }),
        OP,
        "cond must return tensor<i1>, returned (tensor<2xf32>)",
    );
    expect(
        with_x(&[2], |f, x| {
            f.while_loop(
                &[x],
                |b, _| b.scalar(1.0, DType::Bool),
                |b, a| Ok::<_, HloError>(vec![b.convert(a[0], DType::I32)?]),
            )
        }),
        OP,
        "body must return the loop-carried types (tensor<2xf32>), returned (tensor<2xi32>)",
    );
    expect(
        with_x(&[2], |f, x| {
            let lo = f.scalar(0.0, DType::I8)?;
            f.fori_loop(lo, lo, &[x], |_, _, c| Ok::<_, HloError>(c.to_vec()))
        }),
        OP,
        "fori_loop lower bound (tensor<i8>)",
    );
}

#[test]
fn if_case_errors() {
    expect(
        with_x(&[2], |f, x| {
            let p = f.arg(t(&[2], DType::Bool))?;
            f.if_else(p, |_| Ok::<_, HloError>(vec![x]), |_| Ok(vec![x]))
        }),
        "stablehlo.if",
        "pred (tensor<2xi1>)",
    );
    expect(
        with_x(&[2], |f, x| {
            let p = f.scalar(1.0, DType::Bool)?;
            f.if_else(p, |_| Ok::<_, HloError>(vec![x]), |_| Ok(vec![]))
        }),
        "stablehlo.if",
        "branches return different types: (tensor<2xf32>) vs ()",
    );
    expect(
        with_x(&[2], |f, x| {
            let i = f.scalar(0.0, DType::I8)?;
            f.case(i, 1, |_, _| Ok::<_, HloError>(vec![x]))
        }),
        "stablehlo.case",
        "index (tensor<i8>)",
    );
    expect(
        with_x(&[2], |f, x| {
            let i = f.scalar(0.0, DType::I32)?;
            f.case(i, 0, |_, _| Ok::<_, HloError>(vec![x]))
        }),
        "stablehlo.case",
        "needs at least one branch",
    );
    expect(
        with_x(&[2], |f, x| {
            let i = f.scalar(0.0, DType::I32)?;
            f.case(i, 2, |b, k| {
                Ok::<_, HloError>(if k == 0 {
                    vec![x]
                } else {
                    vec![b.scalar(1.0, DType::F32)?]
                })
            })
        }),
        "stablehlo.case",
        "branch #1 returns (tensor<f32>), branch #0 returns (tensor<2xf32>)",
    );
}

#[test]
fn region_closure_errors_propagate_with_user_error_types() {
    #[derive(Debug, PartialEq)]
    enum MyErr {
        Hlo(HloError),
        Mine,
    }
    impl From<HloError> for MyErr {
        fn from(e: HloError) -> Self {
            MyErr::Hlo(e)
        }
    }
    let mut m = Module::new("m");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[2])).unwrap();
    let p = f.scalar(1.0, DType::Bool).unwrap();
    let r: Result<Vec<Value>, MyErr> = f.if_else(p, |_| Err(MyErr::Mine), |_| Ok(vec![x]));
    assert_eq!(r.unwrap_err(), MyErr::Mine);
    // The builder is still usable and positioned in the function body afterwards.
    let y = f.neg(x).unwrap();
    f.finish(&[y]).unwrap();
    assert!(m.to_mlir().contains("\"stablehlo.negate\"(%arg0)"));
}

#[test]
fn custom_call_errors() {
    const OP: &str = "stablehlo.custom_call";
    let cc = |spec: CustomCall, results: Vec<TensorType>| {
        with_x(&[2, 3], move |f, x| f.custom_call(spec, &[x], &results))
    };
    expect(
        cc(CustomCall::new(""), vec![]),
        OP,
        "call_target_name: must not be empty",
    );
    let mut s = CustomCall::new("k");
    s.operand_layouts = Some(vec![]);
    expect(cc(s, vec![]), OP, "operand_layouts: 0 layouts for 1 values");
    let mut s = CustomCall::new("k");
    s.operand_layouts = Some(vec![vec![0, 0]]);
    expect(cc(s, vec![]), OP, "dimension 0 repeated");
    let mut s = CustomCall::new("k");
    s.result_layouts = Some(vec![vec![0]]);
    expect(
        cc(s, vec![f32t(&[2, 3])]),
        OP,
        "layout #0 [0] has the wrong length",
    );
    let mut s = CustomCall::new("k");
    s.output_operand_aliases = vec![OutputOperandAlias {
        output: 1,
        operand: 0,
    }];
    expect(
        cc(s, vec![f32t(&[2, 3])]),
        OP,
        "output_operand_aliases: result 1 / operand 0 out of range",
    );
    let mut s = CustomCall::new("k");
    s.output_operand_aliases = vec![OutputOperandAlias {
        output: 0,
        operand: 0,
    }];
    expect(
        cc(s, vec![f32t(&[3, 2])]),
        OP,
        "aliased operand and result types differ",
    );
    let mut s = CustomCall::new("k");
    s.extra_attrs = vec![("bad name".into(), "1".into())];
    expect(cc(s, vec![]), OP, "extra_attrs: invalid attribute name");
    expect(
        cc(CustomCall::new("k"), vec![f32t(&[-3])]),
        OP,
        "result #0 has invalid dimensions",
    );
}

// ---------------------------------------------------------------- errors: collectives

fn coll(
    parts: u32,
    dims: &[i64],
    g: impl FnOnce(&mut FuncBuilder<'_>, Value) -> Result<Value, HloError>,
) -> HloError {
    let dims = dims.to_vec();
    err_in(parts, move |f| {
        let x = f.arg(f32t(&dims))?;
        g(f, x).map(drop)
    })
}

#[test]
fn replica_group_errors() {
    const OP: &str = "stablehlo.all_reduce";
    let ar = |groups: Vec<Vec<i64>>, grouping: Grouping| {
        coll(4, &[2], move |f, x| {
            f.all_reduce(x, Reducer::Sum, &groups, grouping)
        })
    };
    expect(
        ar(vec![], Grouping::FlattenedIds),
        OP,
        "replica_groups: no groups",
    );
    expect(
        ar(vec![vec![]], Grouping::FlattenedIds),
        OP,
        "replica_groups: empty group",
    );
    expect(
        ar(vec![vec![0, 1], vec![2]], Grouping::FlattenedIds),
        OP,
        "group #1 has 1 ids, group #0 has 2",
    );
    expect(
        ar(vec![vec![0, 4]], Grouping::FlattenedIds),
        OP,
        "id 4 in group #0 is out of range: ids are flattened device ids",
    );
    expect(
        ar(vec![vec![0, 1]], Grouping::CrossReplica),
        OP,
        "ids are replica ids (mhlo.num_replicas), 0..1",
    );
    expect(
        ar(vec![vec![0, 0], vec![1, 2]], Grouping::FlattenedIds),
        OP,
        "id 0 appears twice",
    );
    expect(
        ar(vec![vec![0, 1]], Grouping::FlattenedIds),
        OP,
        "the groups must cover every id of 0..4",
    );
    expect(
        coll(4, &[2], |f, x| {
            f.all_reduce_with(x, &[vec![0, 1, 2, 3]], Grouping::FlattenedIds, |b, a| {
                Ok::<_, HloError>(vec![b.compare(ComparisonDirection::Lt, a[0], a[1])?])
            })
        }),
        OP,
        "body must return (tensor<f32>), returned (tensor<i1>)",
    );
    expect(
        err_in(4, |f| {
            let x = f.arg(t(&[2], DType::F32))?;
            f.all_reduce(x, Reducer::Xor, &[vec![0, 1, 2, 3]], Grouping::FlattenedIds)
                .map(drop)
        }),
        OP,
        "reducer Xor",
    );
}

#[test]
fn all_to_all_gather_scatter_errors() {
    let g4 = || vec![vec![0, 1, 2, 3]];
    expect(
        coll(4, &[2, 6], move |f, x| {
            f.all_to_all(x, 1, 0, &g4(), Grouping::FlattenedIds)
        }),
        "stablehlo.all_to_all",
        "split_dimension 1 of tensor<2x6xf32> (size 6) is not divisible by split_count 4",
    );
    expect(
        coll(4, &[4], move |f, x| {
            f.all_to_all(x, 1, 0, &g4(), Grouping::FlattenedIds)
        }),
        "stablehlo.all_to_all",
        "split_dimension: dimension 1 out of range",
    );
    expect(
        coll(4, &[4], move |f, x| {
            f.all_gather(x, -1, &g4(), Grouping::FlattenedIds)
        }),
        "stablehlo.all_gather",
        "all_gather_dim: dimension -1 out of range",
    );
    expect(
        coll(4, &[6], move |f, x| {
            f.reduce_scatter(x, 0, Reducer::Sum, &g4(), Grouping::FlattenedIds)
        }),
        "stablehlo.reduce_scatter",
        "(size 6) is not divisible by the group size 4",
    );
    expect(
        coll(2, &[6], move |f, x| {
            f.all_to_all(x, 0, 0, &[vec![0, 1, 2]], Grouping::FlattenedIds)
        }),
        "stablehlo.all_to_all",
        "ids are partition ids (mhlo.num_partitions), 0..2",
    );
}

#[test]
fn collective_permute_errors() {
    const OP: &str = "stablehlo.collective_permute";
    let cp = |pairs: Vec<(i64, i64)>| {
        coll(4, &[2], move |f, x| {
            f.collective_permute(x, &pairs, Grouping::FlattenedIds)
        })
    };
    expect(cp(vec![]), OP, "source_target_pairs: no pairs");
    expect(cp(vec![(0, 1), (0, 2)]), OP, "source 0 appears twice");
    expect(cp(vec![(0, 1), (2, 1)]), OP, "target 1 appears twice");
    expect(
        cp(vec![(0, 4)]),
        OP,
        "id 4 out of range: ids are partition ids",
    );
}

#[test]
fn shapes_of_collectives() {
    let mut m = Module::new("s");
    m.set_num_partitions(2).unwrap();
    m.set_num_replicas(2).unwrap();
    let mut f = m.func("main");
    let x = f.arg(f32t(&[4, 8])).unwrap();
    // cross_replica_and_partition: each group of replica ids spans both partitions.
    let g = f
        .all_gather(x, 0, &[vec![0], vec![1]], Grouping::CrossPartition)
        .unwrap();
    assert_eq!(f.value_type(g).unwrap(), &f32t(&[8, 8]));
    let r = f
        .reduce_scatter(
            x,
            1,
            Reducer::Sum,
            &[vec![0, 1, 2, 3]],
            Grouping::FlattenedIds,
        )
        .unwrap();
    assert_eq!(f.value_type(r).unwrap(), &f32t(&[4, 2]));
    let a = f
        .all_to_all(x, 0, 1, &[vec![0, 1]], Grouping::CrossPartition)
        .unwrap();
    assert_eq!(f.value_type(a).unwrap(), &f32t(&[2, 16]));
    let id = f.replica_id();
    assert_eq!(f.value_type(id).unwrap(), &TensorType::scalar(DType::I32));
}

#[test]
fn huge_dimensions_are_errors_not_panics() {
    let big = i64::MAX / 2 + 1;
    expect(
        with_x(&[big], |f, x| f.concatenate(&[x, x], 0)),
        "stablehlo.concatenate",
        "concatenated dimension 0 overflows",
    );
    expect(
        coll(4, &[big], |f, x| {
            f.all_gather(x, 0, &[vec![0, 1, 2, 3]], Grouping::FlattenedIds)
        }),
        "stablehlo.all_gather",
        "overflows",
    );
    let mut m = Module::new("m");
    let mut f = m.func("main");
    let x = f.arg(f32t(&[big])).unwrap();
    let s = f.slice_strided(x, &[0], &[big], &[i64::MAX]).unwrap();
    assert_eq!(f.value_type(s).unwrap(), &f32t(&[1]));
}

fn split(axes: &[Option<&str>]) -> Sharding {
    Sharding::ManualSplit(axes.iter().map(|a| a.map(String::from)).collect())
}

#[test]
fn shardy_form_of_a_mesh_module() {
    let mut m = Module::new("blocks");
    m.set_mesh(&[("data", 2), ("context", 4)]).unwrap();
    assert_eq!(m.num_partitions(), 8);
    let mut f = m.func("main");
    let x = f
        .arg_with_sharding(f32t(&[1, 3]), split(&[Some("data"), None]))
        .unwrap();
    let y = f.exp(x).unwrap();
    f.finish_with_shardings(&[(y, Some(split(&[None, Some("context")])))])
        .unwrap();
    let expected = r#"module @blocks attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  "sdy.mesh"() <{mesh = #sdy.mesh<["data"=2, "context"=4]>, sym_name = "mesh"}> : () -> ()
  func.func public @main(%arg0: tensor<2x3xf32> {sdy.sharding = #sdy.sharding<@mesh, [{"data"}, {}]>}) -> (tensor<1x12xf32> {sdy.sharding = #sdy.sharding<@mesh, [{}, {"context"}]>}) {
    %manual = "sdy.manual_computation"(%arg0) <{in_shardings = #sdy.sharding_per_value<[<@mesh, [{"data"}, {}]>]>, manual_axes = #sdy<manual_axes{"data", "context"}>, out_shardings = #sdy.sharding_per_value<[<@mesh, [{}, {"context"}]>]>}> ({
    ^bb0(%local0: tensor<1x3xf32>):
      %0 = "stablehlo.exponential"(%local0) : (tensor<1x3xf32>) -> tensor<1x3xf32>
      "sdy.return"(%0) : (tensor<1x3xf32>) -> ()
    }) : (tensor<2x3xf32>) -> tensor<1x12xf32>
    "func.return"(%manual) : (tensor<1x12xf32>) -> ()
  }
}
"#;
    assert_eq!(m.to_mlir(), expected);
    let gspmd = r#"module @blocks attributes {mhlo.num_partitions = 8 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%arg0: tensor<1x3xf32> {mhlo.sharding = "{manual}"}) -> (tensor<1x3xf32> {mhlo.sharding = "{manual}"}) {
    %0 = "stablehlo.exponential"(%arg0) : (tensor<1x3xf32>) -> tensor<1x3xf32>
    "func.return"(%0) : (tensor<1x3xf32>) -> ()
  }
}
"#;
    assert_eq!(m.to_mlir_gspmd(), gspmd);
}

#[test]
fn mesh_errors() {
    let mesh_err = |axes: &[(&str, u32)]| Module::new("m").set_mesh(axes).unwrap_err();
    assert!(mesh_err(&[]).to_string().contains("at least one axis"));
    assert!(mesh_err(&[("a", 2), ("a", 2)])
        .to_string()
        .contains("distinct"));
    assert!(mesh_err(&[("a", 0)]).to_string().contains("size 0"));
    assert!(mesh_err(&[("a", 1 << 16), ("b", 1 << 16)])
        .to_string()
        .contains("u32::MAX"));
    let mut m = Module::new("m");
    m.func("main").finish(&[]).unwrap();
    assert!(m
        .set_mesh(&[("a", 2)])
        .unwrap_err()
        .to_string()
        .contains("before adding functions"));
    let mut m = Module::new("m");
    m.set_mesh(&[("a", 2)]).unwrap();
    assert!(m.set_num_partitions(4).is_err());
    m.set_num_partitions(2).unwrap();

    // ManualSplit needs a mesh.
    let e = err_in(2, |f| {
        f.arg_with_sharding(f32t(&[2]), split(&[Some("a")]))?;
        Ok(())
    });
    assert!(e.to_string().contains("Module::set_mesh"), "{e}");

    let in_mesh = |name: &str, f: &dyn Fn(&mut FuncBuilder<'_>) -> Result<(), HloError>| {
        let mut m = Module::new("m");
        m.set_mesh(&[("a", 2), ("b", 2)]).unwrap();
        let mut b = m.func(name);
        f(&mut b).expect_err("expected an error").to_string()
    };
    let e = in_mesh("main", &|f| f.arg(f32t(&[2])).map(drop));
    assert!(
        e.contains("@main takes and returns ManualSplit blocks"),
        "{e}"
    );
    let e = in_mesh("main", &|f| {
        f.arg_with_sharding(f32t(&[2]), Sharding::Manual).map(drop)
    });
    assert!(
        e.contains("@main takes and returns ManualSplit blocks"),
        "{e}"
    );
    let e = in_mesh("main", &|f| {
        f.arg_with_sharding(f32t(&[2]), split(&[])).map(drop)
    });
    assert!(
        e.contains("names 0 dims, the type tensor<2xf32> has 1"),
        "{e}"
    );
    let e = in_mesh("main", &|f| {
        f.arg_with_sharding(f32t(&[2]), split(&[Some("c")]))
            .map(drop)
    });
    assert!(e.contains("`c`, not a mesh axis"), "{e}");
    let e = in_mesh("main", &|f| {
        f.arg_with_sharding(f32t(&[2, 2]), split(&[Some("a"), Some("a")]))
            .map(drop)
    });
    assert!(e.contains("`a` splits two dims"), "{e}");
    let e = in_mesh("helper", &|f| {
        f.arg_with_sharding(f32t(&[2]), split(&[Some("a")]))
            .map(drop)
    });
    assert!(e.contains("only @main"), "{e}");
    let e = in_mesh("helper", &|f| {
        f.arg_with_sharding(f32t(&[2]), Sharding::Replicated)
            .map(drop)
    });
    assert!(e.contains("only @main has shardings"), "{e}");
    let e = in_mesh("helper", &|f| {
        let x = f.arg(f32t(&[2]))?;
        let spec = CustomCall {
            sharding: Some(Sharding::Manual),
            ..CustomCall::new("Sharding")
        };
        f.custom_call(spec, &[x], &[f32t(&[2])]).map(drop)
    });
    assert!(e.contains("not allowed on a module with a mesh"), "{e}");
    // A result without a block sharding.
    let mut m = Module::new("m");
    m.set_mesh(&[("a", 2)]).unwrap();
    let mut f = m.func("main");
    let x = f.arg_with_sharding(f32t(&[2]), split(&[None])).unwrap();
    let e = f.finish(&[x]).unwrap_err().to_string();
    assert!(e.contains("result #0"), "{e}");
}

#[test]
fn a_global_tensor_too_large_is_an_error() {
    let mut m = Module::new("m");
    m.set_mesh(&[("a", 4)]).unwrap();
    let mut f = m.func("main");
    let e = f
        .arg_with_sharding(f32t(&[i64::MAX / 2]), split(&[Some("a")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("too large"), "{e}");
}

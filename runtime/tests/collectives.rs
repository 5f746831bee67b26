//! The 4-device manual-partition form (what `shard_map` emits, and what also compiles for TPU):
//! `all_to_all` `[B,H,S/4,D] -> [B,H/4,S,D]`, a ring `collective_permute`, `all_gather` and
//! `all_reduce`, checked exactly against host-computed results, in f32 and bf16. Plus the
//! replica form with `all_reduce`.

mod common;

use half::bf16;
use tessera_runtime::{CompileOptions, HostBuffer, NativeType};

use common::client;

const N: usize = 4; // devices
const B: usize = 2;
const H: usize = 4;
const S: usize = 8;
const D: usize = 3;
const SL: usize = S / N; // local sequence length

fn manual_program(ty: &str) -> String {
    let x = format!("tensor<{B}x{H}x{SL}x{D}x{ty}>");
    let y = format!("tensor<{B}x{}x{S}x{D}x{ty}>", H / N);
    let z = format!("tensor<2x3x{ty}>");
    let g = format!("tensor<8x3x{ty}>");
    let m = r#"{mhlo.sharding = "{manual}"}"#;
    format!(
        r#"module @collectives attributes {{mhlo.num_partitions = {N} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: {x} {m}, %z: {z} {m}) -> ({y} {m}, {x} {m}, {g} {m}, {z} {m}) {{
    %0 = "stablehlo.all_to_all"(%x) {{split_dimension = 1 : i64, concat_dimension = 2 : i64, split_count = {N} : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>}} : ({x}) -> {y}
    %1 = "stablehlo.collective_permute"(%x) {{source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>, channel_handle = #stablehlo.channel_handle<handle = 2, type = 1>}} : ({x}) -> {x}
    %2 = "stablehlo.all_gather"(%z) {{all_gather_dim = 0 : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 3, type = 1>, use_global_device_ids}} : ({z}) -> {g}
    %3 = "stablehlo.all_reduce"(%z) ({{
      ^bb0(%a: tensor<{ty}>, %b: tensor<{ty}>):
        %s = stablehlo.add %a, %b : tensor<{ty}>
        stablehlo.return %s : tensor<{ty}>
    }}) {{replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = 4, type = 1>, use_global_device_ids}} : ({z}) -> {z}
    return %0, %1, %2, %3 : {y}, {x}, {g}, {z}
  }}
}}"#
    )
}

/// Global `X[b,h,s,d]`: distinct small integers, exact in bf16 (< 256).
fn global_x(b: usize, h: usize, s: usize, d: usize) -> f32 {
    (((b * H + h) * S + s) * D + d) as f32
}

/// Device `p`'s shard of X along the sequence: `[B, H, S/4, D]`.
fn shard_x(p: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(B * H * SL * D);
    for b in 0..B {
        for h in 0..H {
            for s in 0..SL {
                for d in 0..D {
                    v.push(global_x(b, h, p * SL + s, d));
                }
            }
        }
    }
    v
}

/// Expected all_to_all result on device `j`: head `j`, full sequence, `[B, 1, S, D]`.
fn heads_x(j: usize) -> Vec<f32> {
    let mut v = Vec::with_capacity(B * S * D);
    for b in 0..B {
        for s in 0..S {
            for d in 0..D {
                v.push(global_x(b, j, s, d));
            }
        }
    }
    v
}

fn small(p: usize) -> Vec<f32> {
    (0..6).map(|i| (p * 6 + i) as f32 * 0.5).collect()
}

fn run_manual<T: NativeType + PartialEq + std::fmt::Debug>(ty: &str, conv: fn(f32) -> T) {
    let client = client(N);
    let exe = client
        .compile(
            &manual_program(ty),
            &CompileOptions::manual_partitions(N).unwrap(),
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(exe.num_devices(), N);
    assert_eq!(exe.num_outputs(), 4);
    // The compiled program's parameters are the per-device (local) shapes.
    let params = exe
        .parameters()
        .expect("the CPU plugin reports the signature");
    assert_eq!(
        params[0].dims,
        vec![B as i64, H as i64, SL as i64, D as i64]
    );
    assert_eq!(params[1].dims, vec![2, 3]);
    let typed = |v: Vec<f32>| v.into_iter().map(conv).collect::<Vec<T>>();
    let args: Vec<Vec<HostBuffer>> = (0..N)
        .map(|p| {
            vec![
                HostBuffer::from_slice(
                    &[B as i64, H as i64, SL as i64, D as i64],
                    &typed(shard_x(p)),
                )
                .unwrap(),
                HostBuffer::from_slice(&[2, 3], &typed(small(p))).unwrap(),
            ]
        })
        .collect();
    let out = exe.execute_host(&args).unwrap();
    assert_eq!(out.len(), N);
    let gathered: Vec<f32> = (0..N).flat_map(small).collect();
    let reduced: Vec<f32> = (0..6).map(|i| (0..N).map(|p| small(p)[i]).sum()).collect();
    for (p, o) in out.iter().enumerate() {
        assert_eq!(o[0].dims(), &[B as i64, (H / N) as i64, S as i64, D as i64]);
        assert_eq!(
            o[0].to_vec::<T>().unwrap(),
            typed(heads_x(p)),
            "all_to_all on device {p}"
        );
        assert_eq!(
            o[1].to_vec::<T>().unwrap(),
            typed(shard_x((p + N - 1) % N)),
            "collective_permute on device {p}"
        );
        assert_eq!(o[2].dims(), &[8, 3]);
        assert_eq!(
            o[2].to_vec::<T>().unwrap(),
            typed(gathered.clone()),
            "all_gather on {p}"
        );
        assert_eq!(
            o[3].to_vec::<T>().unwrap(),
            typed(reduced.clone()),
            "all_reduce on {p}"
        );
    }
}

#[test]
fn manual_partitions_f32() {
    run_manual::<f32>("f32", |x| x);
}

#[test]
fn manual_partitions_bf16() {
    run_manual::<bf16>("bf16", bf16::from_f32);
}

#[test]
fn replicas_all_reduce() {
    let program = r#"module @replicas attributes {mhlo.num_replicas = 4 : i32, mhlo.num_partitions = 1 : i32} {
  func.func public @main(%z: tensor<3xf32>) -> tensor<3xf32> {
    %0 = "stablehlo.all_reduce"(%z) ({
      ^bb0(%a: tensor<f32>, %b: tensor<f32>):
        %m = stablehlo.maximum %a, %b : tensor<f32>
        stablehlo.return %m : tensor<f32>
    }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<3xf32>) -> tensor<3xf32>
    return %0 : tensor<3xf32>
  }
}"#;
    let client = client(N);
    let exe = client
        .compile(program, &CompileOptions::replicated(N).unwrap())
        .unwrap();
    let inputs: Vec<[f32; 3]> = (0..N)
        .map(|p| [p as f32, -(p as f32), 7.0 - p as f32])
        .collect();
    let args: Vec<Vec<HostBuffer>> = inputs
        .iter()
        .map(|v| vec![HostBuffer::from_slice(&[3], v).unwrap()])
        .collect();
    let out = exe.execute_host(&args).unwrap();
    for o in &out {
        assert_eq!(o[0].to_vec::<f32>().unwrap(), vec![3.0, 0.0, 7.0]);
    }
}

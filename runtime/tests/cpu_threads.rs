//! The CPU client's thread pools (`Plugin::cpu_client`): a plugin whose collectives do not
//! block a thread per device keeps its default pools (one thread per core, as JAX's CPU
//! client), and a 4-device program whose independent dots and all-to-alls interleave (the
//! shape of a train step) completes on them with more devices than this machine's cores.
//! Measured on 2 cores: `xla-cpu-pjrt` 0.0.1 (blocking) aborts on this program at `NPROC=2`
//! (its rendezvous gives up after 40 s) and passes with the raised `NPROC`;
//! `lammps-jax-pjrt-cpu` 0.11.2 passes at `NPROC` 1, 2 and unset. This file's own process
//! keeps `NPROC` from other tests.

use tessera_runtime::{CompileOptions, HostBuffer, Plugin, CPU_COLLECTIVES_NONBLOCKING_SINCE};

const N: usize = 4; // devices
const M: usize = 256; // rows per device; each device's dot is [M, M] x [M, M]

/// Per device, three times over: two independent branches, `all_to_all(s @ w)` and
/// `all_to_all(s @ v)` (rows split over the devices, columns gathered, reshaped back), summed
/// into the next `s`. Independent branches let the plugin run thunks concurrently on its pool,
/// so some devices' dots queue behind other devices' all-to-alls.
fn program() -> String {
    let x = format!("tensor<{M}x{M}xf32>");
    let y = format!("tensor<{}x{}xf32>", M / N, M * N);
    let m = r#"{mhlo.sharding = "{manual}"}"#;
    let mut body = String::new();
    let mut prev = "%x".to_string();
    let mut handle = 0;
    for i in 0..3 {
        for weight in ["w", "v"] {
            handle += 1;
            body.push_str(&format!(
                "    %d{weight}{i} = stablehlo.dot_general {prev}, %{weight}, contracting_dims = [1] x [0] : ({x}, {x}) -> {x}\n\
                 %a{weight}{i} = \"stablehlo.all_to_all\"(%d{weight}{i}) {{split_dimension = 0 : i64, concat_dimension = 1 : i64, split_count = {N} : i64, replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>, channel_handle = #stablehlo.channel_handle<handle = {handle}, type = 1>}} : ({x}) -> {y}\n\
                 %r{weight}{i} = stablehlo.reshape %a{weight}{i} : ({y}) -> {x}\n"
            ));
        }
        body.push_str(&format!("    %s{i} = stablehlo.add %rw{i}, %rv{i} : {x}\n"));
        prev = format!("%s{i}");
    }
    format!(
        r#"module @pool attributes {{mhlo.num_partitions = {N} : i32, mhlo.num_replicas = 1 : i32}} {{
  func.func public @main(%x: {x} {m}, %w: {x} {m}, %v: {x} {m}) -> ({x} {m}) {{
{body}    return {prev} : {x}
  }}
}}"#
    )
}

/// The same computation on the host, in f64: device `p`'s output.
fn reference(inputs: &[Vec<f32>], w: &[f32], v: &[f32]) -> Vec<Vec<f64>> {
    let dot = |a: &[f64], b: &[f32]| -> Vec<f64> {
        let mut out = vec![0.0; M * M];
        for r in 0..M {
            for k in 0..M {
                let a_rk = a[r * M + k];
                for c in 0..M {
                    out[r * M + c] += a_rk * f64::from(b[k * M + c]);
                }
            }
        }
        out
    };
    // all_to_all: device p gets rows [p*rows, (p+1)*rows) of every device's product, laid
    // side by side along the columns ([rows, M*N]), then reshaped to [M, M].
    let exchange = |products: &[Vec<f64>], p: usize| -> Vec<f64> {
        let rows = M / N;
        let mut out = Vec::with_capacity(M * M);
        for r in 0..rows {
            for product in products {
                out.extend_from_slice(&product[(p * rows + r) * M..][..M]);
            }
        }
        out
    };
    let mut state: Vec<Vec<f64>> = inputs
        .iter()
        .map(|x| x.iter().map(|&e| f64::from(e)).collect())
        .collect();
    for _ in 0..3 {
        let by_w: Vec<Vec<f64>> = state.iter().map(|s| dot(s, w)).collect();
        let by_v: Vec<Vec<f64>> = state.iter().map(|s| dot(s, v)).collect();
        state = (0..N)
            .map(|p| {
                exchange(&by_w, p)
                    .iter()
                    .zip(exchange(&by_v, p))
                    .map(|(a, b)| a + b)
                    .collect()
            })
            .collect();
    }
    state
}

#[test]
fn default_plugin_keeps_its_pool_and_interleaved_collectives_complete() {
    let user_set = ["PJRT_NPROC", "NPROC"]
        .iter()
        .any(|v| std::env::var_os(v).is_some());
    let plugin = Plugin::cpu().unwrap_or_else(|e| panic!("{e}"));
    let client = plugin.cpu_client(N).unwrap_or_else(|e| panic!("{e}"));
    if !user_set {
        let nproc = std::env::var("NPROC").ok();
        if plugin.api_version() >= CPU_COLLECTIVES_NONBLOCKING_SINCE {
            assert_eq!(nproc, None, "NPROC was raised for a non-blocking plugin");
        } else {
            let threads: usize = nproc
                .as_deref()
                .and_then(|n| n.parse().ok())
                .expect("NPROC is set for a plugin whose collectives block");
            assert!(threads >= 4 * N, "NPROC={threads} for {N} devices");
        }
    }
    let exe = client
        .compile(&program(), &CompileOptions::manual_partitions(N).unwrap())
        .unwrap_or_else(|e| panic!("{e}"));
    // Small integers scaled so that every product is exact in f32 and f64.
    let inputs: Vec<Vec<f32>> = (0..N)
        .map(|p| {
            (0..M * M)
                .map(|i| ((i * 7 + p * 3) % 5) as f32 - 2.0)
                .collect()
        })
        .collect();
    let w: Vec<f32> = (0..M * M)
        .map(|i| {
            if i % (M + 1) == 0 {
                0.5
            } else if i % 97 == 0 {
                0.25
            } else {
                0.0
            }
        })
        .collect();
    let v: Vec<f32> = (0..M * M)
        .map(|i| if i % (M + 1) == 1 { -0.25 } else { 0.0 })
        .collect();
    let expected = reference(&inputs, &w, &v);
    let dims = [M as i64, M as i64];
    let args: Vec<Vec<HostBuffer>> = inputs
        .iter()
        .map(|x| {
            vec![
                HostBuffer::from_slice(&dims, x).unwrap(),
                HostBuffer::from_slice(&dims, &w).unwrap(),
                HostBuffer::from_slice(&dims, &v).unwrap(),
            ]
        })
        .collect();
    for run in 0..10 {
        let out = exe.execute_host(&args).unwrap_or_else(|e| panic!("{e}"));
        for (p, outputs) in out.iter().enumerate() {
            let got = outputs[0].to_vec::<f32>().unwrap();
            let want = &expected[p];
            let worst = got
                .iter()
                .zip(want)
                .map(|(&g, &e)| (f64::from(g) - e).abs())
                .fold(0.0, f64::max);
            assert!(worst == 0.0, "run {run}, device {p}: off by {worst}");
        }
    }
}

//! Every strategy checks its arrays with the single-device splash checks before building or
//! running anything: non-finite values and wrongly shaped `dout`, `out` or `lse` are named
//! errors, and zero sizes are refused instead of dividing by zero.

use tessera_dsl::{DType, HostArray, Lowering};
use tessera_parallel::strategy::{AllGather, Ring, Ulysses, Usp};
use tessera_parallel::{ContextParallel, CpInputs, Strategy};
use tessera_runtime::Platform;
use tessera_splash::{BlockSizes, Dims, Mask};

fn dims(heads: usize, kv_heads: usize) -> Dims {
    Dims {
        batch: 1,
        heads,
        kv_heads,
        q_len: 256,
        kv_len: 256,
        head_dim: 64,
        head_dim_v: 64,
    }
}

fn config(strategy: Strategy, d: Dims) -> ContextParallel {
    ContextParallel {
        dims: d,
        dtype: DType::F32,
        mask: Mask::causal(),
        block_sizes: BlockSizes::uniform(64, 64),
        options: Default::default(),
        strategy,
        devices: 2,
        load_balance: false,
        lowering: Lowering::portable(),
    }
}

/// `[1, heads, 256, 64]` filled with 0.5, with `value` at flat index 7.
fn array(heads: usize, value: f32) -> HostArray {
    let mut v = vec![0.5f32; heads * 256 * 64];
    v[7] = value;
    HostArray::f32([1, heads, 256, 64], v).unwrap()
}

fn inputs<'a>(q: &'a HostArray, k: &'a HostArray, v: &'a HostArray) -> CpInputs<'a> {
    CpInputs {
        q,
        k,
        v,
        segment_ids: None,
    }
}

fn strategies() -> [Strategy; 4] {
    [
        Ulysses.into(),
        AllGather.into(),
        Ring.into(),
        Usp {
            ulysses: 2,
            ring: 1,
        }
        .into(),
    ]
}

#[test]
fn every_strategy_checks_inputs_like_one_device() {
    let (q, kv) = (array(4, 0.5), array(2, 0.5));
    for strategy in strategies() {
        let cp = config(strategy.clone(), dims(4, 2));
        let nan_q = array(4, f32::NAN);
        let e = cp
            .forward(Platform::Cpu, &inputs(&nan_q, &kv, &kv))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("q holds a non-finite value (NaN) at flat index 7"),
            "{e}"
        );
        let inf_k = array(2, f32::INFINITY);
        let e = cp
            .check_inputs(&inputs(&q, &inf_k, &kv))
            .unwrap_err()
            .to_string();
        assert!(e.contains("k holds a non-finite value (inf)"), "{e}");

        let nan_dout = array(4, f32::NAN);
        let e = cp
            .forward_backward(Platform::Cpu, &inputs(&q, &kv, &kv), &nan_dout)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("dout holds a non-finite value"),
            "{strategy}: {e}"
        );
        let short_dout = HostArray::zeros(DType::F32, [1, 4, 128, 64]);
        let e = cp.check_dout(&short_dout).unwrap_err().to_string();
        assert!(
            e.contains("dout must be f32[1, 4, 256, 64] like the output, got f32[1, 4, 128, 64]"),
            "{strategy}: {e}"
        );
        let segments = HostArray::i32([1, 128], vec![0; 128]).unwrap();
        let e = cp
            .forward(
                Platform::Cpu,
                &CpInputs {
                    segment_ids: Some(&segments),
                    ..inputs(&q, &kv, &kv)
                },
            )
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("segment ids must be i32[1, 256]"),
            "{strategy}: {e}"
        );
    }
}

#[test]
fn zero_sizes_are_refused_without_dividing_by_zero() {
    for strategy in strategies() {
        for (d, name) in [(dims(0, 2), "query heads"), (dims(4, 0), "KV heads")] {
            let e = config(strategy.clone(), d)
                .validate()
                .unwrap_err()
                .to_string();
            assert!(
                e.contains(&format!("the number of {name} is 0; it must be at least 1")),
                "{strategy}: {e}"
            );
        }
    }
}

//! The fused Ulysses attention forward (`ulysses_attention_of`: the all-to-alls of q, k, v and
//! of the output inside the kernel, overlapping the attention) over a 4-device ring, against
//! dense f64 attention over the whole sequence (written apart from the kernel), on the
//! interpreter (copies landing at random points, devices interleaved at random), on 4 CPU
//! devices (one SPMD program, the remote copies as `collective_permute`s) and in the Mosaic
//! evaluator; compiled by libtpu for v5p (4 chips). Its backward (`ulysses_attention_bwd_of`)
//! likewise against dense f64 gradients.

mod common;

use tessera::backend::{self, Backend};
use tessera::collective_kernels::memory::{ring_mesh, RingMesh};
use tessera::collective_kernels::ulysses::{
    ulysses_attention, ulysses_attention_bwd, ulysses_attention_bwd_of,
    ulysses_attention_bwd_reference, ulysses_attention_bwd_staged_of, ulysses_attention_of,
    ulysses_attention_reference, ulysses_attention_staged_of, Logits, Visibility,
};
use tessera::dsl::axes::Context;
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{ArgSpec, DType, HostArray, KernelDef, KernelRules};

const N: usize = 4;

/// The kernel without segment ids (the references here have none; the strategy's tests
/// check packed sequences against splash's reference).
fn unsegmented(def: KernelDef) -> KernelDef {
    def.without("segment_ids").unwrap()
}

/// Every device's `q, k, v [H, SL, D]` (different values per device and tensor).
fn inputs(dtype: DType, heads: usize, rows: usize, d: usize) -> Vec<Vec<HostArray>> {
    (0..N)
        .map(|dev| {
            (0..3)
                .map(|t| HostArray::random(dtype, [heads, rows, d], 100 * t + dev as u64))
                .collect()
        })
        .collect()
}

/// Every device's `[out, lse]`.
fn reference(per_device: &[Vec<HostArray>], visible: impl Into<Visibility>) -> Vec<[Vec<f64>; 2]> {
    let tensor = |t: usize| -> Vec<HostArray> { per_device.iter().map(|x| x[t].clone()).collect() };
    ulysses_attention_reference(&tensor(0), &tensor(1), &tensor(2), visible)
}

/// 12 heads (3 per device: each head's exchange overlaps the head before, and the third
/// waits for its buffer to be free) of 32 rows per device (128 in all), blocks of 8; `out`
/// and `lse`.
fn case(causal: bool) -> (KernelDef, Vec<Vec<HostArray>>) {
    (
        unsegmented(ulysses_attention::<RingMesh, Context>(8, causal)),
        inputs(DType::F32, 12, 32, 128),
    )
}

#[test]
fn matches_dense_f64_attention_on_every_backend() {
    for causal in [true, false] {
        let (def, per_device) = case(causal);
        let want = reference(&per_device, causal);
        for b in Backend::everywhere() {
            let out =
                backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{b} causal {causal}: {e}"));
            for (d, outs) in out.iter().enumerate() {
                for (name, got, want) in [
                    ("out", &outs[0], &want[d][0]),
                    ("lse", &outs[1], &want[d][1]),
                ] {
                    let err = common::max_error(got, want);
                    assert!(
                        err <= 1e-5,
                        "{b} causal {causal}, device {d}: {name}: max error {err:e}"
                    );
                }
            }
        }
    }
}

#[test]
fn bf16_matches_dense_f64_attention_on_every_backend() {
    let def = unsegmented(ulysses_attention_of::<half::bf16, RingMesh, Context>(
        16,
        Visibility::Causal,
        Logits::default(),
    ));
    let per_device = inputs(DType::BF16, 4, 32, 128);
    let want = reference(&per_device, true);
    for b in Backend::everywhere() {
        let out = backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
            .unwrap_or_else(|e| panic!("{b}: {e}"));
        for (d, outs) in out.iter().enumerate() {
            let err = common::max_error(&outs[0], &want[d][0]);
            assert!(err <= 2e-2, "{b}, device {d}: max error {err:e}");
            // The queries are scaled in bf16 (rounded), so the logits and the lse carry
            // bf16's relative error (2^-9 of logits near 2).
            let err = common::max_error(&outs[1], &want[d][1]);
            assert!(err <= 5e-3, "{b}, device {d}: lse: max error {err:e}");
        }
    }
}

/// The kernel that stages the gathered heads in HBM (for heads that do not fit VMEM)
/// against dense f64 attention on every backend: causal (the key loop starting at the
/// first block), full, and a local window (a loop starting past block 0), f32 and bf16; its
/// three staging outputs follow `out` and `lse`.
#[test]
fn staged_in_hbm_matches_dense_f64_attention_on_every_backend() {
    let local = Visibility::Local {
        left: Some(11),
        right: Some(5),
    };
    for (dtype, visible, tolerance) in [
        (DType::F32, Visibility::Causal, 1e-5),
        (DType::F32, Visibility::Full, 1e-5),
        (DType::F32, local, 1e-5),
        (DType::BF16, Visibility::Causal, 2e-2),
    ] {
        let def = unsegmented(match dtype {
            DType::BF16 => ulysses_attention_staged_of::<half::bf16, RingMesh, Context>(
                8,
                visible,
                Logits::default(),
            ),
            _ => {
                ulysses_attention_staged_of::<f32, RingMesh, Context>(8, visible, Logits::default())
            }
        });
        let per_device = inputs(dtype, 12, 32, 128);
        let want = reference(&per_device, visible);
        for b in Backend::everywhere() {
            let out =
                backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{b} {dtype:?} {visible:?}: {e}"));
            for (d, outs) in out.iter().enumerate() {
                assert_eq!(outs.len(), 5, "out, lse and the three staging buffers");
                let err = common::max_error(&outs[0], &want[d][0]);
                assert!(
                    err <= tolerance,
                    "{b} {dtype:?} {visible:?}, device {d}: out: {err:e}"
                );
                let err = common::max_error(&outs[1], &want[d][1]);
                assert!(
                    err <= 5e-3,
                    "{b} {dtype:?} {visible:?}, device {d}: lse: {err:e}"
                );
            }
        }
    }
}

/// The staged backward against dense f64 gradients on every backend (causal, full, a local
/// window); its four staging outputs follow dq, dk and dv.
#[test]
fn staged_backward_matches_dense_f64_gradients_on_every_backend() {
    let local = Visibility::Local {
        left: Some(11),
        right: Some(5),
    };
    for visible in [Visibility::Causal, Visibility::Full, local] {
        let def = unsegmented(ulysses_attention_bwd_staged_of::<f32, RingMesh, Context>(
            8,
            visible,
            Logits::default(),
        ));
        let per_device = backward_inputs(DType::F32, 12, 16, 8, visible);
        for b in Backend::everywhere() {
            let out =
                backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{b} {visible:?}: {e}"));
            assert!(
                out.iter().all(|o| o.len() == 7),
                "dq, dk, dv and four staging buffers"
            );
            let err = backward_error(&out, &per_device, visible);
            assert!(err <= 1e-5, "{b} {visible:?}: relative error {err:e}");
        }
    }
}

/// The staged kernels' copies (the exchange into HBM, the blocks fetched one ahead) landing
/// anywhere, devices interleaved at random: no race, no deadlock, the same results; and
/// mosaic-eval gives them bit for bit.
#[test]
fn staged_landing_points_interleavings_and_mosaic_eval_agree() {
    let fwd = unsegmented(ulysses_attention_staged_of::<f32, RingMesh, Context>(
        8,
        Visibility::Causal,
        Logits::default(),
    ));
    let bwd = unsegmented(ulysses_attention_bwd_staged_of::<f32, RingMesh, Context>(
        8,
        Visibility::Causal,
        Logits::default(),
    ));
    for (def, per_device) in [
        (fwd, inputs(DType::F32, 12, 32, 128)),
        (bwd, backward_inputs(DType::F32, 12, 16, 8, true)),
    ] {
        let want = same_at_random_landing_points(&def, &per_device, 0..3, 90);
        assert_eq!(
            common::mosaic_eval_on_mesh(&def, &ring_mesh(N), &per_device),
            want
        );
    }
}

/// Local windows (both sides, one side) and chunked causal masks whose edges fall inside
/// the blocks, forward and backward, against dense f64 attention under the same mask on
/// every backend, and in mosaic-eval: the kernels skip the key (query) blocks a block sees
/// nothing of, and a block whose keys some rows see none of keeps their running max finite.
#[test]
fn local_and_chunked_masks_match_dense_f64_attention_on_every_backend() {
    for visible in [
        Visibility::Local {
            left: Some(11),
            right: Some(5),
        },
        Visibility::Local {
            left: Some(20),
            right: None,
        },
        Visibility::ChunkedCausal { chunk: 20 },
    ] {
        let def = unsegmented(ulysses_attention::<RingMesh, Context>(8, visible));
        let per_device = inputs(DType::F32, 4, 32, 128);
        let want = reference(&per_device, visible);
        let bwd = unsegmented(ulysses_attention_bwd::<RingMesh, Context>(8, visible));
        let bwd_inputs = backward_inputs(DType::F32, 4, 32, 8, visible);
        for b in Backend::everywhere() {
            let run = |def: &KernelDef, x: &[Vec<HostArray>]| {
                backend::run_on_devices(def, &ring_mesh(N), x, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{b} {visible:?}: {e}"))
            };
            for (d, outs) in run(&def, &per_device).iter().enumerate() {
                for (name, got, want) in [
                    ("out", &outs[0], &want[d][0]),
                    ("lse", &outs[1], &want[d][1]),
                ] {
                    let err = common::max_error(got, want);
                    assert!(err <= 1e-5, "{b} {visible:?}, device {d}: {name}: {err:e}");
                }
            }
            let err = backward_error(&run(&bwd, &bwd_inputs), &bwd_inputs, visible);
            assert!(
                err <= 1e-5,
                "{b} {visible:?} backward: relative error {err:e}"
            );
        }
        // The Mosaic lowering (the masks' integer vector ops too) bit for bit.
        for (def, x) in [(&def, &per_device), (&bwd, &bwd_inputs)] {
            let want = interpret::run_on_devices(def, &ring_mesh(N), x, &Default::default());
            assert_eq!(
                common::mosaic_eval_on_mesh(def, &ring_mesh(N), x),
                want.unwrap(),
                "{visible:?}"
            );
        }
    }
}

/// Copies landing anywhere between their start and their wait, and other interleavings of
/// the devices, find no race or deadlock and change nothing.
#[test]
fn landing_points_and_interleavings_do_not_change_the_result() {
    let (def, per_device) = case(true);
    same_at_random_landing_points(&def, &per_device, 0..4, 50);
}

/// `def` on the interpreter as it runs in order, after checking that the runs with copies
/// landing at random points and the devices interleaved at random (`seeds`, the schedule's
/// seeds `schedule_offset` further) give exactly the same.
fn same_at_random_landing_points(
    def: &KernelDef,
    per_device: &[Vec<HostArray>],
    seeds: std::ops::Range<u64>,
    schedule_offset: u64,
) -> Vec<Vec<HostArray>> {
    let want =
        interpret::run_on_devices(def, &ring_mesh(N), per_device, &Default::default()).unwrap();
    for seed in seeds {
        let options = InterpretOptions {
            copy_landing: Some(seed),
            schedule_seed: Some(seed + schedule_offset),
            ..Default::default()
        };
        let got = interpret::run_on_devices(def, &ring_mesh(N), per_device, &options)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        assert_eq!(got, want, "seed {seed}");
    }
    want
}

/// The Mosaic lowering, run by the evaluator on 4 devices, equals the interpreter bit for bit.
#[test]
fn mosaic_eval_on_four_devices_agrees_with_the_interpreter() {
    let (def, per_device) = case(true);
    let want =
        interpret::run_on_devices(&def, &ring_mesh(N), &per_device, &Default::default()).unwrap();
    assert_eq!(
        common::mosaic_eval_on_mesh(&def, &ring_mesh(N), &per_device),
        want
    );
}

/// libtpu compiles the forward and the backward for the 4 chips of v5p:2x2x1 (f32 and
/// bf16 with a soft cap; 8 heads of 512 rows per chip, 2048 in all, blocks of 256), with
/// segment ids; and both directions staged in HBM.
#[test]
fn libtpu_compiles_both_directions_for_four_v5p_chips() {
    let topology = tessera::tpu::TpuTopology::parse("tpu:v5p:2x2x1").unwrap();
    // bf16 with Gemma 2's soft cap.
    let capped = Logits::new(None, Some(50.0));
    let bf16 = |bwd: bool| {
        if bwd {
            ulysses_attention_bwd_of::<half::bf16, RingMesh, Context>(
                256,
                Visibility::Causal,
                capped,
            )
        } else {
            ulysses_attention_of::<half::bf16, RingMesh, Context>(256, Visibility::Causal, capped)
        }
    };
    for (def, dtype, arrays) in [
        (
            ulysses_attention::<RingMesh, Context>(256, true),
            DType::F32,
            3,
        ),
        (bf16(false), DType::BF16, 3),
        // Gemma's sliding window (a window of 300 keys across the blocks' edges) and Llama
        // 4's chunks (of 384: a block in two chunks).
        (
            ulysses_attention_of::<half::bf16, RingMesh, Context>(
                256,
                Visibility::Local {
                    left: Some(300),
                    right: Some(0),
                },
                Logits::default(),
            ),
            DType::BF16,
            3,
        ),
        (
            ulysses_attention_bwd_of::<half::bf16, RingMesh, Context>(
                256,
                Visibility::ChunkedCausal { chunk: 384 },
                Logits::default(),
            ),
            DType::BF16,
            4,
        ),
        (
            ulysses_attention_bwd::<RingMesh, Context>(256, true),
            DType::F32,
            4,
        ),
        (bf16(true), DType::BF16, 4),
        // The kernels that stage the gathered heads in HBM.
        (
            ulysses_attention_staged_of::<half::bf16, RingMesh, Context>(
                256,
                Visibility::Causal,
                capped,
            ),
            DType::BF16,
            3,
        ),
        (
            ulysses_attention_bwd_staged_of::<half::bf16, RingMesh, Context>(
                256,
                Visibility::Causal,
                capped,
            ),
            DType::BF16,
            4,
        ),
    ] {
        let args = compile_args(dtype, arrays, 8, 512, 256);
        let report = topology
            .compile_kernel_on(&def, &args, &ring_mesh(N))
            .unwrap_or_else(|e| panic!("{} {dtype}: {e}", def.name()));
        assert_eq!(report.kernels, [def.name()], "{dtype}");
        println!(
            "{} {dtype}: scoped VMEM {:?}",
            def.name(),
            report.kernel_vmem
        );
    }
}

/// The arguments of a direction of `arrays` `[heads, rows, 128]` arrays (3: the forward, 4:
/// the backward), with the segment ids and (backward) lse and di: f32 `[heads, rows / block,
/// 1, block]`.
fn compile_args(
    dtype: DType,
    arrays: usize,
    heads: usize,
    rows: usize,
    block: usize,
) -> Vec<ArgSpec> {
    let mut args = vec![ArgSpec::new(dtype, [heads, rows, 128]); arrays];
    let row_arrays = if arrays == 4 { 3 } else { 1 };
    args.extend(vec![
        ArgSpec::new(
            DType::F32,
            [heads, rows / block, 1, block]
        );
        row_arrays
    ]);
    args
}

/// The staged forward (`bwd` false) or backward in f32 with the default logits.
fn staged_f32(bwd: bool, visible: Visibility) -> KernelDef {
    if bwd {
        ulysses_attention_bwd_staged_of::<f32, RingMesh, Context>(8, visible, Logits::default())
    } else {
        ulysses_attention_staged_of::<f32, RingMesh, Context>(8, visible, Logits::default())
    }
}

/// Both directions prove every index they compute when instantiated: no run-time check, so
/// no check flags (which nothing reads inside a train step; `ulysses_fused` refuses a
/// kernel that has them).
#[test]
fn both_directions_prove_every_index_in_range() {
    let local = Visibility::Local {
        left: Some(11),
        right: None,
    };
    let chunked = Visibility::ChunkedCausal { chunk: 20 };
    for (def, arrays) in [
        (ulysses_attention::<RingMesh, Context>(8, true), 3),
        (ulysses_attention::<RingMesh, Context>(8, local), 3),
        (ulysses_attention::<RingMesh, Context>(8, chunked), 3),
        (ulysses_attention_bwd::<RingMesh, Context>(8, false), 4),
        (ulysses_attention_bwd::<RingMesh, Context>(8, local), 4),
        (ulysses_attention_bwd::<RingMesh, Context>(8, chunked), 4),
        (staged_f32(false, Visibility::Causal), 3),
        (staged_f32(false, local), 3),
        (staged_f32(true, chunked), 4),
        (staged_f32(true, local), 4),
    ] {
        for devices in [2, 4, 8] {
            let args = compile_args(DType::F32, arrays, 8, 16, 8);
            let k = def
                .instantiate_on(&args, &ring_mesh(devices), &KernelRules::tpu())
                .unwrap();
            assert!(
                k.checks.sites.is_empty(),
                "{} on {devices}: {k}",
                def.name()
            );
            assert!(k.checks.flags.is_none() && k.checks.proven > 0);
        }
    }
}

/// The Mosaic call's cost estimate (what XLA's scheduler and whole-program estimate take)
/// counts the key blocks the causal loops run: the key loop's bound is set by the query
/// block, and the estimate walks the query loop to count it. Per grid step (one head) of
/// 16 query blocks of 8 rows over 16 key blocks (4 devices of 32 rows), each key block a
/// query block meets costs an `exp` of its `[8, 8]` logits and of the `[8, 1]` running max,
/// and each query block a `log` of its 8 rows' sum (the lse): causal meets 136 of the 256.
#[test]
fn cost_estimates_count_the_key_blocks_the_causal_loops_run() {
    let transcendentals = |visible: bool| {
        let def = unsegmented(ulysses_attention::<RingMesh, Context>(8, visible));
        let args = compile_args(DType::F32, 3, 8, 32, 8);
        let k = def
            .instantiate_on(&args[..3], &ring_mesh(N), &KernelRules::tpu())
            .unwrap();
        tessera::dsl::mosaic::lower(&k)
            .unwrap()
            .cost
            .transcendentals
    };
    let per_head = |pairs: u64| pairs * (8 * 8 + 8) + 16 * 8;
    // 8 heads on 4 devices: 2 grid steps.
    assert_eq!(transcendentals(true), 2 * per_head(136));
    assert_eq!(transcendentals(false), 2 * per_head(256));
}

/// Both directions on a context axis of 64 chips (v5p:4x4x4, as MaxText's USP cells take
/// context 64), bf16 with segment ids: their semaphores do not grow with the axis but for
/// one `ready` per device, where one per (buffer, source) ran out of the chip's semaphore
/// memory (libtpu: memory space "sflag") from about 46 devices.
#[test]
fn libtpu_compiles_both_directions_on_a_64_chip_axis() {
    let topology = tessera::tpu::TpuTopology::parse("tpu:v5p:4x4x4").unwrap();
    let mesh = ring_mesh(64);
    for (def, arrays) in [
        (
            ulysses_attention_of::<half::bf16, RingMesh, Context>(
                64,
                Visibility::Causal,
                Logits::default(),
            ),
            3,
        ),
        (
            ulysses_attention_bwd_of::<half::bf16, RingMesh, Context>(
                64,
                Visibility::Causal,
                Logits::default(),
            ),
            4,
        ),
    ] {
        let args = compile_args(DType::BF16, arrays, 64, 64, 64);
        let report = topology
            .compile_kernel_on(&def, &args, &mesh)
            .unwrap_or_else(|e| panic!("{}: {e}", def.name()));
        assert_eq!(report.kernels, [def.name()]);
    }
}

/// Every device's `q, k, v, dout [H, SL, D]` and the forward's residuals the backward takes,
/// `lse` and `di = rowsum(out * dout)` (`[H, SL / block, 1, block]` f32), from the f64
/// reference's forward.
fn backward_inputs(
    dtype: DType,
    heads: usize,
    rows: usize,
    block: usize,
    visible: impl Into<Visibility>,
) -> Vec<Vec<HostArray>> {
    let mut per_device: Vec<Vec<HostArray>> = (0..N)
        .map(|dev| {
            (0..4)
                .map(|t| HostArray::random(dtype, [heads, rows, 128], 200 * t + dev as u64))
                .collect()
        })
        .collect();
    let forward = reference(&per_device, visible);
    let stats = [heads, rows / block, 1, block];
    for (x, [out, lse]) in per_device.iter_mut().zip(forward) {
        let dout = x[3].to_f64_vec();
        let di: Vec<f32> = out
            .chunks(128)
            .zip(dout.chunks(128))
            .map(|(o, d)| o.iter().zip(d).map(|(a, b)| a * b).sum::<f64>() as f32)
            .collect();
        let lse: Vec<f32> = lse.iter().map(|&l| l as f32).collect();
        x.push(HostArray::f32(stats, lse).unwrap());
        x.push(HostArray::f32(stats, di).unwrap());
    }
    per_device
}

/// The largest error of every device's `dq, dk, dv` relative to the largest reference
/// gradient of that array.
fn backward_error(
    out: &[Vec<HostArray>],
    per_device: &[Vec<HostArray>],
    visible: impl Into<Visibility>,
) -> f64 {
    let t = |i: usize| -> Vec<HostArray> { per_device.iter().map(|x| x[i].clone()).collect() };
    let want = ulysses_attention_bwd_reference(&t(0), &t(1), &t(2), &t(3), visible);
    let mut worst: f64 = 0.0;
    for g in 0..3 {
        let top = want
            .iter()
            .flat_map(|w| w[g].iter())
            .fold(0.0f64, |a, x| a.max(x.abs()));
        for (dev, outs) in out.iter().enumerate() {
            worst = worst.max(common::max_error(&outs[g], &want[dev][g]) / top);
        }
    }
    worst
}

#[test]
fn backward_matches_dense_f64_gradients_on_every_backend() {
    for causal in [true, false] {
        let def = unsegmented(ulysses_attention_bwd::<RingMesh, Context>(8, causal));
        let per_device = backward_inputs(DType::F32, 12, 16, 8, causal);
        for b in Backend::everywhere() {
            let out =
                backend::run_on_devices(&def, &ring_mesh(N), &per_device, b, &KernelRules::tpu())
                    .unwrap_or_else(|e| panic!("{b} causal {causal}: {e}"));
            let err = backward_error(&out, &per_device, causal);
            assert!(err <= 1e-5, "{b} causal {causal}: relative error {err:e}");
        }
    }
}

#[test]
fn bf16_backward_matches_dense_f64_gradients() {
    let def = unsegmented(ulysses_attention_bwd_of::<half::bf16, RingMesh, Context>(
        16,
        Visibility::Causal,
        Logits::default(),
    ));
    let per_device = backward_inputs(DType::BF16, 4, 16, 16, true);
    let out = backend::run_on_devices(
        &def,
        &ring_mesh(N),
        &per_device,
        Backend::Interpret,
        &KernelRules::tpu(),
    )
    .unwrap();
    let err = backward_error(&out, &per_device, true);
    assert!(err <= 3e-2, "relative error {err:e}");
}

/// The backward's copies landing anywhere, devices interleaved at random: no race, no
/// deadlock, the same gradients; mosaic-eval gives them bit for bit.
#[test]
fn backward_landing_points_interleavings_and_mosaic_eval_agree() {
    let def = unsegmented(ulysses_attention_bwd::<RingMesh, Context>(8, true));
    let per_device = backward_inputs(DType::F32, 12, 16, 8, true);
    let want = same_at_random_landing_points(&def, &per_device, 0..3, 70);
    assert_eq!(
        common::mosaic_eval_on_mesh(&def, &ring_mesh(N), &per_device),
        want
    );
}

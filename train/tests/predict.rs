//! The step-time model: FLOPs, splash blocks and collective bytes against hand counts,
//! sanity, and the origin PR's cells beside the model's predictions.

use tessera_dsl::{DType, KernelRules};
use tessera_parallel::strategy::{AllGather, Exchange, Ring, Ulysses, Usp};
use tessera_parallel::Strategy;
use tessera_splash::{BlockSizes, Dims, Mask, SeqOffsets, ShardedSplash, SplashAttention};
use tessera_train::predict::{predict_step, Chip, Efficiency, StepPrediction, StepSetup};
use tessera_train::ModelConfig;

const EFF: Efficiency = Efficiency::CALIBRATED;

/// A 2 x 4 wrapped torus of v5p chips: fsdp 2 on the first axis, context 4 on the second.
fn small_chip(torus: Vec<usize>) -> Chip {
    Chip {
        torus,
        wraparound: true,
        ..Chip::v5p([4, 4, 4])
    }
}

/// The tiny model, 256 tokens, 8 sequences on fsdp 2 x context 4 (4 per device, 64 tokens
/// each), blocks of 64, no load balancing.
fn tiny(strategy: Strategy) -> StepSetup {
    StepSetup {
        model: ModelConfig::tiny(),
        seq_len: 256,
        per_device_batch: 1.0,
        fsdp: 2,
        context: 4,
        strategy,
        load_balance: false,
        blocks: BlockSizes::uniform(64, 64).with_fused_bwd(true),
        remat_attention: true,
    }
}

fn predict(setup: &StepSetup, chip: &Chip) -> StepPrediction {
    predict_step(setup, chip, EFF).unwrap()
}

#[test]
fn matmul_and_attention_flops_match_hand_counts() {
    let p = predict(&tiny(Strategy::from(Ulysses)), &small_chip(vec![2, 4]));
    // tiny: vocab 256, d 128, 2 layers, 8 heads, 4 KV heads, head dim 16, mlp 384.
    // Matmul params: 2 x (128*16*(16+8) + 3*128*384) + 128*256 = 425984; remat per layer:
    // 128*16*(8+8) + 2*128*384 = 131072; 256 tokens per device.
    let matmul = 6.0 * 256.0 * 425984.0 + 2.0 * 256.0 * 2.0 * 131072.0;
    assert_eq!(p.counts.matmul_flops, matmul);
    // Ulysses: the whole 256-token sequence, 8 / 4 = 2 heads, 4 sequences; causal over 4 x 4
    // blocks of 64 computes 10 per head: 80 blocks forward and backward per layer.
    assert_eq!(p.counts.attention_blocks_fwd, 80);
    assert_eq!(p.counts.attention_blocks_bwd, 80);
    // Forward (twice: remat) 4*64*64*16 per block, fused backward 10*64*64*16, 2 layers.
    let attention = 2.0 * (2.0 * 80.0 * 262144.0 + 80.0 * 655360.0);
    assert_eq!(p.counts.attention_flops, attention);
    let peak = 459e12 * EFF.matmul;
    assert!((p.breakdown.compute_matmul_s - matmul / peak).abs() < 1e-15);
    assert!((p.breakdown.compute_attention_s - attention / peak).abs() < 1e-15);
    // MaxText's model FLOPs per device: 6 N T + 3 x 4 B S^2 H D / 2 per layer, 8 sequences
    // over 8 devices.
    let model =
        (6.0 * 425984.0 * 8.0 * 256.0 + 3.0 * 2.0 * 4.0 * 8.0 * 65536.0 * 128.0 / 2.0) / 8.0;
    assert_eq!(p.model_flops, model);
    assert!((p.predicted_mfu - model / (p.predicted_step_s * 459e12)).abs() < 1e-12);
}

#[test]
fn saving_the_attention_drops_its_re_run_and_the_q_k_v_projections() {
    let chip = small_chip(vec![2, 4]);
    let full = predict(&tiny(Strategy::from(Ulysses)), &chip);
    let saved = predict(
        &StepSetup {
            remat_attention: false,
            ..tiny(Strategy::from(Ulysses))
        },
        &chip,
    );
    // The q, k, v projections (128*16*(8+8) params a layer, 2 layers, 256 tokens) and one
    // forward pass of the attention (80 blocks of 4*64*64*16 a layer) fewer.
    let qkv = 2.0 * 256.0 * 2.0 * (128.0 * 16.0 * 16.0);
    assert_eq!(full.counts.matmul_flops - saved.counts.matmul_flops, qkv);
    let attention = 2.0 * 80.0 * 262144.0;
    assert_eq!(
        full.counts.attention_flops - saved.counts.attention_flops,
        attention
    );
    assert!(saved.predicted_step_s < full.predicted_step_s);
}

#[test]
fn attention_blocks_match_splash_own_counts() {
    // Portable rules: the 64-blocks of the tiny sizes are below TPU lane tiling; the block
    // classification is the same.
    let target = KernelRules::portable();
    let blocks = BlockSizes::uniform(64, 64).with_fused_bwd(true);
    // Ulysses: the whole sequence, 2 heads, 4 sequences.
    let dims = |q_len, heads| Dims {
        batch: 4,
        heads,
        kv_heads: 1,
        q_len,
        kv_len: 256,
        head_dim: 128,
        head_dim_v: 128,
    };
    let ulysses = SplashAttention::new(
        Mask::causal(),
        dims(256, 2),
        DType::BF16,
        blocks,
        Default::default(),
        target.clone(),
    )
    .unwrap();
    let chip = small_chip(vec![2, 4]);
    let p = predict(&tiny(Strategy::from(Ulysses)), &chip);
    assert_eq!(p.counts.attention_blocks_fwd, ulysses.stats().computed());
    // All-gather: device c's 64 queries at 64 c against all 256 keys, 8 heads; the busiest
    // device (the last) bounds the step.
    let offsets: Vec<SeqOffsets> = (0..4).map(|c| SeqOffsets { q: 64 * c, kv: 0 }).collect();
    let sharded = ShardedSplash::new(
        Mask::causal(),
        dims(64, 8),
        DType::BF16,
        blocks,
        Default::default(),
        target,
        &offsets,
    )
    .unwrap();
    let busiest = sharded
        .shards()
        .iter()
        .map(|s| s.stats().computed())
        .max()
        .unwrap();
    let p = predict(&tiny(Strategy::from(AllGather)), &chip);
    assert_eq!(p.counts.attention_blocks_fwd, busiest);
    assert_eq!(busiest, 4 * 8 * 4);
    // Ring without balancing: at every step some device holds a whole visible block (step 0:
    // the diagonal), so the chain is 4 steps of 1 block x 8 heads x 4 sequences.
    let p = predict(&tiny(Strategy::from(Ring)), &chip);
    assert_eq!(p.counts.attention_blocks_fwd, 4 * 8 * 4);
    // Balanced ring: device c holds chunks c and 7 - c of 8 (32 tokens, one block each); at
    // step t it holds the keys of k = c - t, chunks k and 7 - k. Query chunk c sees key chunk
    // k iff k <= c and never 7 - k; query chunk 7 - c always sees k and sees 7 - k iff k >= c:
    // 3 blocks at step 0 (k = c), 2 at every other step.
    let balanced = StepSetup {
        load_balance: true,
        blocks: BlockSizes::uniform(32, 32).with_fused_bwd(true),
        ..tiny(Strategy::from(Ring))
    };
    let p = predict(&balanced, &chip);
    // 3 + 2 + 2 + 2 = 9 per head and sequence.
    assert_eq!(p.counts.attention_blocks_fwd, 9 * 8 * 4);
}

#[test]
fn collective_bytes_match_hand_counts() {
    let chip = small_chip(vec![2, 4]);
    let link = 100e9;
    // Per device: 4 sequences x 64 tokens. q / out: 4*64*8*16*2 = 65536 bytes, k and v:
    // 4*64*4*16*2 = 32768 bytes each.
    let u = predict(&tiny(Strategy::from(Ulysses)), &chip);
    // Forward q, k, v, out; remat q, k, v; backward dout, dq, dk, dv.
    let bytes = 3.0 * 131072.0 + 2.0 * 65536.0;
    assert_eq!(u.counts.context_bytes_per_layer, bytes);
    // K/V's collectives run behind the V and Q projections (forward, remat) and dq's two
    // matmuls (backward): 256 tokens, d 128, head dim 16, 4 KV heads, 8 heads.
    let rate = chip.peak_bf16_flops * EFF.matmul;
    let behind_fwd = 2.0 * 256.0 * 128.0 * 16.0 * (4.0 + 8.0) / rate;
    let behind_bwd = 4.0 * 256.0 * 128.0 * 16.0 * 8.0 / rate;
    let exposed = |transfer: f64, behind: f64| (transfer - behind).max(0.0);
    // All-to-all on a wrapped ring of 4: hops 0 + 1 + 2 + 1 = 4 over 2 links. q, out, dout
    // and dq (and the remat's q) exposed; k and v together (65536 bytes) behind the matmuls.
    let a2a = |bytes: f64| bytes / 4.0 * 4.0 / (2.0 * link);
    let per_layer = 5.0 * a2a(65536.0)
        + 2.0 * exposed(a2a(65536.0), behind_fwd)
        + exposed(a2a(65536.0), behind_bwd);
    assert!(exposed(a2a(65536.0), behind_fwd) > 0.0);
    assert!((u.breakdown.context_collectives_s - 2.0 * per_layer).abs() < 1e-15);
    // All-gather: K and V gathered to 2 x 4 x 32768 bytes, forward and remat, dK/dV
    // reduce-scattered once; (n-1)/n over 2 links.
    let a = predict(&tiny(Strategy::from(AllGather)), &chip);
    assert_eq!(a.counts.context_bytes_per_layer, 3.0 * 262144.0);
    let pass = 0.75 * 262144.0 / (2.0 * link);
    let per_layer = 2.0 * exposed(pass, behind_fwd) + exposed(pass, behind_bwd);
    assert!((a.breakdown.context_collectives_s - 2.0 * per_layer).abs() < 1e-15);
    // Ring: 3 permutes of K and V forward, 3 in the remat, 3 of K, V, dK, dV backward.
    let r = predict(&tiny(Strategy::from(Ring)), &chip);
    assert_eq!(r.counts.context_bytes_per_layer, 3.0 * 65536.0 * 4.0);
    // fsdp: a layer is 128*16*(16+8) + 3*128*384 = 196608 parameters.
    assert_eq!(u.counts.fsdp_gather_bytes_per_layer, 196608.0 * 2.0);
    assert_eq!(u.counts.fsdp_reduce_bytes_per_layer, 196608.0 * 4.0);
    // AdamW: 28 bytes per parameter of this device's shard of 1/8.
    let params = ModelConfig::tiny().num_params() as f64;
    assert_eq!(u.counts.optimizer_bytes, params / 8.0 * 28.0);
}

#[test]
fn ring_steps_cost_the_larger_of_compute_and_transfer() {
    // A slow link makes every permute longer than its step's attention: the exposed time is
    // the transfer less the compute, step by step.
    let slow = Chip {
        ici_link_bandwidth: 1e6,
        ..small_chip(vec![2, 4])
    };
    let r = predict(&tiny(Strategy::from(Ring)), &slow);
    let kv = 2.0 * 32768.0 / 1e6;
    let step_fwd = (8.0 * 4.0) * 4.0 * 64.0 * 64.0 * 16.0 / (459e12 * EFF.attention);
    let step_bwd = step_fwd * 2.5;
    let exposed = 2.0 * 3.0 * (2.0 * (kv - step_fwd) + (2.0 * kv - step_bwd));
    assert!((r.breakdown.context_collectives_s - exposed).abs() < 1e-9 * exposed);
}

#[test]
fn more_context_devices_mean_less_compute_per_device() {
    for strategy in [
        Strategy::from(Ulysses),
        Strategy::from(AllGather),
        Strategy::from(Ring),
    ] {
        // The same 4 sequences over fsdp 2 x context 2 and fsdp 2 x context 4.
        let two = StepSetup {
            context: 2,
            per_device_batch: 1.0,
            ..tiny(strategy.clone())
        };
        let four = StepSetup {
            context: 4,
            per_device_batch: 0.5,
            ..tiny(strategy.clone())
        };
        let p2 = predict(&two, &small_chip(vec![2, 2]));
        let p4 = predict(&four, &small_chip(vec![2, 4]));
        assert!(
            p4.counts.matmul_flops < p2.counts.matmul_flops,
            "{strategy}"
        );
        assert!(
            p4.counts.attention_flops < p2.counts.attention_flops,
            "{strategy}"
        );
        assert!(p4.model_flops < p2.model_flops, "{strategy}");
    }
}

#[test]
fn meshes_that_do_not_fit_the_slice_are_refused_with_the_fix() {
    let chip = Chip::v5p([4, 4, 4]);
    let wrong_count = StepSetup {
        fsdp: 2,
        context: 4,
        ..tiny(Strategy::from(Ulysses))
    };
    let e = predict_step(&wrong_count, &chip, EFF)
        .unwrap_err()
        .to_string();
    assert!(e.contains("64 chips"), "{e}");
    let split_axis = StepSetup {
        fsdp: 8,
        context: 8,
        per_device_batch: 1.0,
        seq_len: 512,
        ..tiny(Strategy::from(Ulysses))
    };
    let e = predict_step(&split_axis, &chip, EFF)
        .unwrap_err()
        .to_string();
    assert!(e.contains("whole axes"), "{e}");
    assert!(Chip::parse("v5p:4x4").is_err());
    assert_eq!(Chip::parse("v5e:16x16").unwrap(), Chip::v5e([16, 16]));
}

/// The origin PR's cells on v5p-128 (4x4x4): block 2048 for Ulysses, 1024 for all-gather and
/// ring, load balancing (MaxText's default) for all-gather and ring, 2M tokens a step.
fn pr_cell(model: ModelConfig, seq: usize, cp: usize, strategy: Strategy) -> StepSetup {
    let ulysses = strategy.exchange(cp) == Exchange::Heads;
    let block = if ulysses { 2048 } else { 1024 };
    StepSetup {
        model,
        seq_len: seq,
        per_device_batch: (1 << 21) as f64 / seq as f64 / 64.0,
        fsdp: 64 / cp,
        context: cp,
        strategy,
        load_balance: !ulysses,
        blocks: BlockSizes::uniform(block, block).with_fused_bwd(true),
        remat_attention: true,
    }
}

/// The fused Ulysses kernels at the origin PR's llama2-7b 32K cp16 cell (blocks 2048, which
/// divide the 2048 rows a device holds), beside plain Ulysses: the exchange runs behind the
/// attention but for each pass's first head and last chunk, so fewer collective seconds
/// are exposed, with the same attention and matmul seconds.
#[test]
fn fused_ulysses_beside_ulysses_at_the_origin_cell() {
    let chip = Chip::v5p([4, 4, 4]);
    let plain = pr_cell(ModelConfig::llama2_7b(), 32768, 16, Strategy::from(Ulysses));
    let fused = StepSetup {
        strategy: Strategy::parse("ulysses_fused", 16).unwrap(),
        ..plain.clone()
    };
    let (p, f) = (predict(&plain, &chip), predict(&fused, &chip));
    println!("ulysses: {}\nulysses_fused: {}", p.to_json(), f.to_json());
    let (pb, fb) = (p.breakdown, f.breakdown);
    assert!(fb.context_collectives_s > 0.0, "{fb:?}");
    assert!(
        fb.context_collectives_s < pb.context_collectives_s,
        "{fb:?} vs {pb:?}"
    );
    let same = |a: f64, b: f64| (a / b - 1.0).abs() < 1e-12;
    assert!(
        same(fb.compute_attention_s, pb.compute_attention_s),
        "{fb:?} vs {pb:?}"
    );
    assert!(
        same(fb.compute_matmul_s, pb.compute_matmul_s),
        "{fb:?} vs {pb:?}"
    );
    assert!(f.predicted_step_s < p.predicted_step_s);
}

#[test]
fn calibration_cell_is_reproduced() {
    let p = predict(
        &pr_cell(
            ModelConfig::llama3_1_8b(),
            8192,
            4,
            Strategy::from(AllGather),
        ),
        &Chip::v5p([4, 4, 4]),
    );
    assert!(
        (p.predicted_mfu - 0.612).abs() < 0.002,
        "{}",
        p.predicted_mfu
    );
}

#[test]
fn origin_pr_cells_beside_the_model() {
    let chip = Chip::v5p([4, 4, 4]);
    let mut worst = 0.0f64;
    for (strategy, measured) in [
        (Strategy::from(Ulysses), 8.90),
        (Strategy::from(AllGather), 8.83),
        (Strategy::from(Ring), 16.38),
    ] {
        let p = predict(
            &pr_cell(ModelConfig::llama2_7b(), 32768, 16, strategy.clone()),
            &chip,
        );
        let error = p.predicted_step_s / measured - 1.0;
        println!(
            "llama2-7b 32K cp16 {strategy}: predicted {:.2} s, measured {measured} s ({:+.1}%) {}",
            p.predicted_step_s,
            100.0 * error,
            p.to_json()
        );
        // MaxText's own count agrees with the PR's TFLOP/s x step (239.4 x 8.90 = 2131 TF)
        // within 1%.
        assert!((p.model_flops / 2.1307e15 - 1.0).abs() < 0.01);
        worst = worst.max(error.abs());
    }
    // What the model achieves (see the report): Ulysses -4.7%, all-gather +11.5%, ring -8.9%.
    assert!(worst < 0.12, "worst error {worst}");
    for (seq, cells) in [
        (
            65536,
            [
                (Strategy::from(Ulysses), 53.0),
                (Strategy::from(AllGather), 61.6),
                (Strategy::from(Ring), 60.4),
            ],
        ),
        (
            8192,
            [
                (Strategy::from(Ulysses), 56.4),
                (Strategy::from(AllGather), 61.2),
                (Strategy::from(Ring), 59.8),
            ],
        ),
    ] {
        for (strategy, mfu) in cells {
            let p = predict(
                &pr_cell(ModelConfig::llama3_1_8b(), seq, 4, strategy.clone()),
                &chip,
            );
            println!(
                "llama3.1-8b {seq} cp4 {strategy}: predicted {:.1}% MFU ({:.1} TFLOP/s), PR {mfu}% \
                 {}",
                100.0 * p.predicted_mfu,
                p.tflops_per_device,
                p.to_json()
            );
            assert!((100.0 * p.predicted_mfu - mfu).abs() < 10.0);
        }
    }
}

/// USP is ring attention over its ring axis after Ulysses' all-to-alls over its Ulysses
/// axis: with one of the degrees 1 it predicts exactly the other strategy; with both above 1
/// its collectives are the ring's permutes (on chunks of `S / R` with `H / U` heads) plus the
/// all-to-alls.
#[test]
fn usp_is_ring_after_ulysses() {
    let chip = small_chip(vec![2, 2, 2]);
    let setup = |strategy: Strategy| StepSetup {
        context: 4,
        ..tiny(strategy)
    };
    let usp = |ulysses, ring| Strategy::from(Usp { ulysses, ring });
    let ring = predict(&setup(Strategy::from(Ring)), &chip);
    assert_eq!(predict(&setup(usp(1, 4)), &chip), ring);
    let ulysses = predict(&setup(Strategy::from(Ulysses)), &chip);
    assert_eq!(predict(&setup(usp(4, 1)), &chip), ulysses);
    let both = predict(&setup(usp(2, 2)), &chip);
    // 4 sequences per fsdp shard, 256 tokens, tiny's 4 KV heads of 16 dims: the ring moves
    // K and V chunks of 128 tokens with 2 KV heads, once per remat forward pass and forward,
    // twice (with dK, dV) in the backward, over 1 permute.
    let kv_chunk = (4 * 128 * 2 * 16) as f64 * 2.0;
    let ring_bytes = 2.0 * kv_chunk * 4.0;
    // The all-to-alls' local inputs: 64 tokens per device, q and out with 8 heads, k and v
    // with 4: forward q k v out, remat q k v, backward dout dq dk dv.
    let q = (4 * 64 * 8 * 16) as f64 * 2.0;
    let kv = (4 * 64 * 4 * 16) as f64 * 2.0;
    let qkv = q + 2.0 * kv;
    let a2a_bytes = 3.0 * qkv + 2.0 * q;
    assert_eq!(both.counts.context_bytes_per_layer, ring_bytes + a2a_bytes);
    assert!(both.breakdown.context_collectives_s > 0.0);
    // Its attention is ring's over 2 devices on 4 of the 8 heads: half the heads of a ring
    // over the same 2-device chunks.
    assert!(both.counts.attention_flops > 0.0);
    let e = predict_step(&setup(usp(4, 1)), &small_chip(vec![8, 1]), EFF);
    assert!(e.is_err());
    let e = predict_step(
        &StepSetup {
            fsdp: 1,
            context: 8,
            per_device_batch: 0.5,
            ..tiny(usp(4, 2))
        },
        &small_chip(vec![2, 4]),
        EFF,
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains(
            "usp:4x2 (Ulysses degree 4 x ring degree 2) does not map onto whole axes of the"
        ),
        "{e}"
    );
}

/// The USP runs the model will be held against: llama3.1-8b on v5p-128 (4x4x4), context 64
/// over every chip, global batch 1 (`per_device_batch_size` 1/64), bf16, 64K to 256K tokens;
/// printed (`-- --nocapture`) for both ways of putting USP's degrees on whole torus axes.
#[test]
fn usp_predictions_for_one_sequence_on_64_chips() {
    let chip = Chip::v5p([4, 4, 4]);
    for seq in [65_536, 131_072, 262_144] {
        for (ulysses, ring) in [(16, 4), (4, 16)] {
            let setup = StepSetup {
                model: ModelConfig::llama3_1_8b(),
                seq_len: seq,
                per_device_batch: 1.0 / 64.0,
                fsdp: 1,
                context: 64,
                strategy: Strategy::from(Usp { ulysses, ring }),
                load_balance: false,
                blocks: BlockSizes::uniform(1024, 1024).with_fused_bwd(true),
                remat_attention: true,
            };
            let p = predict(&setup, &chip);
            let b = &p.breakdown;
            eprintln!(
                "usp:{ulysses}x{ring} S={seq}: {:.3} s, MFU {:.1}% (matmuls {:.3} s, attention \
                 {:.3} s, context collectives {:.3} s)",
                p.predicted_step_s,
                100.0 * p.predicted_mfu,
                b.compute_matmul_s,
                b.compute_attention_s,
                b.context_collectives_s
            );
            assert!(p.predicted_step_s > 0.0 && p.predicted_mfu < 1.0);
            assert!(b.context_collectives_s > 0.0);
        }
    }
}

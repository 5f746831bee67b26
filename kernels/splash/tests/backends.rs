//! Splash attention's forward, logsumexp and gradients against the f64 reference, on the
//! interpreter and on the PJRT CPU backend: a matrix of masks x {MHA, GQA, MQA} x block sizes
//! (separate and fused backward) x {segment ids, soft cap, sinks, offsets}, each case on
//! both backends. Sizes are small (S 256-512) so the suite fits a 2-core CI in debug mode.

mod util;

use tessera_splash::{BlockSizes, DenseMask, Dims, Mask, MultiHeadMask, SeqOffsets};
use util::{check, check_all, dims, segments, Case, ShuffledInterpreter};

#[test]
fn full_mask_mha_with_explicit_scale() {
    let mut c = Case::new("full/mha/128x128", dims(1, 2, 2, 256, 64), Mask::Full);
    c.options.scale = Some(0.05);
    check_all(&c);
}

#[test]
fn causal_gqa_fused_backward() {
    let mut c = Case::new(
        "causal/gqa/128x128/fused",
        dims(1, 4, 2, 256, 64),
        Mask::causal(),
    );
    c.blocks = BlockSizes::uniform(128, 128).with_fused_bwd(true);
    check_all(&c);
}

#[test]
fn fused_backward_cycles_four_key_blocks_through_three_dq_partials() {
    // Key block 3 adds to partial 0 after blocks 0-2: 3 grid steps later with one query
    // block (the closest Mosaic's pipeline allows), 24 later with 4 query blocks and 2 heads
    // a key/value head.
    let mut c = Case::new(
        "causal/mha/512x128/fused",
        dims(1, 2, 2, 512, 64),
        Mask::causal(),
    );
    c.blocks = BlockSizes::uniform(512, 128).with_fused_bwd(true);
    check_all(&c);
    let mut c = Case::new(
        "causal/gqa/128x128/S512/fused",
        dims(1, 4, 2, 512, 64),
        Mask::causal(),
    );
    c.blocks = BlockSizes::uniform(128, 128).with_fused_bwd(true);
    check_all(&c);
}

#[test]
fn causal_with_negative_offset_mqa_has_empty_rows() {
    // Rows 0..40 see no key: out 0 and lse -inf (the reference agrees), gradients 0.
    let c = Case::new(
        "causal(-40)/mqa/128x128",
        dims(1, 2, 1, 256, 64),
        Mask::Causal { offset: -40 },
    );
    check_all(&c);
}

#[test]
fn local_window_batched_with_segment_ids() {
    let mut c = Case::new(
        "local(40,10)/mha/b2/segments",
        dims(2, 2, 2, 256, 64),
        Mask::local(40, 10),
    );
    c.blocks = BlockSizes::uniform(128, 128);
    c.segments = Some(segments(2, &[100, 56, 100]));
    check_all(&c);
}

#[test]
fn chunked_gqa_soft_cap_with_compute_blocks_fused() {
    let mut c = Case::new(
        "chunked(96)/gqa/softcap/compute",
        dims(1, 4, 2, 512, 64),
        Mask::chunked(96),
    );
    let mut b = BlockSizes::uniform(128, 256).with_fused_bwd(true);
    b.block_kv_compute = 128;
    b.block_kv_dkv_compute = 128;
    c.blocks = b;
    c.options.soft_cap = Some(2.5);
    check_all(&c);
}

/// dQ computing its 512-key blocks in halves, as `default_dq_compute_block` picks for
/// them, with the separate backward kernels and segment ids.
#[test]
fn causal_dq_in_compute_halves_with_segment_ids() {
    let mut c = Case::new(
        "causal/gqa/dq-compute",
        dims(1, 2, 1, 512, 64),
        Mask::causal(),
    );
    c.blocks = BlockSizes::uniform(128, 512);
    assert_eq!(c.blocks.dq_compute_block(), 256);
    c.segments = Some(segments(1, &[200, 312]));
    check_all(&c);
}

/// Diagonal blocks by sub-tiles (those above the diagonal skipped) in every kernel: causal
/// GQA with segment ids and sinks (separate and fused backward), and a dense mask whose
/// diagonal blocks are causal, each with the tables checked to use the path.
#[test]
fn diagonal_blocks_by_sub_tiles() {
    // One 512-query block: 4 x 4 sub-tiles of 128.
    let mut c = Case::new(
        "causal/gqa/diagonal(128)",
        dims(1, 4, 2, 512, 64),
        Mask::causal(),
    );
    c.blocks = BlockSizes {
        block_diagonal: Some(128),
        ..BlockSizes::uniform(512, 512)
    };
    c.segments = Some(segments(1, &[300, 212]));
    c.sinks = Some(vec![0.5, -1.0, 2.0, 0.0]);
    let attn = util::attention(&c);
    for info in [
        attn.fwd_mask_info(),
        attn.dkv_mask_info(),
        attn.dq_mask_info().unwrap(),
    ] {
        assert_eq!(info.diagonal_sub_tiles, Some(128));
    }
    check_all(&c);
    c.blocks = c.blocks.with_fused_bwd(true);
    c.name = "causal/gqa/diagonal(128)/fused";
    assert_eq!(
        util::attention(&c).dkv_mask_info().diagonal_sub_tiles,
        Some(128)
    );
    check_all(&c);
    // Dense: causal plus a few stray keys below the diagonal blocks (stored partial blocks,
    // loaded by sub-tile windows).
    let bits: Vec<bool> = (0..512 * 512)
        .map(|x| x % 512 <= x / 512 || (x / 512 >= 256 && x % 512 < 256 && x % 7 == 0))
        .collect();
    let mut d = Case::new(
        "dense/mqa/diagonal(128)",
        dims(1, 2, 1, 512, 64),
        Mask::Dense(DenseMask::new(512, 512, bits).unwrap()),
    );
    d.blocks = BlockSizes {
        block_diagonal: Some(128),
        ..BlockSizes::uniform(256, 256)
    };
    assert_eq!(
        util::attention(&d).fwd_mask_info().diagonal_sub_tiles,
        Some(128)
    );
    check_all(&d);
}

#[test]
fn dense_custom_mask_mqa() {
    let mut rng = fastrand::Rng::with_seed(5);
    let bits: Vec<bool> = (0..256 * 256)
        .map(|x| x / 256 == x % 256 || (x % 256 < 128 && rng.f32() < 0.3))
        .collect();
    let mask = Mask::Dense(DenseMask::new(256, 256, bits).unwrap());
    let mut c = Case::new("dense/mqa/128x128", dims(1, 2, 1, 256, 64), mask);
    c.blocks = BlockSizes::uniform(128, 128);
    check_all(&c);
}

#[test]
fn per_head_masks_gqa_with_segments_fused() {
    let mask = MultiHeadMask::PerHead(vec![
        Mask::causal(),
        Mask::local(64, 0),
        Mask::causal(),
        Mask::Full,
    ]);
    let mut c = Case::new("per-head/gqa/segments/fused", dims(1, 4, 2, 256, 64), mask);
    c.blocks = BlockSizes::uniform(128, 128).with_fused_bwd(true);
    c.segments = Some(segments(1, &[200, 56]));
    check_all(&c);
}

#[test]
fn many_per_head_masks_fall_back_to_stored_blocks() {
    // Five distinct computable masks exceed what is evaluated in-kernel: stored blocks.
    let mask = MultiHeadMask::PerHead((0..5).map(|h| Mask::local(16 + 30 * h, 8)).collect());
    let mut c = Case::new("per-head(5)/mqa/stored", dims(1, 5, 1, 256, 64), mask);
    c.blocks = BlockSizes::uniform(128, 128);
    check_all(&c);
}

#[test]
fn and_or_combination_head_dim_128_soft_cap() {
    let mask = Mask::causal()
        .and(Mask::local(100, 0))
        .or(Mask::chunked(32));
    let mut c = Case::new("and/or/d128/softcap", dims(1, 2, 2, 256, 128), mask);
    c.options.soft_cap = Some(4.0);
    c.segments = Some(segments(1, &[128, 128]));
    check_all(&c);
}

#[test]
fn attention_sinks() {
    let mut c = Case::new("causal/sinks/gqa", dims(1, 4, 2, 256, 64), Mask::causal());
    c.sinks = Some(vec![0.5, -1.0, 2.0, 0.0]);
    check_all(&c);
    c.blocks = c.blocks.with_fused_bwd(true);
    c.name = "causal/sinks/gqa/fused";
    check_all(&c);
}

#[test]
fn query_shard_with_sequence_offsets() {
    // Query shard 1 of 2 of a 256-token sequence against all keys (all-gather context
    // parallelism): the causal diagonal moves by the shard's offset.
    let d = Dims {
        q_len: 128,
        ..dims(1, 2, 2, 256, 64)
    };
    let mut c = Case::new("causal/q-shard-offset", d, Mask::causal());
    c.blocks = BlockSizes::uniform(128, 128);
    c.options.offsets = SeqOffsets { q: 128, kv: 0 };
    check_all(&c);
    // A ring step: the key block of shard 0 seen from query shard 1 is entirely visible.
    let d = Dims {
        q_len: 128,
        kv_len: 128,
        ..d
    };
    let mut c = Case::new("causal/ring-kv-offset", d, Mask::causal());
    c.blocks = BlockSizes::uniform(128, 128);
    c.options.offsets = SeqOffsets { q: 128, kv: 0 };
    check_all(&c);
}

#[test]
fn parallel_grid_dims_carry_no_state() {
    // Shuffled parallel dims (batch, heads) must not change the results.
    let mut c = Case::new(
        "causal/gqa/b2/shuffled",
        dims(2, 4, 2, 256, 64),
        Mask::causal(),
    );
    c.blocks = BlockSizes::uniform(128, 128);
    check(&c, &ShuffledInterpreter(3), "shuffled interpreter");
    c.blocks = c.blocks.with_fused_bwd(true);
    check(&c, &ShuffledInterpreter(4), "shuffled interpreter");
}

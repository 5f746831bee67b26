//! A kernel's cost read from libtpu's own bundles (`tessera::tpu::cost`), compile-only: splash
//! forward compiled for v5p (two TensorCores) and v5e (one), its report checked against what
//! the grid and the causal mask say independently.
//!
//! libtpu reads its dump flags once, when it loads, so this test has its own `main` (no
//! harness): it asks for the dumps before anything loads libtpu, on the one thread there is.

use tessera::dsl::{DType, Target};
use tessera::splash::{splash_program, BlockSizes, Dims, Mask, Pass, SplashAttention};
use tessera::tpu::cost::KernelCost;
use tessera::tpu::TpuTarget;

/// The cost of splash forward (bf16, causal, blocks 512) on `heads` heads of `seq` tokens.
fn forward_cost(topology: &str, heads: usize, seq: usize) -> KernelCost {
    let dims = Dims {
        batch: 1,
        heads,
        kv_heads: heads,
        q_len: seq,
        kv_len: seq,
        head_dim: 128,
        head_dim_v: 128,
    };
    let attn = SplashAttention::new(
        Mask::causal(),
        dims,
        DType::BF16,
        BlockSizes::uniform(512, 512),
        Default::default(),
        Target::tpu(),
    )
    .unwrap();
    let program = splash_program(&attn, Pass::Forward, Default::default()).unwrap();
    let report = TpuTarget::parse(&format!("tpu:{topology}"))
        .unwrap()
        .compile(&program)
        .unwrap();
    let mut costs = report
        .kernel_costs
        .expect("libtpu was loaded with its dumps, so the report has kernel costs");
    assert_eq!(costs.len(), 1, "{costs:?}");
    let cost = costs.remove(0);
    println!("{topology} H={heads} S={seq}\n{}", cost.table());
    cost
}

fn runs(c: &KernelCost, path: &str) -> u64 {
    c.paths.iter().find(|p| p.path == path).unwrap().runs
}

fn main() {
    let _dumps = tessera::runtime::enable_libtpu_dumps().unwrap();

    // v5p, 2 heads of 4 query blocks: the parallel head dim puts one head on each core.
    let small = forward_cost("v5p:2x2x1", 2, 2048);
    assert_eq!(small.kernel, "splash_fwd");
    assert!(small.exact, "{:?}", small.caveat);
    assert_eq!(small.grid, vec![1, 2, 4, 4]);
    assert_eq!(small.cores, 2);
    assert_eq!(
        small.steps_per_core,
        2 * 16 / 2,
        "the head dim halves the steps"
    );
    // The loop runs the core's steps and the pipeline's two extra iterations.
    assert_eq!(small.loop_trips, Some(small.steps_per_core + 2));
    // Paths: outside the loop, the step, then init, full and masked blocks, finalize.
    let names: Vec<&str> = small.paths.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(names.len(), 6, "{names:?}");
    assert_eq!(
        [names[0], names[1], names[2], names[5]],
        ["outside loop", "step", "init", "finalize"]
    );
    assert!(
        small.paths.iter().all(|p| p.bundles > 0),
        "{:?}",
        small.paths
    );
    // Per core one head: 4 rows; of its 4 x 4 blocks the causal mask computes the 6 below
    // the diagonal in full and the 4 on it masked.
    assert_eq!((runs(&small, "init"), runs(&small, "finalize")), (4, 4));
    assert_eq!((runs(&small, names[3]), runs(&small, names[4])), (6, 4));
    let by_paths: u64 = small.paths.iter().map(|p| p.bundles * p.runs).sum();
    assert_eq!(small.cycles_per_core, by_paths);
    assert_eq!(small.cycles_all_cores, 2 * small.cycles_per_core);
    assert!(small.mxu_utilisation > 0.0 && small.mxu_utilisation <= 1.0);
    assert!(small.mxu_bound_per_core > 0 && small.mxu_bound_per_core < small.cycles_per_core);
    assert!(small.scoped_vmem_bytes.is_some_and(|b| b > 0));

    // Twice the sequence: 8 x 8 blocks, 28 full and 8 masked per head, more cycles.
    let long = forward_cost("v5p:2x2x1", 2, 4096);
    assert_eq!(long.steps_per_core, 64);
    assert_eq!((runs(&long, names[3]), runs(&long, names[4])), (28, 8));
    assert!(long.cycles_per_core > 3 * small.cycles_per_core);

    // v5e has one TensorCore: the same grid runs whole on it.
    let one = forward_cost("v5e:2x2", 2, 2048);
    assert_eq!(
        (one.cores, one.steps_per_core),
        (1, 2 * small.steps_per_core)
    );
    assert_eq!(one.loop_trips, Some(one.steps_per_core + 2));
    assert_eq!((runs(&one, names[3]), runs(&one, names[4])), (12, 8));
    assert_eq!(one.cycles_all_cores, one.cycles_per_core);
    println!("tpu_cost: ok");
}

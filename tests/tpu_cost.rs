//! A kernel's cost read from libtpu's own bundles (`tessera::tpu::cost`), compile-only: splash
//! forward compiled for v5p (two TensorCores) and v5e (one), its report checked against what
//! the grid and the causal mask say independently; paged attention's steps and VMEM likewise.
//!
//! libtpu reads its dump flags once, when it loads, so this test has its own `main` (no
//! harness): it asks for the dumps before anything loads libtpu, on the one thread there is.

use tessera::dsl::{ArgSpec, DType, KernelRules, Lowering};
use tessera::paged::paged_attention;
use tessera::splash::{splash_program, BlockSizes, Dims, Mask, Pass, SplashAttention};
use tessera::tpu::cost::KernelCost;
use tessera::tpu::TpuTopology;

/// The cost of splash forward (bf16, causal, blocks 512, diagonal blocks by 128-row sub-tiles)
/// on `heads` heads of `seq` tokens.
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
        BlockSizes {
            block_diagonal: Some(128),
            ..BlockSizes::uniform(512, 512)
        },
        Default::default(),
        Lowering::tpu(),
    )
    .unwrap();
    let program = splash_program(&attn, Pass::Forward, Default::default()).unwrap();
    let report = TpuTopology::parse(&format!("tpu:{topology}"))
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

    // v5p, 2 heads of 4 query blocks: the parallel head dim puts one head on each core. The
    // grid is compacted to the 10 blocks (1 + 2 + 3 + 4) the causal mask leaves.
    let small = forward_cost("v5p:2x2x1", 2, 2048);
    assert_eq!(small.kernel, "splash_fwd");
    assert!(small.exact, "{:?}", small.caveat);
    assert_eq!(small.grid, vec![1, 2, 1, 10]);
    assert_eq!(small.cores, 2);
    assert_eq!(
        small.steps_per_core,
        2 * 10 / 2,
        "the head dim halves the steps"
    );
    // The loop runs the core's steps and the pipeline's two extra iterations.
    assert_eq!(small.loop_trips, Some(small.steps_per_core + 2));
    // Paths: outside the loop, the step, then a row's start, full blocks, the diagonal
    // blocks by 128-row sub-tiles (every masked block of a causal mask is one), a row's end.
    let names: Vec<&str> = small.paths.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(names.len(), 6, "{names:?}");
    let path_at = |code: &str| {
        let line = include_str!("../kernels/splash/src/kernels.rs")
            .lines()
            .position(|l| l.contains(code))
            .unwrap_or_else(|| panic!("`{code}` in splash's kernels"));
        format!("kernels.rs:{}", line + 1)
    };
    let (starts, diagonal, ends) = (
        path_at("when(starts, || {"),
        path_at("when(kind.eq(DIAGONAL), || diagonal_step(sub))"),
        path_at("when(ends, || {"),
    );
    assert_eq!(
        [names[0], names[1], names[2], names[4], names[5]],
        [
            "outside loop",
            "step",
            starts.as_str(),
            diagonal.as_str(),
            ends.as_str()
        ]
    );
    // Skipping the 6 of 16 sub-tiles above the diagonal leaves 10/16 of a full block's
    // matmul work (as MXU slots: the sub-tiles' pushes and pops).
    let (full, diag) = (&small.paths[3], &small.paths[4]);
    assert!(
        diag.mxu_slots * 16 < full.mxu_slots * 12,
        "diagonal {} MXU slots against a full block's {}",
        diag.mxu_slots,
        full.mxu_slots
    );
    assert!(
        small.paths.iter().all(|p| p.bundles > 0),
        "{:?}",
        small.paths
    );
    // Per core one head: 4 rows; of its 4 x 4 blocks the causal mask computes the 6 below
    // the diagonal in full and the 4 on it by sub-tiles.
    assert_eq!((runs(&small, &starts), runs(&small, &ends)), (4, 4));
    assert_eq!((runs(&small, names[3]), runs(&small, names[4])), (6, 4));
    let by_paths: u64 = small.paths.iter().map(|p| p.bundles * p.runs).sum();
    assert_eq!(small.cycles_per_core, by_paths);
    assert_eq!(small.cycles_all_cores, 2 * small.cycles_per_core);
    assert!(small.mxu_utilisation > 0.0 && small.mxu_utilisation <= 1.0);
    assert!(small.mxu_bound_per_core > 0 && small.mxu_bound_per_core < small.cycles_per_core);
    assert!(small.scoped_vmem_bytes.is_some_and(|b| b > 0));

    // Twice the sequence: 8 x 8 blocks, 28 full and 8 masked per head, more cycles.
    let long = forward_cost("v5p:2x2x1", 2, 4096);
    assert_eq!(long.steps_per_core, 36);
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
    paged_attention_steps_and_vmem();
    the_cli_reads_a_dump_directory_as_it_reads_its_own_compile();
    println!("tpu_cost: ok");
}

/// Paged attention (bf16, 8 sequences of 128 pages of 16 tokens, 32 query and 8 KV heads,
/// 8 pages per block) on v5p: the sequences split over the two cores, 4 x 8 steps each. A
/// sequence's first block is fetched at its first KV head's step only (`init`: 4 runs a
/// core, as is the zeroing of its output block); the loop over blocks, whose trip count is a
/// run-time value libtpu guards with a branch, is a path of its own at every step; the
/// branch that copies a failed run-time check to the check flags is one too, run by no step
/// of a passing run. `q` and `out` are single-buffered, so libtpu's scoped VMEM is what
/// tessera's rules count with one buffer for them (two would be 16 KiB more), and the
/// checks take none (their state is in SMEM). Both at most JAX's.
fn paged_attention_steps_and_vmem() {
    let def = paged_attention::<half::bf16>(8);
    let args = [
        ArgSpec::new(DType::BF16, [8, 32, 128]),
        ArgSpec::new(DType::BF16, [8, 1024, 16, 128]),
        ArgSpec::new(DType::BF16, [8, 1024, 16, 128]),
        ArgSpec::new(DType::I32, [8]),
        ArgSpec::new(DType::I32, [8, 128]),
    ];
    let report = TpuTopology::parse("tpu:v5p:2x2x1")
        .unwrap()
        .compile_kernel(&def, &args)
        .unwrap();
    let mut costs = report.kernel_costs.expect("kernel costs from the dumps");
    let cost = costs.remove(0);
    println!("paged attention\n{}", cost.table());
    assert_eq!((cost.grid.as_slice(), cost.cores), ([8, 8].as_slice(), 2));
    assert_eq!(cost.steps_per_core, 32);
    let names: Vec<&str> = cost.paths.iter().map(|p| p.path.as_str()).collect();
    let line = include_str!("../kernels/paged/src/paged_attention.rs")
        .lines()
        .position(|l| l.contains("fori_loop(0, blocks, init"))
        .expect("the block loop");
    let block_loop = format!("paged_attention.rs:{}", line + 1);
    assert_eq!(
        names,
        [
            "outside loop",
            "step",
            "init",
            block_loop.as_str(),
            "init",
            tessera::dsl::mosaic::CHECK_FAILED_PATH,
        ],
        "{:?}",
        cost.paths
    );
    let path_runs: Vec<u64> = cost.paths.iter().map(|p| p.runs).collect();
    assert_eq!(path_runs[2..], [4, 32, 4, 0], "{:?}", cost.paths);
    let failure = cost.paths.last().unwrap();
    assert!(failure.bundles > 0 && failure.bundles < 64, "{failure:?}");
    let kernel = def.instantiate(&args, &KernelRules::tpu()).unwrap();
    let counted = tessera::dsl::rules::vmem_bytes(&kernel) as i64;
    assert_eq!(cost.scoped_vmem_bytes, Some(counted));
    assert_eq!(counted, 2 * (2 * 8 * 16 * 128 * 2) + 2 * (32 * 128 * 2));
    // At or below JAX's own paged attention (its faster, megacore form; measured by
    // scripts/memory_cost.sh with the same libtpu and reader) on cycles per core and VMEM.
    let measured: serde_json::Value =
        serde_json::from_str(include_str!("../scripts/memory_cost.json")).unwrap();
    let jax = &measured["paged_attention"];
    let best = ["jax", "jax_megacore_batch"]
        .iter()
        .map(|run| &jax[run][0])
        .min_by_key(|c| c["cycles_per_core"].as_u64().unwrap())
        .unwrap();
    assert!(
        cost.cycles_per_core <= best["cycles_per_core"].as_u64().unwrap(),
        "tessera {} cycles per core, JAX {best}",
        cost.cycles_per_core
    );
    assert!(
        counted <= best["scoped_vmem_bytes"].as_i64().unwrap(),
        "JAX {best}"
    );
}

/// `tessera compile` with the user's own dump directory (kept), then `tessera
/// tpu-dump-report` on it: the same costs, read by the same reader from the same files.
fn the_cli_reads_a_dump_directory_as_it_reads_its_own_compile() {
    let dir = std::env::temp_dir().join(format!("tessera-tpu-cost-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let run = |args: &[&str], init_args: Option<String>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args(args);
        if let Some(a) = init_args {
            cmd.env("LIBTPU_INIT_ARGS", a);
        }
        let out = cmd.output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.success(), stdout, stderr)
    };
    let d = dir.to_str().unwrap();
    let (ok, empty, err) = run(&["tpu-dump-report", d], None);
    assert!(!ok && empty.is_empty(), "{empty}");
    assert!(err.contains("holds no Mosaic kernel dumps"), "{err}");
    let (ok, compiled, err) = run(
        &[
            "compile",
            "--target",
            "tpu:v5p:2x2x1",
            "attention",
            "--heads",
            "2",
            "--seq-len",
            "2048",
            "--block-q",
            "512",
            "--block-kv",
            "512",
            "--pass",
            "forward",
        ],
        Some(format!(
            "--xla_jf_dump_to={d} --xla_jf_dump_llo_pass_label_regex=final"
        )),
    );
    assert!(ok, "{err}");
    assert!(compiled.contains("cycles per core"), "{compiled}");
    let (ok, read, err) = run(&["tpu-dump-report", d, "--target", "tpu:v5p:2x2x1"], None);
    assert!(ok, "{err}");
    let field = |text: &str, name: &str| -> Vec<String> {
        let last = text.lines().last().unwrap_or("");
        last.split(&format!("\"{name}\":"))
            .skip(1)
            .map(|v| v.split([',', '}']).next().unwrap().to_string())
            .collect()
    };
    for name in [
        "cycles_per_core",
        "cycles_all_cores",
        "mxu_bound_per_core",
        "steps_per_core",
    ] {
        let want = field(&compiled, name);
        assert_eq!(want.len(), 1, "{name} in {compiled}");
        assert_eq!(field(&read, name), want, "{name}");
    }
    // A dump directory that does not exist yet is made (libtpu does not make it).
    let fresh = dir.join("new").join("dumps");
    let (ok, _, err) = run(
        &["compile", "--target", "tpu:v5p:2x2x1", "kernel", "matmul"],
        Some(format!("--xla_jf_dump_to={}", fresh.display())),
    );
    assert!(ok, "{err}");
    assert!(
        std::fs::read_dir(&fresh).is_ok_and(|mut d| d.next().is_some()),
        "no dumps in {}",
        fresh.display()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

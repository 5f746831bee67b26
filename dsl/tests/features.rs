//! Kernel features end to end on the interpreter: run-time loops, scalar prefetch driving
//! index maps, squeezed block dims, compile-time specialisation, windows, single-buffered
//! blocks.

use tessera_dsl::interpret::{run, InterpretOptions};
use tessera_dsl::prelude::*;
use tessera_dsl::{ArgSpec, Buffering, HostArray, KernelRules};

/// Sums the rows of each block with a run-time loop over row windows.
#[tpu_kernel(grid = (R / 64,), dimension_semantics = (parallel,))]
fn row_groups_sum(
    #[shape(R, 128)]
    #[block((64, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R / 8, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let total = fori_loop(0, 8, zeros(DType::F32, &[8, 128]), |g, acc| {
        acc + x.at(&[ds(g * 8, 8), all()]).load()
    });
    out.store(total);
}

#[test]
fn fori_loop_carries_values_and_reads_dynamic_windows() {
    let values: Vec<f32> = (0..128 * 128).map(|i| (i % 97) as f32).collect();
    let x = HostArray::f32([128, 128], values.clone()).unwrap();
    let out = run(&row_groups_sum(), &[x], &InterpretOptions::default()).unwrap();
    assert_eq!(out[0].shape(), &[16, 128]);
    let got = out[0].to_f32_vec();
    for blk in 0..2 {
        for r in 0..8 {
            for c in 0..128 {
                let want: f32 = (0..8)
                    .map(|g| values[(blk * 64 + g * 8 + r) * 128 + c])
                    .sum();
                assert_eq!(got[(blk * 8 + r) * 128 + c], want);
            }
        }
    }
    let k = row_groups_sum()
        .instantiate(&[ArgSpec::new(DType::F32, [128, 128])], &KernelRules::tpu())
        .unwrap();
    let text = k.to_text();
    assert!(text.contains("fori_loop"), "{text}");
    assert!(text.contains("yield"), "{text}");
}

/// Gathers rows of blocks in the order given by a scalar-prefetch table (block sparsity's
/// mechanism): the index map reads SMEM; the head dim is squeezed.
#[tpu_kernel(grid = (H, N), dimension_semantics = (parallel, arbitrary))]
fn gather_blocks(
    #[shape(H, N)] order: Smem<i32>,
    #[shape(H, S, 128)]
    #[block((None, 8, 128), |h, j| (h, order.get([h, j]), 0))]
    x: Ref<f32>,
    #[shape(H, S, 128)]
    #[block((None, 8, 128), |h, j| (h, j, 0))]
    out: RefMut<f32>,
) {
    let block = x.load();
    assert_eq!(
        x.shape(),
        vec![8, 128],
        "squeezed dims leave the kernel's view"
    );
    out.store(block * 2.0);
}

#[test]
fn scalar_prefetch_drives_index_maps() {
    let (h, n) = (2usize, 4usize);
    let x: Vec<f32> = (0..h * n * 8 * 128).map(|i| i as f32).collect();
    let order = vec![3, 2, 1, 0, 0, 0, 1, 1];
    let args = [
        HostArray::i32([h, n], order.clone()).unwrap(),
        HostArray::f32([h, n * 8, 128], x.clone()).unwrap(),
    ];
    let out = run(&gather_blocks(), &args, &InterpretOptions::default()).unwrap();
    let got = out[0].to_f32_vec();
    for hh in 0..h {
        for j in 0..n {
            let src = order[hh * n + j] as usize;
            for r in 0..8 * 128 {
                let want = 2.0 * x[(hh * n + src) * 8 * 128 + r];
                assert_eq!(got[(hh * n + j) * 8 * 128 + r], want);
            }
        }
    }
    // A table entry out of range is refused by the index map's run-time check (the block
    // is not copied) with the operand, the value, its bound and the grid step.
    let bad = [
        HostArray::i32([h, n], vec![0, 1, 2, 4, 0, 0, 0, 0]).unwrap(),
        args[1].clone(),
    ];
    let e = run(&gather_blocks(), &bad, &InterpretOptions::default())
        .map(drop)
        .unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains(
            "the block index of `x` along dim 1 (its index map) is 4 at grid step [0, 3], \
             outside 0 to 3"
        ),
        "{text}"
    );
}

/// Compile-time parameters specialise: a Rust `if` picks code, a Rust `for` unrolls.
#[tpu_kernel(grid = (1,))]
fn power<const P: usize>(
    #[shape(8, 128)] x: Ref<f32>,
    #[shape(8, 128)] out: RefMut<f32>,
    #[comptime] negate: bool,
) {
    let v = x.load();
    let mut acc = v;
    for _ in 1..P {
        acc = acc * v;
    }
    out.store(if negate { -acc } else { acc });
}

#[test]
fn compile_time_parameters_specialise_the_ir() {
    let arg = [ArgSpec::new(DType::F32, [8, 128])];
    let cube = power::<3>(false)
        .instantiate(&arg, &KernelRules::tpu())
        .unwrap();
    let square_neg = power::<2>(true)
        .instantiate(&arg, &KernelRules::tpu())
        .unwrap();
    let count = |t: &str, op: &str| {
        t.lines()
            .filter(|l| l.contains(&format!("= {op} ")))
            .count()
    };
    assert_eq!(count(&cube.to_text(), "mul"), 2);
    assert_eq!(count(&cube.to_text(), "neg"), 0);
    assert_eq!(count(&square_neg.to_text(), "mul"), 1);
    assert_eq!(count(&square_neg.to_text(), "neg"), 1);
    // Instantiation is cached by (kernel, parameters, arguments, rules).
    let again = power::<3>(false)
        .instantiate(&arg, &KernelRules::tpu())
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(&cube, &again));
    let x = HostArray::f32([8, 128], vec![2.0; 1024]).unwrap();
    let out = run(&power::<3>(true), &[x], &InterpretOptions::default()).unwrap();
    assert!(out[0].to_f32_vec().iter().all(|&v| v == -8.0));
}

/// `x` is one `[8, 128]` block per row of the grid, `w` the same block at every step.
#[tpu_kernel(grid = (M / 8,))]
fn scale_rows(
    #[shape(M, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(8, 128)]
    #[block((8, 128), |_| (0, 0), buffers = 1)]
    w: Ref<f32>,
    #[shape(M, 128)]
    #[block((8, 128), |i| (i, 0), buffers = 2)]
    out: RefMut<f32>,
) {
    out.store(x.load() * w.load());
}

#[test]
fn a_block_may_keep_one_buffer() {
    let specs = [
        ArgSpec::new(DType::F32, [64, 128]),
        ArgSpec::new(DType::F32, [8, 128]),
    ];
    let k = scale_rows()
        .instantiate(&specs, &KernelRules::tpu())
        .unwrap();
    let buffering: Vec<_> = k
        .operands
        .iter()
        .map(|o| o.block.as_ref().unwrap().buffering)
        .collect();
    assert_eq!(
        buffering,
        [Buffering::Double, Buffering::Single, Buffering::Double]
    );
    assert_eq!(k.to_text().matches(" single-buffered").count(), 1);
    // Two buffers of x and of out, one of w: 5 blocks of 4 KiB.
    let block = 8 * 128 * 4;
    assert_eq!(tessera_dsl::rules::vmem_bytes(&k), 5 * block);
    let refused =
        scale_rows().instantiate(&specs, &KernelRules::tpu().with_vmem_limit(5 * block - 1));
    assert!(refused.is_err());
    let text = tessera_dsl::mosaic::lower(&k).unwrap().text;
    let synchronous = "pipeline_mode = #tpu.pipeline_mode<synchronous>";
    assert_eq!(text.matches(synchronous).count(), 1, "{text}");
    let window_of_w = text
        .split("window_params")
        .nth(1)
        .unwrap()
        .split('}')
        .nth(1)
        .unwrap();
    assert!(window_of_w.contains(synchronous), "{window_of_w}");
    // What the kernel computes does not change.
    let xs: Vec<f32> = (0..64 * 128).map(|i| (i % 13) as f32).collect();
    let ws: Vec<f32> = (0..8 * 128).map(|i| (i % 5) as f32 - 2.0).collect();
    let args = [
        HostArray::f32([64, 128], xs.clone()).unwrap(),
        HostArray::f32([8, 128], ws.clone()).unwrap(),
    ];
    let got = run(&scale_rows(), &args, &InterpretOptions::default()).unwrap();
    let want: Vec<f32> = xs
        .iter()
        .enumerate()
        .map(|(i, x)| x * ws[i % (8 * 128)])
        .collect();
    assert_eq!(got[0].to_f32_vec(), want);
}

//! Kernels that break one TPU rule each (the line that breaks it is marked `// breaks:`),
//! shared by `tests/tpu_rules.rs` (our rules refuse them) and `tests/mosaic_tpu_compile.rs`
//! (libtpu refuses them too).
#![allow(dead_code)]

use tessera::dsl::prelude::*;
use tessera::dsl::{ArgSpec, KernelDef};

#[tpu_kernel(grid = (1,))]
fn bool_operand(
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<bool>, // breaks: bool operand
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    out.store(select(x.load(), 1.0, 0.0));
}

#[tpu_kernel(grid = (1,))]
fn i8_arithmetic(
    #[shape(32, 128)]
    #[block((32, 128), |i| (i, 0))]
    x: Ref<i8>,
    #[shape(32, 128)]
    #[block((32, 128), |i| (i, 0))]
    out: RefMut<i8>,
) {
    let doubled = x.load() + x.load(); // breaks: i8 arithmetic
    out.store(doubled);
}

#[tpu_kernel(grid = (1,))]
fn i8_to_bool(
    #[shape(32, 128)]
    #[block((32, 128), |i| (i, 0))]
    x: Ref<i8>,
    #[shape(32, 128)]
    #[block((32, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let set = x.load().cast(DType::Bool); // breaks: i8 cast
    out.store(select(set, 1.0, 0.0));
}

#[tpu_kernel(grid = (1,))]
fn rank1_iota(
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<i32>,
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<i32>,
) {
    let lanes = iota(DType::I32, &[128], 0); // breaks: rank-1 iota
    out.store(x.load() + lanes);
}

#[tpu_kernel(grid = (1,))]
fn reduce_to_scalar(
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let total = x.load().sum(-1).sum(0); // breaks: rank-1 reduction
    out.store(x.load() + total);
}

#[tpu_kernel(grid = (1,))]
fn retiling_reshape(
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(16, 64)]
    #[block((16, 64), |i| (i, 0))]
    out: RefMut<f32>,
) {
    let halves = x.load().reshape(&[16, 64]); // breaks: reshape
    out.store(halves.exp());
}

#[tpu_kernel(grid = (1,))]
fn integer_dot(
    #[shape(8, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<i32>,
    #[shape(8, 8)]
    #[block((8, 8), |i| (i, 0))]
    out: RefMut<i32>,
) {
    out.store(dot_nt(x.load(), x.load())); // breaks: integer dot
}

#[tpu_kernel(grid = (1,))]
fn bf16_scalar(
    #[shape(16, 128)]
    #[block((16, 128), |i| (i, 0))]
    x: Ref<bf16>,
    #[shape(16, 128)]
    #[block((16, 128), |i| (i, 0))]
    out: RefMut<bf16>,
) {
    let step = program_id(0).cast(DType::BF16);
    let next = step + 1.0; // breaks: bf16 scalar
    out.store(x.load() * next);
}

/// `k` DMA semaphores of scratch, each counting one copy of `x` into `out`: over the 2 KiB of
/// semaphore memory a TPU kernel has from 513 (4 bytes each). Not one of [`all`]: the rule
/// is on the kernel's scratch, not on a line.
#[tpu_kernel(grid = (1,))]
fn many_semaphores(
    #[shape(8, 128)] x: Hbm<f32>,
    #[shape(8, 128)] mut out: HbmMut<f32>,
    #[scratch(k)] sems: DmaSem,
    #[comptime] k: usize,
) {
    for i in 0..k {
        async_copy(&x, &mut out, sems.at(i as i32)).wait();
    }
}

/// [`many_semaphores`] with `k` semaphores, and its argument.
pub fn semaphores(k: usize) -> (KernelDef, Vec<ArgSpec>) {
    (many_semaphores(k), vec![ArgSpec::new(DType::F32, [8, 128])])
}

/// One illegal kernel: its name, definition, arguments, the marker of the line that breaks
/// the rule, a phrase of the fix the message must give, and the libtpu versions that compile
/// it all the same (the TPU rules hold what every libtpu tessera supports refuses: 0.0.42.1,
/// jax 0.10.2's, refuses each of these; 0.0.50.1 compiles three of them).
pub struct Illegal {
    pub name: &'static str,
    pub def: KernelDef,
    pub args: Vec<ArgSpec>,
    pub marker: &'static str,
    pub fix: &'static str,
    pub compiled_by: &'static [&'static str],
}

pub fn all() -> Vec<Illegal> {
    let f32s = |s: &[usize]| vec![ArgSpec::new(DType::F32, s.to_vec())];
    let i32s = |s: &[usize]| vec![ArgSpec::new(DType::I32, s.to_vec())];
    let i8s = |s: &[usize]| vec![ArgSpec::new(DType::I8, s.to_vec())];
    vec![
        Illegal {
            name: "bool_operand",
            def: bool_operand(),
            args: vec![ArgSpec::new(DType::Bool, [8, 128])],
            marker: "breaks: bool operand",
            fix: "pass it as i32",
            compiled_by: &[],
        },
        Illegal {
            name: "i8_arithmetic",
            def: i8_arithmetic(),
            args: i8s(&[32, 128]),
            marker: "breaks: i8 arithmetic",
            fix: "cast it to i32 after loading",
            compiled_by: &[],
        },
        Illegal {
            name: "i8_to_bool",
            def: i8_to_bool(),
            args: i8s(&[32, 128]),
            marker: "breaks: i8 cast",
            fix: "cast through i32",
            compiled_by: &["0.0.50.1"],
        },
        Illegal {
            name: "rank1_iota",
            def: rank1_iota(),
            args: i32s(&[8, 128]),
            marker: "breaks: rank-1 iota",
            fix: "use a shape like [1, 128]",
            compiled_by: &[],
        },
        Illegal {
            name: "reduce_to_scalar",
            def: reduce_to_scalar(),
            args: f32s(&[8, 128]),
            marker: "breaks: rank-1 reduction",
            fix: "reshape to [1, n] first",
            compiled_by: &["0.0.50.1"],
        },
        Illegal {
            name: "retiling_reshape",
            def: retiling_reshape(),
            args: f32s(&[8, 128]),
            marker: "breaks: reshape",
            fix: "the last two dims stay the same",
            compiled_by: &["0.0.50.1"],
        },
        Illegal {
            name: "integer_dot",
            def: integer_dot(),
            args: i32s(&[8, 128]),
            marker: "breaks: integer dot",
            fix: "cast the operands to bf16 or f32",
            compiled_by: &[],
        },
        Illegal {
            name: "bf16_scalar",
            def: bf16_scalar(),
            args: vec![ArgSpec::new(DType::BF16, [16, 128])],
            marker: "breaks: bf16 scalar",
            fix: "compute it in f32",
            compiled_by: &[],
        },
    ]
}

/// The line of this file holding `marker`.
pub fn marked_line(marker: &str) -> u32 {
    let text = include_str!("mod.rs");
    let at = text
        .lines()
        .position(|l| l.ends_with(&format!("// {marker}")))
        .unwrap_or_else(|| panic!("no line marked `{marker}`"));
    at as u32 + 1
}

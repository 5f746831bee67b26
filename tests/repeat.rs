//! `repeat` on every backend: the interpreter and the XLA CPU plugin against f64 references
//! (with the repeated value plain and, vectorised per head, batched), the lowered texts
//! (`tpu.concatenate` of the copies for Mosaic, as JAX lowers `pltpu.repeat`;
//! `broadcast_in_dim` and `reshape` for StableHLO) and the Mosaic text accepted by libtpu for
//! v5p, whole tiles or not. (The Mosaic text runs in `tests/mosaic_eval.rs`.)

mod common;
mod repeat_kernels;

use tessera::dsl::prelude::*;
use tessera::dsl::{ArgSpec, KernelRules, ProblemKind};

#[test]
fn repeat_on_interpret_and_cpu() {
    common::cases_on_every_backend(repeat_kernels::cases(), 1e-6);
}

#[test]
fn the_lowerings_concatenate_and_broadcast() {
    for (name, def, args, _) in repeat_kernels::cases() {
        let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
        let k = def.instantiate(&specs, &KernelRules::tpu()).unwrap();
        assert!(k.to_text().contains("repeat %"), "{name}:\n{}", k.to_text());
        let mosaic = tessera::dsl::mosaic::lower(&k).unwrap().text;
        let concat = match name {
            "repeat_lanes" => {
                " in 1 : vector<8x128xf32>, vector<8x128xf32>, vector<8x128xf32> \
                               -> vector<8x384xf32>"
            }
            "repeat_column" => ", vector<8x1xf32> -> vector<8x128xf32>",
            _ => " in 0 : vector<8x128xf32>, vector<8x128xf32> -> vector<16x128xf32>",
        };
        assert!(
            mosaic
                .lines()
                .any(|l| l.contains("tpu.concatenate") && l.contains(concat)),
            "{name}: no `tpu.concatenate ..{concat}` in\n{mosaic}"
        );
        let hlo = tessera::dsl::stablehlo::lower_module(&k).unwrap().to_mlir();
        assert!(
            hlo.contains("stablehlo.broadcast_in_dim") && hlo.contains("stablehlo.reshape"),
            "{name}:\n{hlo}"
        );
    }
}

#[test]
fn repeat_compiles_for_v5p() {
    common::cases_compile_for("tpu:v5p:2x2x1", repeat_kernels::cases());
}

/// Mistakes get one located sentence each: an axis out of range, and no copies.
#[test]
fn repeat_mistakes_are_named() {
    #[tpu_kernel(grid = (1,))]
    fn bad_repeat(
        #[shape(8, 128)]
        #[block((8, 128), |i| (i, 0))]
        x: Ref<f32>,
        #[shape(8, 128)]
        #[block((8, 128), |i| (i, 0))]
        out: RefMut<f32>,
        #[comptime] times: usize,
        #[comptime] axis: isize,
    ) {
        out.store(repeat(x.load(), times, axis));
    }
    let specs = [ArgSpec::new(DType::F32, [8, 128])];
    for (times, axis, says) in [
        (1, 2, "axis 2 is out of range for shape [8, 128]"),
        (0, 1, "needs at least one copy, got 0"),
    ] {
        let e = bad_repeat(times, axis)
            .instantiate(&specs, &KernelRules::portable())
            .expect_err("refused");
        assert_eq!(e.problems.len(), 1, "{e}");
        assert_eq!(e.problems[0].kind, ProblemKind::Trace, "{e}");
        assert!(e.to_string().contains(says), "{e}");
    }
}

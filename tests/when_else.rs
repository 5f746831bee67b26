//! `when_else` on every backend: the interpreter and the XLA CPU plugin against f64
//! references (with the condition a scalar and, vectorised, a batched value), and the Mosaic
//! lowering's `scf.if .. else` accepted by libtpu. (The Mosaic text runs in
//! `tests/mosaic_eval.rs`.)

mod common;
mod when_else_kernels;

use tessera::dsl::{ArgSpec, KernelRules};

#[test]
fn when_else_on_interpret_and_cpu() {
    common::cases_on_every_backend(when_else_kernels::cases(), 1e-4);
}

#[test]
fn the_lowerings_keep_the_else() {
    for (name, def, args, _) in when_else_kernels::cases() {
        let specs: Vec<ArgSpec> = args.iter().map(ArgSpec::of).collect();
        let k = def.instantiate(&specs, &KernelRules::tpu()).unwrap();
        assert!(k.to_text().contains("} else {"), "{name}:\n{}", k.to_text());
        let mosaic = tessera::dsl::mosaic::lower(&k).unwrap().text;
        assert!(mosaic.contains("} else {"), "{name}:\n{mosaic}");
        let hlo = tessera::dsl::stablehlo::lower_module(&k).unwrap().to_mlir();
        // A scalar condition is a `stablehlo.if`; a batched one selects per head.
        let conditional = hlo.contains("\"stablehlo.if\"");
        assert_eq!(
            conditional,
            name == "matmul_first_step_else",
            "{name}:\n{hlo}"
        );
    }
}

#[test]
fn when_else_compiles_for_tpu() {
    common::cases_compile_for("tpu:v5e:2x2", when_else_kernels::cases());
}

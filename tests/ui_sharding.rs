//! Compile-time sharding rules of tessera-collectives and of the typed splash ops of
//! tessera-parallel (`tessera_parallel::local_splash`): each `tests/ui/sharding/*.rs` must fail to
//! compile with exactly the checked-in `.stderr` (one sentence per broken rule, from
//! `#[diagnostic::on_unimplemented]`); each `tests/ui/sharding/pass/*.rs` must compile and run.
//! `tests/ui/sharding/common/` holds the configuration the `local_splash` cases share.
//!
//! Regenerate the expected output after an intended change with `TRYBUILD=overwrite`, then read
//! every changed `.stderr`: a message should say what the op needs and what the tensor has.

#[test]
fn ui_sharding() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/sharding/*.rs");
    t.pass("tests/ui/sharding/pass/*.rs");
}

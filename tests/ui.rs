//! Compile-time diagnostics of `#[tpu_kernel]`: each `tests/ui/kernel/*.rs` (and each
//! `tests/ui/memory/*.rs`, the copy and semaphore protocol, and each `tests/ui/operands/*.rs`,
//! the declarations of HBM operands, buffers, semaphores, meshes and preconditions) must fail
//! to compile with exactly the checked-in `.stderr`; each `tests/ui/kernel/pass/*.rs` must
//! compile and run.
//!
//! Regenerate the expected output after an intended change with `TRYBUILD=overwrite`, then read
//! every changed `.stderr`: a message should be a clear sentence on the smallest offending tokens.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/kernel/*.rs");
    t.compile_fail("tests/ui/memory/*.rs");
    t.compile_fail("tests/ui/operands/*.rs");
    t.pass("tests/ui/kernel/pass/*.rs");
}

//! tessera-runtime: PJRT C API binding (the only crate with `unsafe`).

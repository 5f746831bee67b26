//! Shared helpers of the runtime tests.
#![allow(dead_code)]

use tessera_runtime::Client;

/// The process-wide CPU client with `n` devices. The plugin comes from `TESSERA_PJRT_PLUGIN`,
/// or from the provisioned CPU plugin wheel (downloaded with pip on first use).
pub fn client(n: usize) -> Client {
    Client::cpu_shared(n).unwrap_or_else(|e| panic!("cannot create a {n}-device CPU client: {e}"))
}

/// Elements `0, 1, 2, ...` of `len`, as exactly representable values scaled by `scale`.
pub fn iota(len: usize, scale: f32) -> Vec<f32> {
    (0..len).map(|i| i as f32 * scale).collect()
}

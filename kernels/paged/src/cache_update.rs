//! An in-place update of a cache by row blocks (the write of new keys and values into a
//! serving stack's KV cache): `out` is `cache`'s buffer (`#[alias(cache)]`, Pallas'
//! `input_output_aliases`), so the blocks the grid does not visit keep the cache's values and
//! only the updated blocks move.

use tessera_dsl::prelude::*;
use tessera_dsl::{DType, HostArray};

/// Rows per block of [`cache_update`] for elements of `dtype`: one TPU tile of rows (8 of
/// 32-bit elements, 16 of bf16).
pub fn block_rows(dtype: DType) -> usize {
    32 / dtype.size_bytes()
}

/// `out = cache` with row block `slots[i]` (of [`block_rows`] rows) replaced by block `i` of
/// `new`: `slots` i32 `[N]` (scalar prefetch), `cache` `[R, C]` (left in HBM: the kernel
/// never reads it), `new` `[N * rows, C]`, `out` `[R, C]` aliasing `cache`. Grid step `i`
/// writes one block; every other block of `out` is the cache's, untouched.
#[tpu_kernel(
    grid = N,
    require(
        R % block_rows(T::DTYPE) == 0,
        "the cache has {R} rows, not whole blocks of {}; pad it to a multiple of {}",
        block_rows(T::DTYPE),
        block_rows(T::DTYPE)
    ),
    require(
        NEW_ROWS == N * block_rows(T::DTYPE),
        "`new` has {NEW_ROWS} rows but {N} slots take {} ({} rows each)",
        N * block_rows(T::DTYPE),
        block_rows(T::DTYPE)
    )
)]
pub fn cache_update<T: Element>(
    #[shape(N)] slots: Smem<i32>,
    #[shape(R, C)] cache: Hbm<T>,
    #[shape(NEW_ROWS, C)]
    #[block((block_rows(T::DTYPE), C), |i| (i, 0))]
    new: Ref<T>,
    #[shape(R, C)]
    #[block((block_rows(T::DTYPE), C), |i| (slots.get([i]), 0))]
    #[alias(cache)]
    out: RefMut<T>,
) {
    out.store(new.load());
}

/// The f64 reference of [`cache_update`].
pub fn cache_update_reference(slots: &[i32], cache: &HostArray, new: &HostArray) -> Vec<f64> {
    let c = cache.shape()[1];
    let mut out = cache.to_f64_vec();
    let new = new.to_f64_vec();
    let block = block_rows(cache.dtype()) * c;
    for (i, &s) in slots.iter().enumerate() {
        let at = s as usize * block;
        out[at..at + block].copy_from_slice(&new[i * block..(i + 1) * block]);
    }
    out
}

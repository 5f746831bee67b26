//! Kernels that move their own data: a double-buffered gather of tiles from an HBM operand,
//! a ring shift of a whole array to the next device of a mesh axis with remote copies, and an
//! all-gather over that ring.

use tessera_dsl::axes::Context;
use tessera_dsl::prelude::*;
use tessera_dsl::rules::tpu_tile;
use tessera_dsl::{mesh, DeviceAxis, HostArray, KernelDef};

/// Rows per tile of [`gather_tiles`] (f32).
pub const TILE_ROWS: usize = 8;

/// Rows per tile of [`gather_tiles_of`] in `dtype`: its TPU sublane tile, 8 rows of a 32-bit
/// type, 16 of bf16, 32 of an 8-bit one (the output's blocks are one tile).
pub fn tile_rows(dtype: DType) -> usize {
    tpu_tile(dtype).0
}

mesh!(
    /// The mesh of [`ring_shift`]: one `context` axis.
    pub RingMesh = [Context]
);

/// The mesh axes of [`ring_shift`] on `n` devices, for instantiation.
pub fn ring_mesh(n: usize) -> Vec<DeviceAxis> {
    vec![DeviceAxis::new("context", n)]
}

/// `out[r g .. r g + r] = x[r tiles[g] .. r tiles[g] + r]` with `r` rows per tile (8 for a
/// 32-bit `T`, 16 for bf16: [`tile_rows`]): the tiles of `x` (`[R, C]`, left in HBM) in the
/// order of `tiles` (i32 `[G]`, scalar prefetch). An 8-bit `T` is refused by the TPU rules
/// (the tile's reshape is a vector op Mosaic does not do on i8), bool too (Mosaic keeps no
/// `i1` arrays in memory). Step `g` starts the copy of the next step's tile into the other
/// half of a two-tile VMEM buffer, then waits its own (started by the step before, or by
/// itself at `g == 0`): each copy overlaps a step's work, as paged attention fetches its
/// pages. The copies are Pallas-style descriptors ([`make_async_copy`]), started in one grid
/// step and waited in the next.
#[tpu_kernel(grid = G, name = "gather_tiles")]
pub fn gather_tiles_of<T: Element>(
    #[shape(G)] tiles: Smem<i32>,
    #[shape(R, C)] x: Hbm<T>,
    #[shape(G * tile_rows(T::DTYPE), C)]
    #[block((tile_rows(T::DTYPE), C), |g| (g, 0))]
    out: RefMut<T>,
    #[scratch(2, tile_rows(T::DTYPE), C)] mut buf: Vmem<T>,
    #[scratch(2)] sems: DmaSem,
) {
    let rows = tile_rows(T::DTYPE);
    let g = program_id(0);
    // Step `i`'s tile into slot `i % 2` of the buffer, described once: started by the step
    // before it (or by itself at `g == 0`), waited by it.
    let fetch = |buf: &mut Vmem<T>, i: Value| {
        let slot = i % 2;
        let tile = [ds(tiles.get([i]) * rows as i32, rows), all()];
        make_async_copy(
            x.at(&tile),
            buf.at_mut(&[ds(slot, 1), all(), all()]),
            sems.at(slot),
        )
    };
    when(g.eq(0), || fetch(&mut buf, g).start());
    let next = g + 1;
    when(next.lt(num_programs(0)), || fetch(&mut buf, next).start());
    fetch(&mut buf, g).wait();
    let tile = buf.at(&[ds(g % 2, 1), all(), all()]).load();
    out.store(tile.reshape(&[rows, C]));
}

/// [`gather_tiles_of`] for f32 (tiles of [`TILE_ROWS`] rows).
pub fn gather_tiles() -> KernelDef {
    gather_tiles_of::<f32>()
}

/// The f64 reference of [`gather_tiles_of`] (tiles of [`tile_rows`] of `x`'s dtype).
pub fn gather_tiles_reference(tiles: &[i32], x: &HostArray) -> Vec<f64> {
    let (c, rows) = (x.shape()[1], tile_rows(x.dtype()));
    let xs = x.to_f64_vec();
    tiles
        .iter()
        .flat_map(|&t| {
            let start = t as usize * rows * c;
            xs[start..start + rows * c].to_vec()
        })
        .collect()
}

/// `out = x` of the previous device along the `context` axis of [`RingMesh`]: every device
/// copies its whole `x` (left in HBM; any element type `T`) into the `out` (HBM) of the next
/// one. The devices first meet at the barrier semaphore (each signals both neighbours and
/// waits for two signals), so no copy lands in a device that has not entered the kernel.
#[tpu_kernel(grid = 1, name = "ring_shift")]
pub fn ring_shift_of<T: Element>(
    #[shape(R, C)] x: Hbm<T>,
    #[shape(R, C)] mut out: HbmMut<T>,
    send: DmaSem,
    recv: DmaSem,
    devices: Devices<RingMesh>,
) {
    let barrier = devices.barrier();
    barrier.signal_to(1, devices.prev::<Context>());
    barrier.signal_to(1, devices.next::<Context>());
    barrier.wait(2);
    remote_copy(&x, &mut out, &send, &recv, devices.next::<Context>()).wait();
}

/// [`ring_shift_of`] for f32.
pub fn ring_shift() -> KernelDef {
    ring_shift_of::<f32>()
}

/// The reference of [`ring_shift_of`]: device `d` gets device `d - 1`'s array.
pub fn ring_shift_reference(per_device: &[HostArray]) -> Vec<HostArray> {
    let n = per_device.len();
    (0..n)
        .map(|d| per_device[(d + n - 1) % n].clone())
        .collect()
}

/// `out = concat(x of every device)` along dim 0, on every device of the `context` ring
/// (`x` `[S, C]` of any element type `T` and `out` `[N S, C]`, both in HBM): each device
/// copies its shard into its own slot of `out`, then for `N - 1` steps (a `fori_loop`)
/// forwards to the next device the slot it received last (its own at the first step), into
/// the same slot there. After meeting at the barrier, the copies of a step write slots no
/// device reads in that step.
#[tpu_kernel(grid = 1, name = "ring_all_gather")]
pub fn ring_all_gather_of<T: Element>(
    #[shape(S, C)] x: Hbm<T>,
    #[shape(devices.size::<Context>() * S, C)] mut out: HbmMut<T>,
    #[scratch(3)] sems: DmaSem,
    devices: Devices<RingMesh>,
) {
    let n = devices.size::<Context>() as i32;
    let me = devices.index::<Context>();
    let slot = |i: Value| [ds(i * S as i32, S), all()];
    async_copy(&x, out.at_mut(&slot(me)), sems.at(0)).wait();
    let barrier = devices.barrier();
    barrier.signal_to(1, devices.prev::<Context>());
    barrier.signal_to(1, devices.next::<Context>());
    barrier.wait(2);
    let next = devices.next::<Context>();
    fori_loop(0, n - 1, (), |step, ()| {
        let forwarded = (me - step + n) % n;
        let window = slot(forwarded);
        remote_copy_within(&mut out, &window, &window, sems.at(1), sems.at(2), next).wait();
    });
}

/// [`ring_all_gather_of`] for f32.
pub fn ring_all_gather() -> KernelDef {
    ring_all_gather_of::<f32>()
}

/// The reference of [`ring_all_gather_of`]: every device gets the shards in device order, in
/// their dtype.
pub fn ring_all_gather_reference(per_device: &[HostArray]) -> HostArray {
    let cols = per_device[0].shape()[1];
    let rows: usize = per_device.iter().map(|a| a.shape()[0]).sum();
    let data: Vec<f64> = per_device.iter().flat_map(|a| a.to_f64_vec()).collect();
    HostArray::from_f64(per_device[0].dtype(), [rows, cols], &data)
        .expect("the shards fill the array")
}

//! Kernels that move their own data: a double-buffered gather of tiles from an HBM operand,
//! a ring shift of a whole array to the next device of a mesh axis with remote copies, and an
//! all-gather over that ring.

use tessera_dsl::axes::Context;
use tessera_dsl::prelude::*;
use tessera_dsl::{mesh, DeviceAxis, HostArray};

/// Rows per tile of [`gather_tiles`].
pub const TILE_ROWS: usize = 8;

mesh!(
    /// The mesh of [`ring_shift`]: one `context` axis.
    pub RingMesh = [Context]
);

/// The mesh axes of [`ring_shift`] on `n` devices, for instantiation.
pub fn ring_mesh(n: usize) -> Vec<DeviceAxis> {
    vec![DeviceAxis::new("context", n)]
}

/// `out[8g .. 8g + 8] = x[8 tiles[g] .. 8 tiles[g] + 8]`: the tiles of `x` (f32 `[R, C]`,
/// left in HBM) in the order of `tiles` (i32 `[G]`, scalar prefetch). Step `g` starts the
/// copy of the next step's tile into the other half of a two-tile VMEM buffer, then waits
/// its own (started by the step before, or by itself at `g == 0`): each copy overlaps a
/// step's work, as paged attention fetches its pages. The copies are Pallas-style
/// descriptors ([`make_async_copy`]), started in one grid step and waited in the next.
#[tpu_kernel(grid = G)]
pub fn gather_tiles(
    #[shape(G)] tiles: Smem<i32>,
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(G * TILE_ROWS, C)]
    #[block((TILE_ROWS, C), |g| (g, 0))]
    out: RefMut<f32>,
    #[scratch(2, TILE_ROWS, C)] mut buf: Vmem<f32>,
    #[scratch(2)] sems: DmaSem,
) {
    let g = program_id(0);
    // Step `i`'s tile into slot `i % 2` of the buffer, described once: started by the step
    // before it (or by itself at `g == 0`), waited by it.
    let fetch = |buf: &mut Vmem<f32>, i: Value| {
        let slot = i % 2;
        let tile = [ds(tiles.get([i]) * TILE_ROWS as i32, TILE_ROWS), all()];
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
    let rows = buf.at(&[ds(g % 2, 1), all(), all()]).load();
    out.store(rows.reshape(&[TILE_ROWS, C]));
}

/// The f64 reference of [`gather_tiles`].
pub fn gather_tiles_reference(tiles: &[i32], x: &HostArray) -> Vec<f64> {
    let c = x.shape()[1];
    let xs = x.to_f64_vec();
    tiles
        .iter()
        .flat_map(|&t| {
            let start = t as usize * TILE_ROWS * c;
            xs[start..start + TILE_ROWS * c].to_vec()
        })
        .collect()
}

/// `out = x` of the previous device along the `context` axis of [`RingMesh`]: every device
/// copies its whole `x` (f32, left in HBM) into the `out` (HBM) of the next one. The devices
/// first meet at the barrier semaphore (each signals both neighbours and waits for two
/// signals), so no copy lands in a device that has not entered the kernel.
#[tpu_kernel(grid = 1)]
pub fn ring_shift(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] mut out: HbmMut<f32>,
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

/// The reference of [`ring_shift`]: device `d` gets device `d - 1`'s array.
pub fn ring_shift_reference(per_device: &[HostArray]) -> Vec<HostArray> {
    let n = per_device.len();
    (0..n)
        .map(|d| per_device[(d + n - 1) % n].clone())
        .collect()
}

/// `out = concat(x of every device)` along dim 0, on every device of the `context` ring
/// (`x` f32 `[S, C]` and `out` `[N S, C]`, both in HBM): each device copies its shard into
/// its own slot of `out`, then for `N - 1` steps (a `fori_loop`) forwards to the next device
/// the slot it received last (its own at the first step), into the same slot there. After
/// meeting at the barrier, the copies of a step write slots no device reads in that step.
#[tpu_kernel(grid = 1)]
pub fn ring_all_gather(
    #[shape(S, C)] x: Hbm<f32>,
    #[shape(devices.size::<Context>() * S, C)] mut out: HbmMut<f32>,
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

/// The reference of [`ring_all_gather`]: every device gets the shards in device order.
pub fn ring_all_gather_reference(per_device: &[HostArray]) -> HostArray {
    let cols = per_device[0].shape()[1];
    let rows: usize = per_device.iter().map(|a| a.shape()[0]).sum();
    let data: Vec<f32> = per_device.iter().flat_map(|a| a.to_f32_vec()).collect();
    HostArray::f32([rows, cols], data).expect("the shards fill the array")
}

// Every kind of operand a kernel that moves its own data declares: an input and an output
// left in HBM, a VMEM buffer, DMA and regular semaphores (one, and an array), the mesh, a
// precondition, and an output sized by the mesh. Run on 4 interpreted devices.
use tessera::dsl::axes::Context;
use tessera::dsl::interpret::{self, InterpretOptions};
use tessera::dsl::{mesh, DeviceAxis, HostArray};
use tessera::prelude::*;

mesh!(Ring = [Context]);

// Device `d` stages its `x` through VMEM into slot `d` of its own `out`, then sends it to
// slot `d` of the next device's `out`.
#[tpu_kernel(
    grid = 1,
    require(R % 8 == 0, "{R} rows are not whole tiles of 8; pad x to a multiple of 8")
)]
fn stage_and_send(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(devices.size::<Context>() * R, C)] mut out: HbmMut<f32>,
    #[scratch(R, C)] mut buf: Vmem<f32>,
    #[scratch(2)] local: DmaSem,
    send: DmaSem,
    recv: DmaSem,
    #[scratch(1)] flags: Sem,
    devices: Devices<Ring>,
) {
    let me = devices.index::<Context>();
    let slot = |d: Value| [ds(d * R as i32, R), all()];
    async_copy(&x, &mut buf, local.at(0)).wait();
    async_copy(&buf, out.at_mut(&slot(me)), local.at(1)).wait();
    flags.at(0).signal(1);
    flags.at(0).wait(1);
    let barrier = devices.barrier();
    barrier.signal_to(1, devices.prev::<Context>());
    barrier.signal_to(1, devices.next::<Context>());
    barrier.wait(2);
    let window = slot(me);
    remote_copy_within(&mut out, &window, &window, &send, &recv, devices.next::<Context>())
        .wait();
}

fn main() {
    let n = 4;
    let per_device: Vec<Vec<HostArray>> = (0..n)
        .map(|d| vec![HostArray::f32([8, 128], vec![d as f32; 8 * 128]).unwrap()])
        .collect();
    let mesh = [DeviceAxis::new("context", n)];
    let options = InterpretOptions::default();
    let outs = interpret::run_on_devices(&stage_and_send(), &mesh, &per_device, &options).unwrap();
    for (d, out) in outs.iter().enumerate() {
        let out = out[0].to_f32_vec();
        assert_eq!(out.len(), n * 8 * 128);
        // Its own slot, and the previous device's.
        let prev = (d + n - 1) % n;
        assert!(out[d * 1024..][..1024].iter().all(|&v| v == d as f32));
        assert!(out[prev * 1024..][..1024].iter().all(|&v| v == prev as f32));
    }
    // The precondition, with the author's sentence.
    let bad = vec![vec![HostArray::f32([4, 128], vec![0.0; 512]).unwrap()]; n];
    let e = interpret::run_on_devices(&stage_and_send(), &mesh, &bad, &options).unwrap_err();
    assert!(e.to_string().contains("4 rows are not whole tiles of 8"), "{e}");
}

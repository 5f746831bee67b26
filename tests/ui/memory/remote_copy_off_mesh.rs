//! A remote copy targets a position on an axis of the kernel's mesh; `Data` is not one.
use tessera::dsl::axes::{Context, Data};
use tessera::dsl::mesh;
use tessera::prelude::*;

mesh!(Ring = [Context]);

fn body(x: Hbm<f32>, mut out: HbmMut<f32>, send: DmaSem, recv: DmaSem, devices: Devices<Ring>) {
    remote_copy(&x, &mut out, &send, &recv, devices.next::<Data>()).wait();
}

fn main() {}

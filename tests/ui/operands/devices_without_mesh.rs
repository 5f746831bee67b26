//! `Devices` names the mesh the kernel runs on.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn shift(#[shape(R, C)] x: Hbm<f32>, #[shape(R, C)] out: HbmMut<f32>, devices: Devices) {
    let _ = (x, out, devices);
}

fn main() {}

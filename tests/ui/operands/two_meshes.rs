//! A kernel runs on one mesh.
use tessera::dsl::axes::Context;
use tessera::dsl::mesh;
use tessera::prelude::*;

mesh!(Ring = [Context]);

#[tpu_kernel(grid = 1)]
fn shift(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] out: HbmMut<f32>,
    devices: Devices<Ring>,
    again: Devices<Ring>,
) {
    let _ = (x, out, devices, again);
}

fn main() {}

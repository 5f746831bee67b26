//! The mesh's sizes come from the instantiation, not from an attribute.
use tessera::dsl::axes::Context;
use tessera::dsl::mesh;
use tessera::prelude::*;

mesh!(Ring = [Context]);

#[tpu_kernel(grid = 1)]
fn shift(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] out: HbmMut<f32>,
    #[shape(4)] devices: Devices<Ring>,
) {
    let _ = (x, out, devices);
}

fn main() {}

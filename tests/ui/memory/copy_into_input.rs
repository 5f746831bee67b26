//! Inputs are read-only: an HBM input cannot be a copy's destination.
use tessera::prelude::*;

fn body(mut x: Hbm<f32>, buf: Vmem<f32>, sem: DmaSem) {
    async_copy(&buf, &mut x, &sem).wait();
}

fn main() {}

//! A copy signals a DMA semaphore, not a regular one.
use tessera::prelude::*;

fn body(x: Hbm<f32>, mut buf: Vmem<f32>, sem: Sem) {
    async_copy(&x, &mut buf, &sem).wait();
}

fn main() {}

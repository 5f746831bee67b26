//! A copy moves elements as they are: its source and destination have one element type.
use tessera::prelude::*;

fn body(x: Hbm<f32>, mut buf: Vmem<bf16>, sem: DmaSem) {
    async_copy(&x, &mut buf, &sem).wait();
}

fn main() {}

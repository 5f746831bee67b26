//! A copy is waited once: `wait` consumes its token.
use tessera::prelude::*;

fn body(x: Hbm<f32>, mut buf: Vmem<f32>, sem: DmaSem) {
    let copy = async_copy(&x, &mut buf, &sem);
    copy.wait();
    copy.wait();
}

fn main() {}

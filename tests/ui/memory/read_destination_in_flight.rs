//! A copy in flight borrows its destination: reading it before the wait does not compile.
use tessera::prelude::*;

fn body(x: Hbm<f32>, mut buf: Vmem<f32>, sem: DmaSem) {
    let copy = async_copy(&x, &mut buf, &sem);
    let early = buf.load();
    copy.wait();
    let _ = early;
}

fn main() {}

//! A token kept unwaited keeps its destination borrowed until it is dropped: the read below
//! conflicts with that borrow (and the trace would report the missing wait).
use tessera::prelude::*;

fn body(x: Hbm<f32>, mut buf: Vmem<f32>, sem: DmaSem) {
    let _copy = async_copy(&x, &mut buf, &sem);
    let _v = buf.load();
}

fn main() {}

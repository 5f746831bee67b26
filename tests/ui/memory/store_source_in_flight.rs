//! A local copy in flight borrows its source: overwriting it before the wait does not
//! compile (the copy may still be reading it).
use tessera::prelude::*;

fn body(mut staging: Vmem<f32>, mut out: HbmMut<f32>, sem: DmaSem) {
    let copy = async_copy(&staging, &mut out, &sem);
    staging.store(1.0);
    copy.wait();
}

fn main() {}

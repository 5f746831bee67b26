//! A copy in flight borrows its destination exclusively: writing it before the wait does
//! not compile.
use tessera::prelude::*;

fn body(x: Hbm<f32>, mut buf: Vmem<f32>, sems: DmaSem) {
    let copy = async_copy(x.at(&[ds(0usize, 8), all()]), buf.at_mut(&[ds(0usize, 8), all()]), sems.at(0));
    buf.store(0.0);
    copy.wait();
}

fn main() {}

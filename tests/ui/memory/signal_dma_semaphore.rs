//! DMA semaphores are signalled by copies only; `signal` is for regular semaphores (`Sem`).
use tessera::prelude::*;

fn body(sems: DmaSem) {
    sems.signal(1);
}

fn main() {}

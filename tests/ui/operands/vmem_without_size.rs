//! A VMEM buffer is sized by `#[scratch(..)]`.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn copy(#[shape(R, C)] x: Hbm<f32>, #[shape(R, C)] out: HbmMut<f32>, buf: Vmem<f32>, sem: DmaSem) {
    let _ = (x, out, buf, sem);
}

fn main() {}

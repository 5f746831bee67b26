//! `#[shape]` is for arguments and outputs; a buffer the kernel allocates has a size.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn copy(
    #[shape(R, C)] x: Hbm<f32>,
    #[shape(R, C)] out: HbmMut<f32>,
    #[shape(R, C)] buf: Vmem<f32>,
    sem: DmaSem,
) {
    let _ = (x, out, buf, sem);
}

fn main() {}

//! Only inputs, scalar prefetch and outputs may be left out by a caller: a kernel's own VMEM
//! buffer may not.
use tessera::prelude::*;

#[tpu_kernel(grid = 1)]
fn copy(
    #[shape(8, 128)] x: Hbm<f32>,
    #[shape(8, 128)] out: HbmMut<f32>,
    #[scratch(8, 128)] buf: Option<Vmem<f32>>,
) {
    let _ = (x, out, buf);
}

fn main() {}

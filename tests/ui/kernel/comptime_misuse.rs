use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn scale(
    #[shape(8, 128)] x: Ref<f32>,
    #[shape(8, 128)] out: RefMut<f32>,
    #[comptime]
    #[shape(1)]
    factor: u32,
) {
    out.store(x.load() * factor as f32);
}

fn main() {}

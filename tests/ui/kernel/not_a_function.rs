use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
struct Copy {
    rows: usize,
}

fn main() {
    let _ = Copy { rows: 8 };
}

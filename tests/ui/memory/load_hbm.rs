//! An operand left in HBM cannot be loaded; copy a window of it into VMEM first.
use tessera::prelude::*;

fn body(x: Hbm<f32>) -> Value {
    x.load()
}

fn main() {}

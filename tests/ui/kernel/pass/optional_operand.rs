// An `Option<Ref<T>>` operand may be left out (`KernelDef::without`): the caller passes no
// array for it and the body gets `None`.
use tessera::dsl::interpret::{run, InterpretOptions};
use tessera::dsl::HostArray;
use tessera::prelude::*;

#[tpu_kernel(grid = (R / 8,), dimension_semantics = (parallel,))]
fn add_bias(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(1, 128)] bias: Option<Ref<f32>>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
) {
    match bias {
        Some(b) => out.store(x.load() + b.load()),
        None => out.store(x.load()),
    }
}

fn main() {
    let x = HostArray::f32([16, 128], vec![1.0; 16 * 128]).unwrap();
    let b = HostArray::f32([1, 128], vec![2.0; 128]).unwrap();
    let opts = InterpretOptions::default();
    let with = run(&add_bias(), &[x.clone(), b], &opts).unwrap();
    assert_eq!(with[0].to_f32_vec(), vec![3.0; 16 * 128]);
    let def = add_bias().without("bias").unwrap();
    assert_eq!(def.args().len(), 1);
    let without = run(&def, &[x], &opts).unwrap();
    assert_eq!(without[0].to_f32_vec(), vec![1.0; 16 * 128]);
    let e = add_bias().without("x").unwrap_err().to_string();
    assert!(e.contains("`x` is required"), "{e}");
}

// `#[comptime]` parameters specialise the kernel: a Rust `if` picks code, a Rust `for` unrolls.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn power(
    #[shape(8, 128)] x: Ref<f32>,
    #[shape(8, 128)] out: RefMut<f32>,
    #[comptime] exponent: usize,
    #[comptime] negate: bool,
) {
    let v = x.load();
    let mut acc = v;
    for _ in 1..exponent {
        acc = acc * v;
    }
    if negate {
        acc = -acc;
    }
    out.store(acc);
}

fn main() {
    let args = [ArgSpec::new(DType::F32, [8, 128])];
    let cube = power(3, false)
        .instantiate(&args, &KernelRules::tpu())
        .unwrap();
    let square = power(2, true)
        .instantiate(&args, &KernelRules::tpu())
        .unwrap();
    let muls = |k: &tessera::dsl::Kernel| k.to_text().matches("= mul ").count();
    assert_eq!(muls(&cube), 2);
    assert_eq!(muls(&square), 1);
    assert!(square.to_text().contains("= neg "));
    assert!(!cube.to_text().contains("= neg "));
}

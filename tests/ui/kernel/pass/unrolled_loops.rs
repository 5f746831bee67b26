// `for` loops over Rust integer ranges unroll while the body is traced; bounds written as bare
// literals take their type from the body (here `usize`, from `ds`), inclusive ranges too.
use tessera::dsl::{ArgSpec, DType, KernelRules};
use tessera::prelude::*;

#[tpu_kernel(grid = (1,))]
fn sum_rows(#[shape(32, 128)] x: Ref<f32>, #[shape(8, 128)] out: RefMut<f32>) {
    let mut acc = x.at(&[ds(0, 8), all()]).load();
    for j in 1..4 {
        acc = acc + x.at(&[ds(j * 8, 8), all()]).load();
    }
    for _ in 0..=1 {
        acc = acc * 2.0;
    }
    out.store(acc);
}

fn main() {
    let kernel = sum_rows()
        .instantiate(&[ArgSpec::new(DType::F32, [32, 128])], &KernelRules::tpu())
        .unwrap();
    let text = kernel.to_text();
    assert_eq!(text.matches("= add ").count(), 3, "{text}");
    assert_eq!(text.matches("= mul ").count(), 2, "{text}");
}

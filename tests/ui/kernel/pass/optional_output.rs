// An `Option<RefMut<T>>` output may be left out (`KernelDef::without`), as a Pallas kernel
// whose out spec is `None`: the kernel produces the other outputs and the body gets `None`.
use tessera::dsl::interpret::{run, InterpretOptions};
use tessera::dsl::HostArray;
use tessera::prelude::*;

#[tpu_kernel(grid = (R / 8,), dimension_semantics = (parallel,))]
fn scaled_with_sum(
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    x: Ref<f32>,
    #[shape(R, 128)]
    #[block((8, 128), |i| (i, 0))]
    out: RefMut<f32>,
    #[shape(R, 1)]
    #[block((8, 1), |i| (i, 0))]
    row_sums: Option<RefMut<f32>>,
) {
    let v = x.load();
    out.store(v * 2.0);
    if let Some(sums) = row_sums {
        sums.store(v.sum_keepdims(-1));
    }
}

fn main() {
    let x = HostArray::f32([16, 128], (0..16 * 128).map(|i| (i % 7) as f32).collect()).unwrap();
    let opts = InterpretOptions::default();
    let both = run(&scaled_with_sum(), &[x.clone()], &opts).unwrap();
    assert_eq!(both.len(), 2);
    let row0: f32 = (0..128).map(|i| (i % 7) as f32).sum();
    assert_eq!(both[1].shape(), &[16, 1]);
    assert_eq!(both[1].to_f32_vec()[0], row0);
    let def = scaled_with_sum().without("row_sums").unwrap();
    assert_eq!(def.absent(), ["row_sums"]);
    let one = run(&def, &[x], &opts).unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].to_f32_vec(), both[0].to_f32_vec());
    let e = scaled_with_sum().without("out").unwrap_err().to_string();
    assert!(e.contains("no argument or optional output `out`"), "{e}");
    assert!(e.contains("its optional outputs: row_sums"), "{e}");
    let e = def.without("row_sums").unwrap_err().to_string();
    assert!(e.contains("`row_sums` is already left out"), "{e}");
}

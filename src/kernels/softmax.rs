//! Row softmax over blocks of whole rows.

use tessera_dsl::prelude::*;

/// `out[r, :] = softmax(x[r, :])`, `BR` rows per grid step, computed in f32.
#[tpu_kernel(grid = (R / BR,), dimension_semantics = (parallel,))]
pub fn row_softmax<T: Element, const BR: usize>(
    #[shape(R, C)]
    #[block((BR, C), |i| (i, 0))]
    x: Ref<T>,
    #[shape(R, C)]
    #[block((BR, C), |i| (i, 0))]
    out: RefMut<T>,
) {
    let v = x.load().cast(DType::F32);
    let e = (v - v.max_keepdims(-1)).exp();
    out.store((e / e.sum_keepdims(-1)).cast(T::DTYPE));
}

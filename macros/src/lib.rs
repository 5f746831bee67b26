//! tessera-macros: the `#[tpu_kernel]` attribute.
//!
//! Three passes, as serde does it: [`parse`] turns the attribute and signature into typed
//! structs, [`validate`] checks them and collects every error (each spanned on the smallest
//! offending tokens), [`expand`] generates the instantiation function. On error the output is
//! the `compile_error!`s plus a stub with the kernel's signature, so one mistake gives one
//! message and no cascade of "cannot find function".

mod expand;
mod parse;
mod validate;

use proc_macro::TokenStream;

/// Declares a block-tiled kernel; see `tessera_dsl` for the authoring model.
///
/// ```ignore
/// #[tpu_kernel(grid = (M / BM, N / BN, K / BK),
///              dimension_semantics = (parallel, parallel, arbitrary))]
/// fn matmul<const BM: usize, const BN: usize, const BK: usize>(
///     #[shape(M, K), block(BM, BK), index = |i, j, kk| (i, kk)] x: Ref<f32>,
///     #[shape(K, N), block(BK, BN), index = |i, j, kk| (kk, j)] y: Ref<f32>,
///     #[shape(M, N), block(BM, BN), index = |i, j, kk| (i, j)] out: RefMut<f32>,
///     #[scratch(BM, BN)] acc: Scratch<f32>,
/// ) { ... }
/// ```
#[proc_macro_attribute]
pub fn tpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr = proc_macro2::TokenStream::from(attr);
    let func = match syn::parse::<syn::ItemFn>(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    let (kernel, mut errors) = parse::parse(attr, &func);
    if let Err(e) = validate::validate(&kernel) {
        match &mut errors {
            Some(all) => all.combine(e),
            None => errors = Some(e),
        }
    }
    match errors {
        None => expand::expand(&kernel).into(),
        Some(e) => {
            let stub = expand::stub(&kernel);
            let e = e.to_compile_error();
            quote::quote!(#e #stub).into()
        }
    }
}

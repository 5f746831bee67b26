//! tessera-macros: the `#[tpu_kernel]` attribute.
//!
//! Three passes, as serde does it: `parse` turns the attribute and signature into typed
//! structs, `validate` checks them and collects every error (each spanned on the smallest
//! offending tokens), `expand` generates the instantiation function. On error the output is
//! the `compile_error!`s plus a stub with the kernel's signature, so one mistake gives one
//! message and no cascade of "cannot find function" at the kernel's call sites.

mod expand;
mod parse;
mod validate;

use proc_macro::TokenStream;
use quote::ToTokens;

/// Declares a block-tiled kernel; see `tessera_dsl` for the authoring model.
///
/// ```ignore
/// #[tpu_kernel(grid = (M / BM, N / BN, K / BK),
///              dimension_semantics = (parallel, parallel, arbitrary))]
/// pub fn matmul<T: Element, const BM: usize, const BN: usize, const BK: usize>(
///     #[shape(M, K)] #[block((BM, BK), |i, j, kk| (i, kk))] x: Ref<T>,
///     #[shape(K, N)] #[block((BK, BN), |i, j, kk| (kk, j))] y: Ref<T>,
///     #[shape(M, N)] #[block((BM, BN), |i, j, kk| (i, j))] out: RefMut<f32>,
///     #[scratch(BM, BN)] acc: Scratch<f32>,
/// ) { ... }
/// ```
///
/// Options: `grid = (..)` (required; `grid = N / B` for rank 1), `dimension_semantics = (..)`
/// (`parallel` or `arbitrary` per grid dim; all `arbitrary` when omitted), `name = ".."`,
/// and any number of `require(cond, "message {SIZE}", args..)`: preconditions on the sizes,
/// checked at instantiation before anything is computed from them, refusing the arguments
/// with the author's sentence.
///
/// Parameters, each a kind Pallas declares:
/// - arguments, in signature order, each with `#[shape(..)]`: `Ref<T>` inputs the grid
///   pipelines (optionally `#[block((..), |grid idx| (block idx))]`, and `, buffers = 1` in
///   it for one VMEM buffer instead of two, Pallas' `pl.Buffered(1)`), `Hbm<T>` inputs left in
///   HBM (`memory_space=ANY`: the kernel copies windows itself), `Smem<T>` scalar prefetch
///   (declared before any index map that reads it);
/// - outputs, with `#[shape(..)]` computed from known sizes: `RefMut<T>` (pipelined, with an
///   optional `#[block]`) and `HbmMut<T>` (left in HBM, written by copies);
/// - scratch, sized by `#[scratch(..)]`: `Scratch<T>` and `Vmem<T>` VMEM buffers, and
///   `DmaSem` / `Sem` semaphores (one without `#[scratch]`, an array with it);
/// - `Devices<M>`: the mesh `M` the kernel runs on (this device's `index::<Axis>()`, the
///   axis `size::<Axis>()`, neighbours, the barrier semaphore); output and scratch shapes and
///   preconditions may use its sizes (`#[shape(devices.size::<Context>() * S, C)]`);
/// - `#[comptime] name: Ty` compile-time arguments.
///
/// `#[alias(x)]` on an output makes it input `x`'s buffer (Pallas' `input_output_aliases`):
/// what the kernel does not store keeps `x`'s values.
///
/// `Option<Ref<T>>` and `Option<Smem<T>>` are operands a caller may leave out
/// (`KernelDef::without`). A name that `#[shape]` binds is a `usize` in the grid, the block
/// specs, the preconditions and the body.
#[proc_macro_attribute]
pub fn tpu_kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let func = match syn::parse::<syn::Item>(item) {
        Ok(syn::Item::Fn(f)) => f,
        Ok(other) => {
            // Keep the item so its uses do not cascade into more errors.
            let e = syn::Error::new_spanned(
                item_head(&other),
                "`#[tpu_kernel]` applies to a function: `fn name(..) { .. }`",
            );
            let e = e.to_compile_error();
            return quote::quote!(#e #other).into();
        }
        Err(e) => return e.to_compile_error().into(),
    };
    let (kernel, mut errors) = parse::parse(attr.into(), &func);
    validate::validate(&kernel, &mut errors);
    match errors.into_result() {
        Ok(()) => expand::expand(&kernel).into(),
        Err(e) => {
            let e = e.to_compile_error();
            let stub = expand::stub(&kernel);
            quote::quote!(#e #stub).into()
        }
    }
}

/// The tokens that name an item (`struct Foo`), for spanning "not a function" on them.
fn item_head(item: &syn::Item) -> proc_macro2::TokenStream {
    use syn::Item;
    let (keyword, name): (&dyn ToTokens, &syn::Ident) = match item {
        Item::Struct(i) => (&i.struct_token, &i.ident),
        Item::Enum(i) => (&i.enum_token, &i.ident),
        Item::Const(i) => (&i.const_token, &i.ident),
        Item::Static(i) => (&i.static_token, &i.ident),
        Item::Mod(i) => (&i.mod_token, &i.ident),
        Item::Trait(i) => (&i.trait_token, &i.ident),
        Item::Type(i) => (&i.type_token, &i.ident),
        other => return other.to_token_stream(),
    };
    quote::quote!(#keyword #name)
}

/// `msg` followed by a `help:` line, indented as rustc indents its own.
pub(crate) fn with_help(msg: impl std::fmt::Display, help: impl std::fmt::Display) -> String {
    format!("{msg}\n\n= help: {help}")
}

/// Errors collected across passes, combined into one `syn::Error` (one `compile_error!` each).
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }

    /// An error spanning all of `tokens` (first to last token, also on stable).
    pub fn spanned(&mut self, tokens: impl ToTokens, msg: impl std::fmt::Display) {
        self.push(syn::Error::new_spanned(tokens, msg));
    }

    /// An error spanning `tokens` with the fix on a `help:` line of its own, as rustc shows
    /// one (a proc-macro on stable has only the message, so the line is part of it).
    pub fn spanned_help(
        &mut self,
        tokens: impl ToTokens,
        msg: impl std::fmt::Display,
        help: impl std::fmt::Display,
    ) {
        self.spanned(tokens, with_help(msg, help));
    }

    pub fn at(&mut self, span: proc_macro2::Span, msg: impl std::fmt::Display) {
        self.push(syn::Error::new(span, msg));
    }

    pub fn into_result(self) -> Result<(), syn::Error> {
        self.0.map_or(Ok(()), Err)
    }

    #[cfg(test)]
    pub fn messages(&self) -> Vec<String> {
        self.0
            .iter()
            .flat_map(|e| e.clone().into_iter().map(|e| e.to_string()))
            .collect()
    }
}

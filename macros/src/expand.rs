//! Code generation: the kernel becomes a function returning a `KernelDef` whose build closure
//! binds argument shapes, computes the grid, declares the operands (tracing index maps) and
//! runs the body once on tracer handles.
//!
//! Hygiene: every name the generated code introduces for itself has a `Span::mixed_site()`
//! span, so it can neither capture nor shadow the user's names; the names the user's tokens
//! must see (shape symbols, parameters) keep the user's spans. Code that type-checks a user
//! expression is spanned on that expression, so its errors point there.

use std::collections::HashSet;

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{format_ident, quote, quote_spanned, ToTokens};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Expr, GenericParam, Ident, RangeLimits};

use crate::parse::{BlockDim, Kernel, Param, Role};
use crate::validate;

/// The path of tessera-dsl as the user's crate names it.
fn dsl_path() -> TokenStream {
    use proc_macro_crate::{crate_name, FoundCrate};
    match crate_name("tessera-dsl") {
        // Inside tessera-dsl itself (and its tests) `extern crate self as tessera_dsl` holds.
        Ok(FoundCrate::Itself) => quote!(::tessera_dsl),
        Ok(FoundCrate::Name(n)) => {
            let n = Ident::new(&n, Span::call_site());
            quote!(::#n)
        }
        Err(_) => match crate_name("tessera") {
            Ok(FoundCrate::Name(n)) => {
                let n = Ident::new(&n, Span::call_site());
                quote!(::#n::dsl)
            }
            _ => quote!(::tessera::dsl),
        },
    }
}

/// A name only the generated code can see.
fn private(name: &str) -> Ident {
    Ident::new(name, Span::mixed_site())
}

/// A private per-parameter name: `__shape_x`.
fn private_of(prefix: &str, param: &Ident) -> Ident {
    format_ident!("__{}_{}", prefix, param, span = Span::mixed_site())
}

/// The name of a parameter in the IR and in messages (`x`, also for `r#x`).
fn ir_name(param: &Ident) -> String {
    param.unraw().to_string()
}

/// A stub with the kernel's signature, emitted beside errors so uses of the kernel elsewhere
/// do not add "cannot find function" errors.
pub fn stub(k: &Kernel) -> TokenStream {
    let dsl = dsl_path();
    let f = &k.func;
    let (attrs, vis, ident, generics) = (&f.attrs, &f.vis, &f.sig.ident, &f.sig.generics);
    let where_clause = &generics.where_clause;
    let (names, tys): (Vec<_>, Vec<_>) = comptime(k).map(|p| (&p.ident, &p.ty)).unzip();
    quote! {
        #(#attrs)*
        #[allow(dead_code, unused_variables, clippy::too_many_arguments)]
        #vis fn #ident #generics (#(#names: #tys),*) -> #dsl::__private::KernelDef #where_clause {
            ::core::unimplemented!("`#[tpu_kernel]` rejected this kernel")
        }
    }
}

fn comptime(k: &Kernel) -> impl Iterator<Item = &Param> {
    k.params.iter().filter(|p| p.role == Some(Role::Comptime))
}

/// The kernel author's source position of `span`, as the IR records it.
fn loc(api: &TokenStream, span: Span) -> TokenStream {
    quote_spanned! {span=>
        #api::Loc { file: ::core::file!(), line: ::core::line!(), column: ::core::column!() }
    }
}

/// `e` as a `usize` through `tessera_dsl::KernelSize` (whose message names the mistake of a
/// run-time `Value`), its errors spanned on `e` (no `as` cast: no
/// `clippy::unnecessary_cast` in the user's crate, and no silent truncation).
fn size(dsl: &TokenStream, e: &Expr) -> TokenStream {
    call_on(
        e,
        quote!(#dsl::KernelSize::kernel_size),
        e.to_token_stream(),
    )
}

/// The body with the bounds of its `for` loops over ranges passed through
/// `tessera_dsl::LoopBounds` (`for i in a..b` becomes `for i in LoopBounds::range((a, b))`,
/// the same range), so that a run-time `Value` bound is named as such rather than reported as
/// two mismatched types. Nested items are left alone: they are not part of the body.
fn with_loop_bounds(dsl: &TokenStream, body: &syn::Block) -> syn::Block {
    struct Loops<'a> {
        dsl: &'a TokenStream,
    }

    impl VisitMut for Loops<'_> {
        fn visit_expr_for_loop_mut(&mut self, l: &mut syn::ExprForLoop) {
            visit_mut::visit_expr_for_loop_mut(self, l);
            let mut e = &*l.expr;
            while let Expr::Paren(p) = e {
                e = &p.expr;
            }
            let Expr::Range(r) = e else {
                return;
            };
            let (Some(start), Some(end)) = (&r.start, &r.end) else {
                return;
            };
            let (method, dots) = match r.limits {
                RangeLimits::HalfOpen(t) => (quote!(range), t.spans[0]),
                RangeLimits::Closed(t) => (quote!(range_inclusive), t.spans[0]),
            };
            // Shown at the `..`: its errors are about both bounds.
            let dsl = self.dsl;
            let mut bounds = Group::new(Delimiter::Parenthesis, quote!(#start, #end));
            bounds.set_span(dots);
            let mut args = Group::new(Delimiter::Parenthesis, bounds.into_token_stream());
            args.set_span(dots);
            let path = respan_all(quote!(#dsl::LoopBounds::#method), dots);
            *l.expr = Expr::Verbatim(quote!(#path #args));
        }

        fn visit_item_mut(&mut self, _: &mut syn::Item) {}
    }

    let mut body = body.clone();
    Loops { dsl }.visit_block_mut(&mut body);
    body
}

/// The call `path(args)` shown exactly where the user's tokens `at` are (the callee from the
/// first to the last of them), so that rustc's labels about the call ("required by a bound
/// introduced by this call") land on the user's tokens and nowhere else.
fn call_on(at: &impl ToTokens, path: TokenStream, args: TokenStream) -> TokenStream {
    let mut tokens = at.to_token_stream().into_iter();
    let first = tokens.next().map_or_else(Span::call_site, |t| t.span());
    let last = tokens.last().map_or(first, |t| t.span());
    let mut path: Vec<TokenTree> = respan_all(path, first).into_iter().collect();
    if let Some(callee) = path.last_mut() {
        *callee = respan(callee.clone(), last);
    }
    let mut args = Group::new(Delimiter::Parenthesis, args);
    args.set_span(last);
    quote!(#(#path)* #args)
}

/// `tokens` shown at `span`; identifiers keep their hygiene.
fn respan_all(tokens: TokenStream, span: Span) -> TokenStream {
    tokens.into_iter().map(|t| respan(t, span)).collect()
}

/// `token` shown at `span`; identifiers keep their hygiene.
fn respan(mut token: TokenTree, span: Span) -> TokenTree {
    match &mut token {
        TokenTree::Ident(i) => i.set_span(i.span().located_at(span)),
        TokenTree::Group(g) => {
            let mut new = Group::new(g.delimiter(), respan_all(g.stream(), span));
            new.set_span(span);
            *g = new;
        }
        other => other.set_span(span),
    }
    token
}

pub fn expand(k: &Kernel) -> TokenStream {
    let dsl = dsl_path();
    let api = quote!(#dsl::__private);
    let b = private("__b");
    let f = &k.func;
    let (attrs, vis, ident) = (&f.attrs, &f.vis, &f.sig.ident);
    let body = with_loop_bounds(&dsl, &f.block);
    let generics = &f.sig.generics;
    let (_, ty_generics, where_clause) = generics.split_for_impl();
    let turbofish = ty_generics.as_turbofish();
    let kernel_name = k
        .name
        .as_ref()
        .map_or_else(|| ir_name(ident), |s| s.value());
    let kernel_loc = loc(&api, ident.span());

    // Compile-time parameters, shown in the IR and keyed in the kernel cache.
    let mut params = Vec::new();
    for g in &generics.params {
        match g {
            GenericParam::Const(c) => {
                let (n, s) = (&c.ident, ir_name(&c.ident));
                params.push(quote!(#api::Param::new(#s, #n)));
            }
            GenericParam::Type(t) => {
                let (n, s) = (&t.ident, ir_name(&t.ident));
                params.push(quote!(#api::Param::new(#s, #api::__type_param_name::<#n>())));
            }
            GenericParam::Lifetime(_) => {}
        }
    }
    let mut stmts = Vec::new();
    for c in comptime(k) {
        let (n, ty, s) = (&c.ident, &c.ty, ir_name(&c.ident));
        params.push(call_on(n, quote!(#api::Param::comptime), quote!(#s, &#n)));
        // The build closure runs once per instantiation: each run gets its own copy.
        stmts.push(quote! {
            #[allow(non_snake_case)]
            let #n: #ty = ::core::clone::Clone::clone(&#n);
        });
    }

    // Arguments (scalar prefetch and inputs), in order: take their shapes, bind or check dims.
    let mut bound: HashSet<Ident> = comptime(k).map(|c| c.ident.clone()).collect();
    bound.extend(generics.const_params().map(|c| c.ident.clone()));
    let handles: Vec<&Param> = k
        .params
        .iter()
        .filter(|p| p.role != Some(Role::Comptime))
        .collect();
    let mut arg_decls = Vec::new();
    // The names `#[shape]` binds, in order: the body sees them too, as `usize`s.
    let mut shape_symbols: Vec<Ident> = Vec::new();
    for h in &handles {
        let role = h.role.expect("validated");
        if !role.is_argument() {
            continue;
        }
        let name = ir_name(&h.ident);
        let elem = h.elem.as_ref().expect("validated");
        let dims = &h.shape.as_ref().expect("validated").items;
        let rank = dims.len();
        let shape = private_of("shape", &h.ident);
        let role_tok = if role == Role::Prefetch {
            quote!(ScalarPrefetch)
        } else {
            quote!(Input)
        };
        let dtype = quote_spanned!(elem.span()=> <#elem as #api::Element>::DTYPE);
        let optional = h.optional;
        arg_decls.push(quote! {
            #api::ArgDecl {
                name: #name,
                role: #api::OperandRole::#role_tok,
                dtype: #dtype,
                rank: #rank,
                optional: #optional,
            }
        });
        if optional {
            // Present or not; its dims only check sizes known without it (validated).
            let checks = dims.iter().enumerate().map(|(d, e)| {
                let text = crate::parse::tokens_text(e);
                let expected = size(&dsl, e);
                quote! { #b.__dim_eq(#name, #d, #shape[#d], #text, #expected)?; }
            });
            stmts.push(quote! {
                let #shape: ::core::option::Option<::std::vec::Vec<usize>> =
                    #b.__optional_arg(#name, #dtype, #rank)?;
                if let ::core::option::Option::Some(#shape) = &#shape {
                    #(#checks)*
                }
            });
            continue;
        }
        stmts.push(quote! { let #shape = #b.__arg(#name, #dtype, #rank)?; });
        for (d, e) in dims.iter().enumerate() {
            match e {
                // A new name binds the dim; the names of later arguments' dims check it.
                Expr::Path(path) if path.path.get_ident().is_some_and(|i| !bound.contains(i)) => {
                    let sym = path.path.get_ident().expect("matched");
                    bound.insert(sym.clone());
                    shape_symbols.push(sym.clone());
                    // Naming a dim only to document it is fine: no unused warning.
                    stmts.push(quote! {
                        #[allow(non_snake_case, unused_variables)]
                        let #sym: usize = #shape[#d];
                    });
                }
                _ => {
                    let text = crate::parse::tokens_text(e);
                    let expected = size(&dsl, e);
                    stmts.push(quote! { #b.__dim_eq(#name, #d, #shape[#d], #text, #expected)?; });
                }
            }
        }
    }

    // The mesh, bound early under the parameter's own name: output and scratch shapes and
    // preconditions may use its sizes (`devices.size::<Context>()`).
    for h in handles.iter().filter(|h| h.role == Some(Role::Devices)) {
        let (hid, ty) = (&h.ident, &h.ty);
        let mesh = h.elem.as_ref().expect("validated");
        let call = call_on(mesh, quote!(#b.__devices::<#mesh>), quote!());
        stmts.push(quote! {
            #[allow(non_snake_case)]
            let #hid: #ty = #call?;
        });
    }

    // Preconditions, with every size known, before anything is computed from them.
    for r in &k.requires {
        let (cond, message, args) = (&r.cond, &r.message, &r.args);
        let subject = format!("`{}`", crate::parse::tokens_text(cond));
        // A condition that is not a `bool` is reported on the condition.
        let ok = call_on(
            cond,
            quote!(#dsl::Precondition::holds),
            cond.to_token_stream(),
        );
        stmts.push(quote! {
            #b.__require(#ok, #subject, ::std::format!(#message #(, #args)*))?;
        });
    }

    // Output and scratch shapes, blocks, grid.
    for h in &handles {
        let role = h.role.expect("validated");
        let shape = private_of("shape", &h.ident);
        let dims = if role.is_output() {
            Some(&h.shape.as_ref().expect("validated").items[..])
        } else if role.is_scratch() {
            // One semaphore when an array size is not given.
            Some(h.scratch.as_ref().map_or(&[][..], |s| &s.items[..]))
        } else {
            None
        };
        if let Some(dims) = dims {
            let dims = dims.iter().map(|e| size(&dsl, e));
            stmts.push(quote! { let #shape: ::std::vec::Vec<usize> = ::std::vec![#(#dims),*]; });
        }
        // An optional output: its shape when the definition keeps it, else `None`.
        if role.is_output() && h.optional {
            let name = ir_name(&h.ident);
            stmts.push(quote! {
                let #shape: ::core::option::Option<::std::vec::Vec<usize>> =
                    #b.__output_present(#name).then_some(#shape);
            });
        }
        // An optional operand's block is computed where it is declared, if it is present.
        if role.is_blocked() && !h.optional {
            stmts.push(block_stmts(&dsl, &b, h));
        }
    }
    let grid = &k.grid.as_ref().expect("validated").items;
    let grid_rank = grid.len();
    let semantics: Vec<TokenStream> = match &k.semantics {
        Some(s) => s
            .items
            .iter()
            .map(|d| match d {
                Expr::Path(path) if path.path.is_ident("parallel") => quote!(Parallel),
                _ => quote!(Arbitrary),
            })
            .collect(),
        None => vec![quote!(Arbitrary); grid_rank],
    };
    let grid = grid.iter().map(|e| size(&dsl, e));
    stmts.push(quote! {
        #b.__grid(&[#(#grid),*], &[#(#api::DimSemantics::#semantics),*])?;
    });

    // Operand declarations, in signature order: the handles the body receives.
    for h in &handles {
        let role = h.role.expect("validated");
        if role == Role::Devices {
            continue;
        }
        let hid = &h.ident;
        let name = ir_name(hid);
        let elem = h.elem.as_ref();
        let shape = private_of("shape", hid);
        let l = loc(&api, hid.span());
        let (method, block_spec) = match role {
            Role::Prefetch => ("__prefetch", None),
            Role::Scratch => ("__scratch", None),
            Role::SmemScratch => ("__smem_scratch", None),
            Role::HbmInput => ("__hbm", None),
            Role::HbmOutput => ("__hbm_out", None),
            Role::Vmem => ("__vmem", None),
            Role::DmaSem => ("__dma_sems", None),
            Role::Sem => ("__sems", None),
            Role::Input | Role::Output => {
                let block = private_of("block", hid);
                let index = index_map(&dsl, h, grid_rank);
                let method = if role == Role::Input {
                    "__input"
                } else {
                    "__output"
                };
                let buffering = if h.block.as_ref().is_some_and(|b| b.single_buffered) {
                    quote!(#api::Buffering::Single)
                } else {
                    quote!(#api::Buffering::Double)
                };
                (method, Some(quote!(#block, #index, #buffering,)))
            }
            Role::Comptime | Role::Devices => unreachable!("filtered"),
        };
        // The handle as the body declares it; an element type that is not `Element` is
        // reported on the user's type, not on the attribute.
        let (method, ty) = (Ident::new(method, Span::call_site()), &h.ty);
        let call = match elem {
            Some(elem) => call_on(
                elem,
                quote!(#b.#method::<#elem>),
                quote!(#name, #shape, #block_spec #l),
            ),
            // Semaphores have no element type.
            None => call_on(&h.ty, quote!(#b.#method), quote!(#name, #shape, #l)),
        };
        if h.optional {
            let block = role.is_blocked().then(|| block_stmts(&dsl, &b, h));
            stmts.push(quote! {
                #[allow(non_snake_case)]
                let #hid: #ty = match #shape {
                    ::core::option::Option::Some(#shape) => {
                        #block
                        ::core::option::Option::Some(#call)
                    }
                    ::core::option::Option::None => ::core::option::Option::None,
                };
            });
        } else {
            stmts.push(quote! {
                #[allow(non_snake_case)]
                let #hid: #ty = #call;
            });
        }
    }

    // Outputs that are an input's buffer.
    for h in &handles {
        if let Some(input) = &h.alias {
            let (name, input) = (ir_name(&h.ident), ir_name(input));
            stmts.push(quote! { #b.__alias(#name, #input)?; });
        }
    }

    // The body runs as a nested fn: its parameter types are checked as written and it sees
    // none of the generated names. Its name is an item, which would shadow a user's parameter
    // of the same name inside the block that declares it: the arguments reach it through
    // private names bound outside that block (shown at the parameters, for type errors).
    let body_fn = private("__body");
    let body_params = k.params.iter().map(|p| {
        let (pat, ty) = (&p.pat, &p.ty);
        quote!(#[allow(unused_variables)] #pat: #ty)
    });
    let mut args = Vec::new();
    for (i, p) in k.params.iter().enumerate() {
        let (arg, user) = (private(&format!("__arg{i}")), &p.ident);
        stmts.push(quote!(let #arg = #user;));
        args.push(respan_all(quote!((#arg)), p.ident.span()));
    }
    // The sizes `#[shape]` named, as the body reads them (Pallas kernels read `x.shape`).
    let body_params = body_params.chain(
        shape_symbols
            .iter()
            .map(|sym| quote!(#[allow(non_snake_case, unused_variables)] #sym: usize)),
    );
    args.extend(shape_symbols.iter().map(|sym| quote!(#sym)));
    let comptime_args = comptime(k).map(|c| {
        let (n, ty) = (&c.ident, &c.ty);
        quote!(#n: #ty)
    });
    let optional_outputs = handles
        .iter()
        .filter(|h| h.optional && h.role.is_some_and(|r| r.is_output()))
        .map(|h| ir_name(&h.ident));
    quote! {
        #(#attrs)*
        #vis fn #ident #generics (#(#comptime_args),*) -> #api::KernelDef #where_clause {
            #api::KernelDef::__with_optional_outputs(#api::KernelDef::__new(
                #kernel_name,
                ::std::vec![#(#params),*],
                ::std::vec![#(#arg_decls),*],
                #kernel_loc,
                move |#b: &mut #api::Builder| -> ::core::result::Result<(), #api::Stop> {
                    #(#stmts)*
                    {
                        #[allow(clippy::too_many_arguments)]
                        fn #body_fn #generics (#(#body_params),*) #where_clause #body
                        #body_fn #turbofish (#(#args),*);
                    }
                    ::core::result::Result::Ok(())
                },
            ), ::std::vec![#(#optional_outputs),*])
        }
    }
}

/// Computes a blocked operand's block dims into its private `__block_x` and checks them (the
/// whole array when it has no `#[block]`).
fn block_stmts(dsl: &TokenStream, b: &Ident, h: &Param) -> TokenStream {
    let api = quote!(#dsl::__private);
    let name = ir_name(&h.ident);
    let shape = private_of("shape", &h.ident);
    let block = private_of("block", &h.ident);
    let dims: Vec<TokenStream> = match &h.block {
        Some(spec) => spec
            .dims
            .iter()
            .map(|d| match d {
                BlockDim::Sized(e) => {
                    let e = size(dsl, e);
                    quote!(#api::BlockDim::Sized(#e))
                }
                BlockDim::Squeezed => quote!(#api::BlockDim::Squeezed),
            })
            .collect(),
        // No block: the whole array is one block.
        None => (0..h.shape.as_ref().expect("validated").items.len())
            .map(|d| quote!(#api::BlockDim::Sized(#shape[#d])))
            .collect(),
    };
    quote! {
        let #block: ::std::vec::Vec<#api::BlockDim> = ::std::vec![#(#dims),*];
        #b.__blocks_positive(#name, &#block)?;
    }
}

/// The index map closure as the builder takes it: grid indices in, block indices out.
fn index_map(dsl: &TokenStream, h: &Param, grid_rank: usize) -> TokenStream {
    let api = quote!(#dsl::__private);
    let index = quote!(#dsl::IntoIndex::into_index);
    let g = private("__g");
    let Some(c) = h.block.as_ref().and_then(|b| b.index.as_ref()) else {
        // No block: the whole array is block 0 at every grid step.
        let rank = h.shape.as_ref().expect("validated").items.len();
        let zeros = vec![quote!(#index(0i32)); rank];
        return quote!(&|_: &[#api::Value]| ::std::vec![#(#zeros),*]);
    };
    let block_rank = h.block.as_ref().expect("has an index map").dims.len();
    let (map, t) = (private("__map"), private("__t"));
    // Grid indices are `Value`s; parameters the user typed keep their type.
    let mut closure = c.clone();
    for input in closure.inputs.iter_mut() {
        if !matches!(input, syn::Pat::Type(_)) {
            *input = syn::Pat::Type(syn::PatType {
                attrs: Vec::new(),
                pat: Box::new(input.clone()),
                colon_token: Default::default(),
                ty: Box::new(syn::parse_quote!(#api::Value)),
            });
        }
    }
    let grid_values = (0..grid_rank).map(|i| quote!(#g[#i]));
    // Each block index is converted where the user wrote it, so its errors point there.
    let outs: Vec<TokenStream> = match validate::returned(c) {
        Some(r) if r.is_tuple() => r
            .elems()
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let i = syn::Index::from(i);
                call_on(e, index.clone(), respan_all(quote!(#t.#i), e.span()))
            })
            .collect(),
        Some(r) => {
            let t = respan_all(quote!(#t), r.expr.span());
            vec![call_on(r.expr, index, t)]
        }
        None if block_rank == 1 => vec![quote!(#index(#t))],
        None => (0..block_rank)
            .map(|i| {
                let i = syn::Index::from(i);
                quote!(#index(#t.#i))
            })
            .collect(),
    };
    quote! {
        &|#g: &[#api::Value]| {
            #[allow(unused_variables)]
            let #map = #closure;
            let #t = #map(#(#grid_values),*);
            ::std::vec![#(#outs),*]
        }
    }
}

//! Code generation: the kernel becomes a function returning a `KernelDef` whose build closure
//! binds argument shapes, computes the grid, declares the operands (tracing index maps) and
//! runs the body once on tracer handles.

use std::collections::HashSet;

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{Expr, GenericParam, Ident};

use crate::parse::{BlockDim, Kernel, Param, Role};

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

/// A stub with the kernel's signature, emitted beside errors so uses of the kernel elsewhere
/// do not add "cannot find function" errors.
pub fn stub(k: &Kernel) -> TokenStream {
    let dsl = dsl_path();
    let vis = &k.func.vis;
    let ident = &k.func.sig.ident;
    let generics = &k.func.sig.generics;
    let comptime = comptime_params(k);
    let (names, tys): (Vec<_>, Vec<_>) = comptime.iter().map(|p| (&p.ident, &p.ty)).unzip();
    quote! {
        #[allow(unused_variables, non_snake_case, clippy::too_many_arguments)]
        #vis fn #ident #generics (#(#names: #tys),*) -> #dsl::__private::KernelDef {
            ::core::unimplemented!("this kernel did not compile")
        }
    }
}

fn comptime_params(k: &Kernel) -> Vec<&Param> {
    k.params.iter().filter(|p| p.role == Some(Role::Comptime)).collect()
}

fn loc(dsl: &TokenStream, span: Span) -> TokenStream {
    quote_spanned! {span=>
        #dsl::__private::Loc { file: ::core::file!(), line: ::core::line!(), column: ::core::column!() }
    }
}

pub fn expand(k: &Kernel) -> TokenStream {
    let dsl = dsl_path();
    let p = quote!(#dsl::__private);
    let f = &k.func;
    let vis = &f.vis;
    let ident = &f.sig.ident;
    let kernel_name = k.name.as_ref().map(|s| s.value()).unwrap_or_else(|| ident.to_string());
    let generics = &f.sig.generics;
    let (_, ty_generics, where_clause) = generics.split_for_impl();
    let turbofish = ty_generics.as_turbofish();
    let body = &f.block;
    let attrs = &f.attrs;
    let kernel_loc = loc(&dsl, ident.span());

    // Compile-time parameters shown in the IR and keyed in the cache.
    let mut params = Vec::new();
    for g in &generics.params {
        match g {
            GenericParam::Const(c) => {
                let n = &c.ident;
                let s = n.to_string();
                params.push(quote!(#p::Param::new(#s, #n)));
            }
            GenericParam::Type(t) => {
                let n = &t.ident;
                let s = n.to_string();
                params.push(quote!(#p::Param::new(#s, #p::__type_param_name::<#n>())));
            }
            GenericParam::Lifetime(_) => {}
        }
    }
    let comptime = comptime_params(k);
    for c in &comptime {
        let n = &c.ident;
        let s = n.to_string();
        params.push(quote!(#p::Param::comptime(#s, &#n)));
    }
    let ct_names: Vec<&Ident> = comptime.iter().map(|c| &c.ident).collect();
    let ct_tys: Vec<&syn::Type> = comptime.iter().map(|c| &c.ty).collect();

    // Arguments (scalar prefetch and inputs), in order, and their shape bindings.
    let mut arg_decls = Vec::new();
    let mut shape_stmts = Vec::new();
    let mut bound: HashSet<String> = HashSet::new();
    for g in &generics.params {
        if let GenericParam::Const(c) = g {
            bound.insert(c.ident.to_string());
        }
    }
    for c in &comptime {
        bound.insert(c.ident.to_string());
    }
    let handles: Vec<&Param> = k.params.iter().filter(|p| p.role != Some(Role::Comptime)).collect();
    for h in &handles {
        let role = h.role.expect("validated");
        if !matches!(role, Role::Input | Role::Prefetch) {
            continue;
        }
        let name = h.ident.to_string();
        let elem = h.elem.as_ref().expect("validated");
        let dims = &h.shape.as_ref().expect("validated").1;
        let rank = dims.len();
        let shape_var = format_ident!("__shape_{}", h.ident);
        let role_tok = if role == Role::Input { quote!(Input) } else { quote!(ScalarPrefetch) };
        arg_decls.push(quote! {
            #p::ArgDecl {
                name: #name,
                role: #p::OperandRole::#role_tok,
                dtype: <#elem as #p::Element>::DTYPE,
                rank: #rank,
            }
        });
        shape_stmts.push(quote! {
            let #shape_var: ::std::vec::Vec<usize> = __b.__arg(#name, <#elem as #p::Element>::DTYPE, #rank)?;
        });
        for (d, e) in dims.iter().enumerate() {
            match e {
                Expr::Path(path) if path.path.get_ident().is_some() && !bound.contains(&path.path.get_ident().unwrap().to_string()) => {
                    let sym = path.path.get_ident().unwrap();
                    bound.insert(sym.to_string());
                    shape_stmts.push(quote_spanned! {sym.span()=> let #sym: usize = #shape_var[#d]; });
                }
                _ => {
                    let sym = quote!(#e).to_string();
                    shape_stmts.push(quote_spanned! {e.span()=>
                        __b.__dim_eq(#name, #d, #shape_var[#d], #sym, (#e) as usize)?;
                    });
                }
            }
        }
    }

    // Output and scratch shapes, blocks, grid.
    let mut block_stmts = Vec::new();
    for h in &handles {
        let role = h.role.expect("validated");
        let hid = &h.ident;
        let name = hid.to_string();
        if role == Role::Output {
            let shape_var = format_ident!("__shape_{}", hid);
            let dims = &h.shape.as_ref().expect("validated").1;
            block_stmts.push(quote! { let #shape_var: ::std::vec::Vec<usize> = ::std::vec![#((#dims) as usize),*]; });
        }
        if role == Role::Scratch {
            let shape_var = format_ident!("__shape_{}", hid);
            let dims = &h.scratch.as_ref().expect("validated").1;
            block_stmts.push(quote! { let #shape_var: ::std::vec::Vec<usize> = ::std::vec![#((#dims) as usize),*]; });
        }
        if matches!(role, Role::Input | Role::Output) {
            let block_var = format_ident!("__block_{}", hid);
            let dims: Vec<TokenStream> = match &h.block {
                Some((_, dims)) => dims
                    .iter()
                    .map(|d| match d {
                        BlockDim::Sized(e) => quote_spanned!(e.span()=> #p::BlockDim::Sized((#e) as usize)),
                        BlockDim::Squeezed => quote!(#p::BlockDim::Squeezed),
                    })
                    .collect(),
                None => {
                    // No block: the whole array is one block.
                    let shape_var = format_ident!("__shape_{}", hid);
                    let rank = h.shape.as_ref().expect("validated").1.len();
                    (0..rank).map(|d| quote!(#p::BlockDim::Sized(#shape_var[#d]))).collect()
                }
            };
            block_stmts.push(quote! {
                let #block_var: ::std::vec::Vec<#p::BlockDim> = ::std::vec![#(#dims),*];
                __b.__blocks_positive(#name, &#block_var)?;
            });
        }
    }
    let grid = &k.grid.as_ref().expect("validated").dims;
    let rank = grid.len();
    let semantics: Vec<TokenStream> = match &k.semantics {
        Some(s) => s
            .dims
            .iter()
            .map(|d| if d == "parallel" { quote!(#p::DimSemantics::Parallel) } else { quote!(#p::DimSemantics::Arbitrary) })
            .collect(),
        None => (0..rank).map(|_| quote!(#p::DimSemantics::Arbitrary)).collect(),
    };
    let grid_stmt = quote! {
        __b.__grid(&[#((#grid) as usize),*], &[#(#semantics),*])?;
    };

    // Operand declarations, in signature order.
    let mut decls = Vec::new();
    for h in &handles {
        let role = h.role.expect("validated");
        let hid = &h.ident;
        let name = hid.to_string();
        let elem = h.elem.as_ref().expect("validated");
        let shape_var = format_ident!("__shape_{}", hid);
        let block_var = format_ident!("__block_{}", hid);
        let l = loc(&dsl, hid.span());
        let decl = match role {
            Role::Prefetch => quote! {
                let #hid: #p::Smem<#elem> = __b.__prefetch::<#elem>(#name, #shape_var.clone(), #l);
            },
            Role::Scratch => quote! {
                let #hid: #p::Scratch<#elem> = __b.__scratch::<#elem>(#name, #shape_var.clone(), #l);
            },
            Role::Input | Role::Output => {
                let index = index_map(&p, h, rank);
                let (method, handle) = if role == Role::Input {
                    (quote!(__input), quote!(Ref))
                } else {
                    (quote!(__output), quote!(RefMut))
                };
                quote! {
                    let #hid: #p::#handle<#elem> = __b.#method::<#elem>(#name, #shape_var.clone(), #block_var, #index, #l);
                }
            }
            Role::Comptime => unreachable!("filtered"),
        };
        decls.push(decl);
    }
    let handle_names: Vec<&Ident> = handles.iter().map(|h| &h.ident).collect();
    let handle_tys: Vec<&syn::Type> = handles.iter().map(|h| &h.ty).collect();
    let all_names: Vec<&Ident> = k.params.iter().map(|p| &p.ident).collect();
    let all_tys: Vec<&syn::Type> = k.params.iter().map(|p| &p.ty).collect();

    quote! {
        #(#attrs)*
        #[allow(non_snake_case, clippy::too_many_arguments)]
        #vis fn #ident #generics (#(#ct_names: #ct_tys),*) -> #p::KernelDef #where_clause {
            #[allow(non_snake_case, unused_variables, clippy::too_many_arguments)]
            fn __body #generics (#(#all_names: #all_tys),*) #where_clause #body

            let __params = ::std::vec![#(#params),*];
            let __args = ::std::vec![#(#arg_decls),*];
            #p::KernelDef::__new(#kernel_name, __params, __args, #kernel_loc,
                move |__b: &mut #p::Builder| -> ::core::result::Result<(), #p::Stop> {
                    #(let #ct_names: #ct_tys = ::core::clone::Clone::clone(&#ct_names);)*
                    #(#shape_stmts)*
                    #(#block_stmts)*
                    #grid_stmt
                    #(#decls)*
                    let _: (#(#handle_tys,)*) = (#(#handle_names,)*);
                    __body #turbofish (#(#all_names),*);
                    ::core::result::Result::Ok(())
                })
        }
    }
}

/// The index map closure as the builder takes it: grid indices in, block indices out.
fn index_map(p: &TokenStream, h: &Param, grid_rank: usize) -> TokenStream {
    let hid = &h.ident;
    let shape_var = format_ident!("__shape_{}", hid);
    let block_rank = match &h.block {
        Some((_, dims)) => dims.len(),
        None => h.shape.as_ref().map(|s| s.1.len()).unwrap_or(0),
    };
    let g: Vec<TokenStream> = (0..grid_rank).map(|i| quote!(__g[#i])).collect();
    match &h.index {
        None => {
            let _ = shape_var;
            let zeros = (0..block_rank).map(|_| quote!(#p::__index(0i32)));
            quote!(&|__g: &[#p::Value]| ::std::vec![#(#zeros),*])
        }
        Some(c) => {
            let params: Vec<TokenStream> = c
                .inputs
                .iter()
                .map(|pat| match pat {
                    syn::Pat::Type(_) => quote!(#pat),
                    other => quote!(#other: #p::Value),
                })
                .collect();
            let body = &c.body;
            let outs: Vec<TokenStream> = if block_rank == 1 && !matches!(strip_paren(body), Expr::Tuple(_)) {
                vec![quote!(#p::__index(__t))]
            } else {
                (0..block_rank)
                    .map(|i| {
                        let idx = syn::Index::from(i);
                        quote!(#p::__index(__t.#idx))
                    })
                    .collect()
            };
            let span = c.span();
            quote_spanned! {span=>
                &|__g: &[#p::Value]| {
                    #[allow(unused_variables)]
                    let __map = |#(#params),*| #body;
                    let __t = __map(#(#g),*);
                    ::std::vec![#(#outs),*]
                }
            }
        }
    }
}

fn strip_paren(e: &Expr) -> &Expr {
    match e {
        Expr::Paren(p) => strip_paren(&p.expr),
        Expr::Block(b) => match b.block.stmts.last() {
            Some(syn::Stmt::Expr(e, None)) => strip_paren(e),
            _ => e,
        },
        _ => e,
    }
}

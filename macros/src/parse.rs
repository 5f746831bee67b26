//! Parsing `#[tpu_kernel(...)]` and the kernel signature into typed structs.
//!
//! Parsing is tolerant: it records what it understood and collects errors, so validation can
//! still report everything else in the same compile.

use proc_macro2::TokenStream;
use quote::ToTokens;
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::{Attribute, Expr, ExprClosure, FnArg, Ident, ItemFn, Meta, Pat, Token, Type};

use crate::Errors;

/// Everything `#[tpu_kernel]` knows about one kernel.
pub struct Kernel {
    /// The function, its parameters' attributes removed.
    pub func: ItemFn,
    /// The attribute's arguments, to span kernel-wide errors (empty: the attribute itself).
    pub attr: TokenStream,
    /// Whether the arguments parsed; if not, their error is the only one about them.
    pub attr_parsed: bool,
    pub grid: Option<List>,
    pub semantics: Option<List>,
    pub name: Option<syn::LitStr>,
    /// `require(cond, "message", args..)`: preconditions on the arguments' shapes.
    pub requires: Vec<Require>,
    pub params: Vec<Param>,
}

/// `require(H % KVH == 0, "{KVH} KV heads do not divide {H} heads")`: a relation between
/// sizes the kernel needs, checked at instantiation with the author's sentence.
pub struct Require {
    pub cond: Expr,
    pub message: syn::LitStr,
    /// Arguments of the message, as `format!` takes them.
    pub args: Vec<Expr>,
}

/// A list of expressions as written in an option or attribute: `(a, b)`, `(a,)`, `a`, `M, K`.
pub struct List {
    /// The tokens to span errors about the list as a whole.
    pub tokens: TokenStream,
    pub items: Vec<Expr>,
}

/// What a kernel parameter is, from its type (or `#[comptime]`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    /// `Ref<T>`: an input the grid pipelines into VMEM block by block.
    Input,
    /// `RefMut<T>`: an output the grid pipelines out of VMEM block by block.
    Output,
    /// `Scratch<T>`: a VMEM buffer kept across grid steps.
    Scratch,
    /// `Smem<T>`: scalar prefetch, whole in SMEM.
    Prefetch,
    /// `#[scratch(..)] Smem<T>`: SMEM scratch the kernel reads and writes (`pltpu.SMEM`).
    SmemScratch,
    /// `Hbm<T>`: an input left in HBM (Pallas' `memory_space=ANY`); the kernel copies it.
    HbmInput,
    /// `HbmMut<T>`: an output left in HBM, written by the kernel's copies.
    HbmOutput,
    /// `Vmem<T>`: a VMEM buffer that copies fill and drain (`pltpu.VMEM`).
    Vmem,
    /// `DmaSem`: DMA semaphores, one or an array (`SemaphoreType.DMA`).
    DmaSem,
    /// `Sem`: regular semaphores, one or an array (`SemaphoreType.REGULAR`).
    Sem,
    /// `Devices<M>`: the mesh the kernel runs on and this device's place in it.
    Devices,
    Comptime,
}

impl Role {
    pub fn ty_name(self) -> &'static str {
        match self {
            Role::Input => "Ref",
            Role::Output => "RefMut",
            Role::Scratch => "Scratch",
            Role::Prefetch | Role::SmemScratch => "Smem",
            Role::HbmInput => "Hbm",
            Role::HbmOutput => "HbmMut",
            Role::Vmem => "Vmem",
            Role::DmaSem => "DmaSem",
            Role::Sem => "Sem",
            Role::Devices => "Devices",
            Role::Comptime => "#[comptime]",
        }
    }

    /// Operands the grid pipelines block by block (they may have `#[block]`).
    pub fn is_blocked(self) -> bool {
        matches!(self, Role::Input | Role::Output)
    }

    /// Arguments the caller passes, in signature order (their `#[shape]` binds sizes).
    pub fn is_argument(self) -> bool {
        matches!(self, Role::Input | Role::Prefetch | Role::HbmInput)
    }

    /// Results: their `#[shape]` is computed from sizes known by then.
    pub fn is_output(self) -> bool {
        matches!(self, Role::Output | Role::HbmOutput)
    }

    /// Buffers and semaphores the kernel allocates, sized by `#[scratch(..)]`.
    pub fn is_scratch(self) -> bool {
        matches!(
            self,
            Role::Scratch | Role::SmemScratch | Role::Vmem | Role::DmaSem | Role::Sem
        )
    }

    /// Semaphores: no element type, one without `#[scratch]` or an array with it.
    pub fn is_semaphore(self) -> bool {
        matches!(self, Role::DmaSem | Role::Sem)
    }

    /// Parameters with an array shape given by `#[shape(..)]`.
    pub fn has_shape(self) -> bool {
        self.is_argument() || self.is_output()
    }
}

/// One dimension of a block: a size expression or `None` (squeezed).
pub enum BlockDim {
    Sized(Expr),
    Squeezed,
}

/// `#[block((BM, BK), |i, j, kk| (i, kk))]`, optionally `, buffers = 1`.
pub struct Block {
    /// The whole attribute, for errors about it.
    pub attr: TokenStream,
    /// The block shape as written: `(BM, BK)`.
    pub shape: Expr,
    pub dims: Vec<BlockDim>,
    pub index: Option<ExprClosure>,
    /// `buffers = 1`: the pipeline keeps one VMEM buffer for the block instead of two.
    pub single_buffered: bool,
}

pub struct Param {
    /// `x` or `mut x`, as written.
    pub pat: syn::PatIdent,
    pub ident: Ident,
    pub ty: Type,
    /// `None` when the type is not one of the supported handle types.
    pub role: Option<Role>,
    /// The element type `T` of `Ref<T>` and friends.
    pub elem: Option<Type>,
    /// `Option<Ref<T>>` or `Option<Smem<T>>`: an operand the caller may leave out
    /// (`KernelDef::without`); the body gets `None` then.
    pub optional: bool,
    pub shape: Option<List>,
    pub block: Option<Block>,
    pub scratch: Option<List>,
    /// `#[alias(x)]`: this output is input `x`'s buffer (`input_output_aliases`).
    pub alias: Option<Ident>,
}

/// Parses the attribute arguments and the function; returns what was understood and the
/// errors met on the way.
pub fn parse(attr: TokenStream, func: &ItemFn) -> (Kernel, Errors) {
    let mut errors = Errors::default();
    let mut func = func.clone();
    let mut kernel = Kernel {
        func: func.clone(),
        attr: attr.clone(),
        attr_parsed: true,
        grid: None,
        semantics: None,
        name: None,
        requires: Vec::new(),
        params: Vec::new(),
    };
    parse_attr(attr, &mut kernel, &mut errors);
    for arg in func.sig.inputs.iter_mut() {
        match arg {
            FnArg::Receiver(r) => errors.spanned(
                &*r,
                "a kernel is a free function; `self` parameters are not supported",
            ),
            FnArg::Typed(pt) => {
                let attrs = std::mem::take(&mut pt.attrs);
                let pat = match &*pt.pat {
                    Pat::Ident(p) if p.by_ref.is_none() && p.subpat.is_none() => p.clone(),
                    other => {
                        errors.spanned(other, "a kernel parameter is a plain name: `x: Ref<f32>`");
                        continue;
                    }
                };
                let mut param = Param {
                    ident: pat.ident.clone(),
                    pat,
                    ty: (*pt.ty).clone(),
                    role: None,
                    elem: None,
                    optional: false,
                    shape: None,
                    block: None,
                    scratch: None,
                    alias: None,
                };
                let mut comptime = false;
                for a in &attrs {
                    if a.path().is_ident("comptime") {
                        if let Err(e) = a.meta.require_path_only() {
                            errors.push(e);
                        }
                        if comptime {
                            errors.spanned(a, "`#[comptime]` is given twice");
                        }
                        comptime = true;
                    } else {
                        parse_param_attr(a, &mut param, &mut errors);
                    }
                }
                if comptime {
                    param.role = Some(Role::Comptime);
                } else {
                    (param.role, param.elem, param.optional) = classify_optional(&param.ty);
                    // `#[scratch(..)] t: Smem<T>`: SMEM the kernel writes (`pltpu.SMEM`), not
                    // scalar prefetch.
                    if param.role == Some(Role::Prefetch) && param.scratch.is_some() {
                        param.role = Some(Role::SmemScratch);
                    }
                }
                kernel.params.push(param);
            }
        }
    }
    kernel.func = func;
    (kernel, errors)
}

fn parse_attr(attr: TokenStream, kernel: &mut Kernel, errors: &mut Errors) {
    let items = match Punctuated::<Meta, Token![,]>::parse_terminated.parse2(attr) {
        Ok(items) => items,
        Err(e) => {
            kernel.attr_parsed = false;
            errors.push(e);
            return;
        }
    };
    for item in items {
        let key = item
            .path()
            .get_ident()
            .map(Ident::to_string)
            .unwrap_or_default();
        if !matches!(
            key.as_str(),
            "grid" | "dimension_semantics" | "name" | "require"
        ) {
            errors.spanned(
                item.path(),
                format!(
                    "unknown `tpu_kernel` option `{}`; expected `grid`, `dimension_semantics`, \
                     `name` or `require`",
                    tokens_text(item.path())
                ),
            );
            continue;
        }
        if key == "require" {
            if let Some(r) = parse_require(&item, errors) {
                kernel.requires.push(r);
            }
            continue;
        }
        let value = match item {
            Meta::NameValue(nv) => nv.value,
            other => {
                errors.spanned(&other, format!("expected `{key} = ..`"));
                continue;
            }
        };
        let twice = |errors: &mut Errors| {
            errors.spanned(&value, format!("`{key}` is given twice"));
        };
        match key.as_str() {
            "grid" => {
                if kernel.grid.is_some() {
                    twice(errors);
                }
                kernel.grid = Some(List {
                    tokens: value.to_token_stream(),
                    items: tuple_elems(value),
                });
            }
            "dimension_semantics" => {
                if kernel.semantics.is_some() {
                    twice(errors);
                }
                kernel.semantics = Some(List {
                    tokens: value.to_token_stream(),
                    items: tuple_elems(value),
                });
            }
            _ => match value {
                Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(s),
                    ..
                }) => {
                    if kernel.name.is_some() {
                        errors.spanned(&s, "`name` is given twice");
                    }
                    kernel.name = Some(s);
                }
                other => errors.spanned(other, "expected a string literal: `name = \"my_kernel\"`"),
            },
        }
    }
}

/// `require(cond, "message", args..)`.
fn parse_require(item: &Meta, errors: &mut Errors) -> Option<Require> {
    const FORM: &str = "`require(H % KVH == 0, \"{KVH} KV heads do not divide {H} heads\")`";
    let Meta::List(list) = item else {
        errors.spanned_help(
            item,
            "`require` takes a condition and a message",
            format!("write {FORM}"),
        );
        return None;
    };
    let items = match Punctuated::<Expr, Token![,]>::parse_terminated.parse2(list.tokens.clone()) {
        Ok(e) => e.into_iter().collect::<Vec<_>>(),
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    let mut items = items.into_iter();
    let (Some(cond), message) = (items.next(), items.next()) else {
        errors.spanned_help(
            item,
            "`require` needs a condition and a message",
            format!("write {FORM}"),
        );
        return None;
    };
    let message = match message {
        Some(Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Str(s),
            ..
        })) => s,
        Some(other) => {
            errors.spanned_help(
                other,
                "the message of `require` is a string literal",
                "say what is wrong and how to fix it, with the sizes in braces: `\"{H} heads ..\"`",
            );
            return None;
        }
        None => {
            errors.spanned_help(
                item,
                format!("`require({})` has no message", tokens_text(&cond)),
                format!("add the sentence a caller sees when the condition fails: {FORM}"),
            );
            return None;
        }
    };
    Some(Require {
        cond,
        message,
        args: items.collect(),
    })
}

/// `(a, b, c)` -> [a, b, c]; `(a,)` -> [a]; `(a)` -> [a]; any other expression `e` -> [e].
pub fn tuple_elems(e: Expr) -> Vec<Expr> {
    match e {
        Expr::Tuple(t) => t.elems.into_iter().collect(),
        Expr::Paren(p) => vec![*p.expr],
        other => vec![other],
    }
}

fn parse_param_attr(a: &Attribute, p: &mut Param, errors: &mut Errors) {
    let name = a
        .path()
        .get_ident()
        .map(Ident::to_string)
        .unwrap_or_default();
    if !matches!(name.as_str(), "shape" | "block" | "scratch" | "alias") {
        errors.spanned(
            a,
            format!(
                "unknown kernel parameter attribute `{}`; expected `#[shape(..)]`, \
                 `#[block((..), |..| (..))]`, `#[scratch(..)]`, `#[alias(input)]` or \
                 `#[comptime]`",
                tokens_text(a.path())
            ),
        );
        return;
    }
    if name == "alias" {
        match a.parse_args::<Ident>() {
            Ok(input) if p.alias.is_none() => p.alias = Some(input),
            Ok(_) => errors.spanned(a, "`#[alias]` is given twice; an output aliases one input"),
            Err(_) => errors.spanned_help(
                a,
                "`#[alias]` names one input",
                "write `#[alias(x)]`, with `x` an earlier `Ref<T>` or `Hbm<T>` parameter",
            ),
        }
        return;
    }
    let list = match a.meta.require_list() {
        Ok(l) => l,
        Err(_) => {
            errors.spanned(a, format!("`{name}` takes a list: `#[{name}(..)]`"));
            return;
        }
    };
    let items = match Punctuated::<Expr, Token![,]>::parse_terminated.parse2(list.tokens.clone()) {
        Ok(e) => e.into_iter().collect::<Vec<_>>(),
        Err(e) => {
            errors.push(e);
            return;
        }
    };
    let (present, what) = match name.as_str() {
        "shape" => (p.shape.is_some(), "shape"),
        "scratch" => (p.scratch.is_some(), "scratch"),
        _ => (p.block.is_some(), "block"),
    };
    if present {
        errors.spanned(
            a,
            format!("`#[{what}]` is given twice; give it once per parameter"),
        );
        return;
    }
    let tokens = a.to_token_stream();
    match name.as_str() {
        "shape" => p.shape = Some(List { tokens, items }),
        "scratch" => p.scratch = Some(List { tokens, items }),
        _ => p.block = parse_block(tokens, items, errors),
    }
}

/// The arguments of `#[block(shape, index_map)]`.
fn parse_block(attr: TokenStream, items: Vec<Expr>, errors: &mut Errors) -> Option<Block> {
    let mut items = items.into_iter();
    let Some(shape) = items.next() else {
        errors.spanned(
            &attr,
            "expected a block shape and an index map: `#[block((BM, BK), |i, j| (i, j))]`",
        );
        return None;
    };
    let dims = tuple_elems(shape.clone())
        .into_iter()
        .map(|e| match &e {
            Expr::Path(path) if path.path.is_ident("None") => BlockDim::Squeezed,
            _ => BlockDim::Sized(e),
        })
        .collect();
    let index = match items.next() {
        Some(Expr::Closure(c)) => Some(c),
        Some(other) => {
            errors.spanned(
                other,
                "an index map is a closure from grid indices to block indices, e.g. `|i, j| (i, 0)`",
            );
            None
        }
        None => {
            errors.spanned(
                &attr,
                "missing index map: `#[block((BM, BK), |i, j| (i, j))]` maps grid indices to \
                 block indices",
            );
            None
        }
    };
    let mut single_buffered = false;
    if let Some(extra) = items.next() {
        match buffers_option(&extra) {
            Some(1) => single_buffered = true,
            Some(2) => {}
            _ => errors.spanned(
                extra,
                "expected `buffers = 1` or `buffers = 2` after the index map: how many VMEM \
                 buffers the pipeline keeps for the block (2, the default, overlaps the next \
                 step's copy with this step's compute; 1 halves the VMEM)",
            ),
        }
    }
    if let Some(extra) = items.next() {
        errors.spanned(extra, "unexpected argument after `buffers = ..`");
    }
    Some(Block {
        attr,
        shape,
        dims,
        index,
        single_buffered,
    })
}

/// `buffers = N` with an integer literal `N`: `Some(N)`.
fn buffers_option(e: &Expr) -> Option<u64> {
    let Expr::Assign(a) = e else { return None };
    let is_buffers = matches!(&*a.left, Expr::Path(p) if p.path.is_ident("buffers"));
    match &*a.right {
        Expr::Lit(syn::ExprLit {
            lit: syn::Lit::Int(n),
            ..
        }) if is_buffers => n.base10_parse().ok(),
        _ => None,
    }
}

/// The role, element type and optionality of a parameter: `Option<H>` is an optional `H`.
fn classify_optional(ty: &Type) -> (Option<Role>, Option<Type>, bool) {
    if let Type::Path(tp) = ty {
        if let Some(seg) = tp.path.segments.last().filter(|s| s.ident == "Option") {
            if let syn::PathArguments::AngleBracketed(a) = &seg.arguments {
                if let [syn::GenericArgument::Type(inner)] = &a.args.iter().collect::<Vec<_>>()[..]
                {
                    let (role, elem) = classify(inner);
                    return (role, elem, role.is_some());
                }
            }
        }
    }
    let (role, elem) = classify(ty);
    (role, elem, false)
}

/// The role and element type of a parameter from its type's last path segment.
fn classify(ty: &Type) -> (Option<Role>, Option<Type>) {
    let Type::Path(tp) = ty else {
        return (None, None);
    };
    let Some(seg) = tp.path.segments.last() else {
        return (None, None);
    };
    let role = match seg.ident.to_string().as_str() {
        "Ref" => Role::Input,
        "RefMut" => Role::Output,
        "Scratch" => Role::Scratch,
        "Smem" => Role::Prefetch,
        "Hbm" => Role::HbmInput,
        "HbmMut" => Role::HbmOutput,
        "Vmem" => Role::Vmem,
        "DmaSem" => Role::DmaSem,
        "Sem" => Role::Sem,
        "Devices" => Role::Devices,
        _ => return (None, None),
    };
    let elem = match &seg.arguments {
        syn::PathArguments::AngleBracketed(a) if a.args.len() == 1 => match &a.args[0] {
            syn::GenericArgument::Type(t) => Some(t.clone()),
            _ => None,
        },
        _ => None,
    };
    (Some(role), elem)
}

/// Tokens as the user would write them, for messages: `Vec<f32>`, `M / 2`.
pub fn tokens_text(t: &impl ToTokens) -> String {
    let s = t.to_token_stream().to_string();
    // `quote` spaces every token; undo it around the punctuation of paths and generics.
    let mut out = s;
    for (from, to) in [
        (" :: ", "::"),
        (" < ", "<"),
        (" <", "<"),
        ("< ", "<"),
        (" >", ">"),
        (" ,", ","),
    ] {
        out = out.replace(from, to);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    fn parse_ok(attr: TokenStream, item: TokenStream) -> Kernel {
        let (k, errors) = parse(attr, &syn::parse2(item).unwrap());
        assert_eq!(errors.messages(), Vec::<String>::new());
        k
    }

    fn parse_err(attr: TokenStream, item: TokenStream) -> Vec<String> {
        let (_, errors) = parse(attr, &syn::parse2(item).unwrap());
        errors.messages()
    }

    #[test]
    fn parses_grid_semantics_and_params() {
        let k = parse_ok(
            quote!(
                grid = (M / BM, N / BN),
                dimension_semantics = (parallel, arbitrary)
            ),
            quote! {
                fn k<const BM: usize>(
                    #[shape(S, N)] sched: Smem<i32>,
                    #[shape(M, K)] #[block((BM, None), |i, j| (i, sched.get([i, j])))] x: Ref<f32>,
                    #[shape(M, K)] out: RefMut<f32>,
                    #[scratch(BM, 128)] acc: Scratch<f32>,
                    #[comptime] causal: bool,
                ) {}
            },
        );
        assert_eq!(k.grid.as_ref().unwrap().items.len(), 2);
        assert_eq!(k.semantics.as_ref().unwrap().items.len(), 2);
        let roles: Vec<_> = k.params.iter().map(|p| p.role).collect();
        use Role::*;
        assert_eq!(
            roles,
            [
                Some(Prefetch),
                Some(Input),
                Some(Output),
                Some(Scratch),
                Some(Comptime)
            ]
        );
        let block = k.params[1].block.as_ref().unwrap();
        assert!(matches!(
            block.dims[..],
            [BlockDim::Sized(_), BlockDim::Squeezed]
        ));
        assert_eq!(block.index.as_ref().unwrap().inputs.len(), 2);
        assert!(k.func.sig.inputs.iter().all(|a| match a {
            FnArg::Typed(t) => t.attrs.is_empty(),
            FnArg::Receiver(_) => false,
        }));
    }

    #[test]
    fn grid_forms() {
        let one = |attr| {
            parse_ok(
                attr,
                quote!(
                    fn k() {}
                ),
            )
            .grid
            .unwrap()
            .items
            .len()
        };
        assert_eq!(one(quote!(grid = N / B)), 1);
        assert_eq!(one(quote!(grid = (N / B))), 1);
        assert_eq!(one(quote!(grid = (N / B,))), 1);
        assert_eq!(one(quote!(grid = (1, 2, 3))), 3);
    }

    #[test]
    fn collects_several_errors() {
        let errors = parse_err(
            quote!(grid = (1,), grid = (2,), sizes = 3, name = 4),
            quote! {
                fn k(
                    #[shape(M)] #[shape(M)] x: Ref<f32>,
                    #[block((8,))] #[layout] y: Ref<f32>,
                    (a, b): Ref<f32>,
                    #[comptime(x)] c: bool,
                ) {}
            },
        );
        let expected = [
            "`grid` is given twice",
            "unknown `tpu_kernel` option `sizes`",
            "expected a string literal",
            "`#[shape]` is given twice",
            "missing index map",
            "unknown kernel parameter attribute `layout`",
            "a kernel parameter is a plain name",
            "unexpected token in attribute",
        ];
        assert_eq!(errors.len(), expected.len(), "{errors:#?}");
        for (e, want) in errors.iter().zip(expected) {
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    #[test]
    fn syntax_errors_in_the_options_are_reported_once() {
        let (k, errors) = parse(
            quote!(grid: (1,)),
            &syn::parse2(quote!(
                fn k() {}
            ))
            .unwrap(),
        );
        assert!(!k.attr_parsed);
        assert_eq!(errors.messages().len(), 1);
    }

    #[test]
    fn classifies_types_by_last_segment() {
        let ty: Type = syn::parse2(quote!(tessera::dsl::RefMut<half::bf16>)).unwrap();
        let (role, elem) = classify(&ty);
        assert_eq!(role, Some(Role::Output));
        assert_eq!(tokens_text(&elem.unwrap()), "half::bf16");
        assert_eq!(
            classify(&syn::parse2(quote!(Ref)).unwrap()),
            (Some(Role::Input), None)
        );
        assert_eq!(classify(&syn::parse2(quote!(Vec<f32>)).unwrap()).0, None);
        let (role, elem, optional) =
            classify_optional(&syn::parse2(quote!(Option<Ref<i32>>)).unwrap());
        assert_eq!((role, optional), (Some(Role::Input), true));
        assert_eq!(tokens_text(&elem.unwrap()), "i32");
        assert_eq!(
            classify_optional(&syn::parse2(quote!(Option<u32>)).unwrap()),
            (None, None, false)
        );
    }
}

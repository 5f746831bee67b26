//! Parsing `#[tpu_kernel(...)]` and the kernel signature into typed structs.
//!
//! Parsing is tolerant: it records what it understood and collects errors, so validation can
//! still report everything else in the same compile.

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprClosure, FnArg, Ident, ItemFn, Pat, Token, Type};

/// Everything `#[tpu_kernel]` knows about one kernel.
pub struct Kernel {
    pub func: ItemFn,
    pub attr_span: Span,
    pub grid: Option<Grid>,
    pub semantics: Option<Semantics>,
    pub name: Option<syn::LitStr>,
    pub params: Vec<Param>,
}

pub struct Grid {
    pub dims: Vec<Expr>,
    pub span: Span,
}

pub struct Semantics {
    pub dims: Vec<Ident>,
    pub span: Span,
}

/// What a kernel parameter is, from its type.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Role {
    Input,
    Output,
    Scratch,
    Prefetch,
    Comptime,
}

impl Role {
    pub fn ty_name(self) -> &'static str {
        match self {
            Role::Input => "Ref",
            Role::Output => "RefMut",
            Role::Scratch => "Scratch",
            Role::Prefetch => "Smem",
            Role::Comptime => "#[comptime]",
        }
    }
}

/// One dimension of a block: a size expression or `None` (squeezed).
pub enum BlockDim {
    Sized(Expr),
    Squeezed,
}

pub struct Param {
    pub ident: Ident,
    pub ty: Type,
    /// `None` when the type is not one of the supported handle types.
    pub role: Option<Role>,
    /// The element type `T` of `Ref<T>` and friends.
    pub elem: Option<Type>,
    pub shape: Option<(Span, Vec<Expr>)>,
    pub block: Option<(Span, Vec<BlockDim>)>,
    pub index: Option<ExprClosure>,
    pub scratch: Option<(Span, Vec<Expr>)>,
}

struct Errors(Option<syn::Error>);

impl Errors {
    fn push(&mut self, e: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(e),
            None => self.0 = Some(e),
        }
    }
}

/// Parses the attribute arguments and the function; returns what was understood and the
/// errors met on the way.
pub fn parse(attr: TokenStream, func: &ItemFn) -> (Kernel, Option<syn::Error>) {
    let mut errors = Errors(None);
    let mut func = func.clone();
    let mut kernel = Kernel {
        func: func.clone(),
        attr_span: if attr.is_empty() { Span::call_site() } else { attr.span() },
        grid: None,
        semantics: None,
        name: None,
        params: Vec::new(),
    };
    parse_attr(attr, &mut kernel, &mut errors);
    for arg in func.sig.inputs.iter_mut() {
        match arg {
            FnArg::Receiver(r) => errors.push(syn::Error::new(
                r.span(),
                "a kernel is a free function; `self` parameters are not supported",
            )),
            FnArg::Typed(pt) => {
                let ident = match &*pt.pat {
                    Pat::Ident(p) => p.ident.clone(),
                    other => {
                        errors.push(syn::Error::new(
                            other.span(),
                            "kernel parameters must be plain identifiers",
                        ));
                        continue;
                    }
                };
                let mut param = Param {
                    ident,
                    ty: (*pt.ty).clone(),
                    role: None,
                    elem: None,
                    shape: None,
                    block: None,
                    index: None,
                    scratch: None,
                };
                let mut comptime = false;
                for a in std::mem::take(&mut pt.attrs) {
                    if a.path().is_ident("comptime") {
                        comptime = true;
                        continue;
                    }
                    parse_param_attr(&a, &mut param, &mut errors);
                }
                let (role, elem) = classify(&param.ty);
                param.role = if comptime { Some(Role::Comptime) } else { role };
                param.elem = elem;
                kernel.params.push(param);
            }
        }
    }
    kernel.func = func;
    (kernel, errors.0)
}

fn parse_attr(attr: TokenStream, kernel: &mut Kernel, errors: &mut Errors) {
    let parser = Punctuated::<syn::MetaNameValue, Token![,]>::parse_terminated;
    let items = match parser.parse2(attr) {
        Ok(items) => items,
        Err(e) => {
            errors.push(e);
            return;
        }
    };
    for item in items {
        let key = item.path.get_ident().map(|i| i.to_string()).unwrap_or_default();
        let span = item.value.span();
        match key.as_str() {
            "grid" => {
                if kernel.grid.is_some() {
                    errors.push(syn::Error::new(item.path.span(), "`grid` is given twice"));
                }
                kernel.grid = Some(Grid { dims: tuple_elems(item.value), span });
            }
            "dimension_semantics" => {
                let mut dims = Vec::new();
                for e in tuple_elems(item.value) {
                    match &e {
                        Expr::Path(p) if p.path.get_ident().is_some() => {
                            dims.push(p.path.get_ident().cloned().expect("checked"))
                        }
                        other => errors.push(syn::Error::new(
                            other.span(),
                            "expected `parallel` or `arbitrary`",
                        )),
                    }
                }
                kernel.semantics = Some(Semantics { dims, span });
            }
            "name" => match item.value {
                Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(s), .. }) => kernel.name = Some(s),
                other => errors.push(syn::Error::new(other.span(), "expected a string literal")),
            },
            _ => errors.push(syn::Error::new(
                item.path.span(),
                format!(
                    "unknown `tpu_kernel` option `{}`; expected `grid`, `dimension_semantics` or `name`",
                    path_text(&item.path)
                ),
            )),
        }
    }
}

/// `(a, b, c)` -> [a, b, c]; `(a,)` -> [a]; any other expression `e` -> [e].
pub fn tuple_elems(e: Expr) -> Vec<Expr> {
    match e {
        Expr::Tuple(t) => t.elems.into_iter().collect(),
        Expr::Paren(p) => vec![*p.expr],
        other => vec![other],
    }
}

fn parse_param_attr(a: &syn::Attribute, p: &mut Param, errors: &mut Errors) {
    let name = a.path().get_ident().map(|i| i.to_string()).unwrap_or_default();
    let list = match (&a.meta, name.as_str()) {
        (syn::Meta::List(l), "shape" | "block" | "scratch") => l,
        (_, "shape" | "block" | "scratch") => {
            errors.push(syn::Error::new(
                a.span(),
                format!("`{name}` takes a list: `#[{name}(..)]`"),
            ));
            return;
        }
        _ => {
            errors.push(syn::Error::new(
                a.path().span(),
                format!(
                    "unknown kernel parameter attribute `{}`; expected `#[shape(..)]`, \
                     `#[block((..), |..| (..))]`, `#[scratch(..)]` or `#[comptime]`",
                    path_text(a.path())
                ),
            ));
            return;
        }
    };
    let span = list.delimiter.span().join();
    let elems = match Punctuated::<Expr, Token![,]>::parse_terminated.parse2(list.tokens.clone()) {
        Ok(e) => e.into_iter().collect::<Vec<_>>(),
        Err(e) => {
            errors.push(e);
            return;
        }
    };
    let twice = |errors: &mut Errors| {
        errors.push(syn::Error::new(a.path().span(), format!("`#[{name}]` is given twice")));
    };
    match name.as_str() {
        "shape" => {
            if p.shape.is_some() {
                twice(errors);
            }
            p.shape = Some((span, elems));
        }
        "scratch" => {
            if p.scratch.is_some() {
                twice(errors);
            }
            p.scratch = Some((span, elems));
        }
        _ => {
            if p.block.is_some() {
                twice(errors);
            }
            let mut elems = elems.into_iter();
            let Some(shape) = elems.next() else {
                errors.push(syn::Error::new(
                    span,
                    "expected a block shape and an index map: `#[block((BM, BK), |i, j| (i, j))]`",
                ));
                return;
            };
            let dims = tuple_elems(shape)
                .into_iter()
                .map(|e| match &e {
                    Expr::Path(path) if path.path.is_ident("None") => BlockDim::Squeezed,
                    _ => BlockDim::Sized(e),
                })
                .collect();
            p.block = Some((span, dims));
            match elems.next() {
                Some(Expr::Closure(c)) => p.index = Some(c),
                Some(other) => errors.push(syn::Error::new(
                    other.span(),
                    "an index map is a closure from grid indices to block indices, e.g. `|i, j| (i, 0)`",
                )),
                None => errors.push(syn::Error::new(
                    span,
                    "missing index map: `#[block((BM, BK), |i, j| (i, j))]` maps grid indices to block indices",
                )),
            }
            if let Some(extra) = elems.next() {
                errors.push(syn::Error::new(extra.span(), "unexpected argument after the index map"));
            }
        }
    }
}

/// The role and element type of a parameter from its type's last path segment.
fn classify(ty: &Type) -> (Option<Role>, Option<Type>) {
    let Type::Path(tp) = ty else { return (None, None) };
    let Some(seg) = tp.path.segments.last() else { return (None, None) };
    let role = match seg.ident.to_string().as_str() {
        "Ref" => Role::Input,
        "RefMut" => Role::Output,
        "Scratch" => Role::Scratch,
        "Smem" => Role::Prefetch,
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

fn path_text(p: &syn::Path) -> String {
    quote::quote!(#p).to_string().replace(' ', "")
}

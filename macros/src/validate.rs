//! Validation of a parsed kernel: every rule the macro can check, all errors collected, each
//! spanned on the smallest offending tokens.

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::{Expr, ReturnType};

use crate::parse::{Kernel, Role};

pub const SEMANTICS: [&str; 2] = ["parallel", "arbitrary"];

pub fn validate(k: &Kernel) -> Result<(), syn::Error> {
    let mut errors: Vec<syn::Error> = Vec::new();
    let mut err = |span: Span, msg: String| errors.push(syn::Error::new(span, msg));
    let sig = &k.func.sig;

    if let Some(a) = &sig.asyncness {
        err(a.span(), "a kernel cannot be `async`".into());
    }
    if let Some(u) = &sig.unsafety {
        err(u.span(), "a kernel cannot be `unsafe`".into());
    }
    if let Some(c) = &sig.constness {
        err(c.span(), "a kernel cannot be `const`".into());
    }
    if let ReturnType::Type(_, ty) = &sig.output {
        err(
            ty.span(),
            "a kernel returns nothing: it writes its results to `RefMut` outputs".into(),
        );
    }
    for lt in sig.generics.lifetimes() {
        err(lt.span(), "kernels cannot be generic over lifetimes".into());
    }

    let grid_rank = match &k.grid {
        None => {
            err(
                k.attr_span,
                "missing `grid`: a kernel needs a grid, e.g. `#[tpu_kernel(grid = (M / BM, N / BN))]`"
                    .into(),
            );
            None
        }
        Some(g) if g.dims.is_empty() => {
            err(g.span, "the grid needs at least one dimension".into());
            None
        }
        Some(g) => Some(g.dims.len()),
    };
    if let Some(sem) = &k.semantics {
        for d in &sem.dims {
            if !SEMANTICS.contains(&d.to_string().as_str()) {
                err(
                    d.span(),
                    format!("unknown dimension semantics `{d}`; expected `parallel` or `arbitrary`"),
                );
            }
        }
        if let Some(rank) = grid_rank {
            if sem.dims.len() != rank {
                err(
                    sem.span,
                    format!(
                        "{} dimension semantics given for a rank-{rank} grid; give one per grid dimension",
                        sem.dims.len()
                    ),
                );
            }
        }
    }

    let mut seen_blocked = false;
    let mut outputs = 0;
    for p in &k.params {
        let Some(role) = p.role else {
            err(
                p.ty.span(),
                format!(
                    "unsupported kernel parameter type `{}`; expected `Ref<T>` (input), `RefMut<T>` \
                     (output), `Scratch<T>`, `Smem<T>` (scalar prefetch) or a `#[comptime]` parameter",
                    type_text(&p.ty)
                ),
            );
            continue;
        };
        if role != Role::Comptime && p.elem.is_none() {
            err(p.ty.span(), format!("`{}` needs an element type, e.g. `{}<f32>`", role.ty_name(), role.ty_name()));
        }
        let name = &p.ident;
        match role {
            Role::Input | Role::Output | Role::Prefetch => {
                if p.shape.is_none() {
                    err(
                        p.ident.span(),
                        format!("`{name}` needs its array shape: `#[shape(M, K)]` (names bind to the argument's dims)"),
                    );
                }
                if let Some((s, _)) = &p.scratch {
                    err(*s, format!("`{name}` is not a scratch buffer; `#[scratch(..)]` is for `Scratch<T>`"));
                }
            }
            Role::Scratch => {
                if p.scratch.is_none() {
                    err(p.ident.span(), format!("`{name}` needs its size: `#[scratch(BM, BN)]`"));
                }
                if let Some((s, _)) = &p.shape {
                    err(*s, "a scratch buffer is sized by `#[scratch(..)]`, not `#[shape(..)]`".into());
                }
            }
            Role::Comptime => {
                for (s, what) in [(p.shape.as_ref().map(|s| s.0), "shape"), (p.scratch.as_ref().map(|s| s.0), "scratch")] {
                    if let Some(s) = s {
                        err(s, format!("a `#[comptime]` parameter has no `#[{what}]`"));
                    }
                }
            }
        }
        if let Some((bspan, dims)) = &p.block {
            match role {
                Role::Input | Role::Output => {}
                Role::Prefetch => err(*bspan, format!("`{name}` lives whole in SMEM; scalar prefetch has no block")),
                Role::Scratch => err(*bspan, "scratch buffers have no block or index map".into()),
                Role::Comptime => err(*bspan, "a `#[comptime]` parameter has no block".into()),
            }
            if let Some((_, shape)) = &p.shape {
                if shape.len() != dims.len() {
                    err(
                        *bspan,
                        format!(
                            "block rank {} differs from the rank {} of `{name}`'s shape; give one block dim per array dim (`None` squeezes a dim)",
                            dims.len(),
                            shape.len()
                        ),
                    );
                }
            }
            if let (Some(c), Some(rank)) = (&p.index, grid_rank) {
                if c.inputs.len() != rank {
                    err(
                        closure_params_span(c),
                        format!(
                            "the index map takes {} grid indices but the grid has rank {rank}",
                            c.inputs.len()
                        ),
                    );
                }
                if let Some((n, span)) = returned_arity(&c.body) {
                    if n != dims.len() {
                        err(
                            span,
                            format!(
                                "the index map returns {n} block indices but the block has rank {}",
                                dims.len()
                            ),
                        );
                    }
                }
            }
        }
        match role {
            Role::Prefetch if seen_blocked => err(
                p.ident.span(),
                format!("scalar prefetch `{name}` must come before the inputs and outputs (as in Pallas)"),
            ),
            Role::Input | Role::Output | Role::Scratch => seen_blocked = true,
            _ => {}
        }
        if role == Role::Output {
            outputs += 1;
        }
    }
    if outputs == 0 && !k.params.iter().any(|p| p.role.is_none()) {
        err(sig.ident.span(), "a kernel needs at least one `RefMut<T>` output".into());
    }

    let mut all = errors.into_iter();
    match all.next() {
        None => Ok(()),
        Some(mut first) => {
            for e in all {
                first.combine(e);
            }
            Err(first)
        }
    }
}

fn closure_params_span(c: &syn::ExprClosure) -> Span {
    c.or1_token.span.join(c.or2_token.span).unwrap_or(c.or1_token.span)
}

/// The number of values an index map body visibly returns: a tuple literal, or the tail
/// expression of a block. `None` when it cannot be told from the syntax.
fn returned_arity(body: &Expr) -> Option<(usize, Span)> {
    match body {
        Expr::Tuple(t) => Some((t.elems.len(), t.span())),
        Expr::Block(b) => match b.block.stmts.last() {
            Some(syn::Stmt::Expr(e, None)) => returned_arity(e),
            _ => None,
        },
        Expr::Paren(p) => returned_arity(&p.expr),
        Expr::Lit(_) | Expr::Path(_) | Expr::Binary(_) | Expr::MethodCall(_) => Some((1, body.span())),
        _ => None,
    }
}

fn type_text(ty: &syn::Type) -> String {
    quote::quote!(#ty).to_string().replace(' ', "")
}

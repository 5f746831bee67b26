//! Validation of a parsed kernel: every rule the macro can check, all errors collected, each
//! spanned on the smallest offending tokens.

use std::collections::HashSet;

use quote::quote;
use syn::{Expr, ExprClosure, ReturnType};

use crate::parse::{tokens_text, Block, Kernel, Param, Role};
use crate::Errors;

const SEMANTICS: [&str; 2] = ["parallel", "arbitrary"];

pub fn validate(k: &Kernel, errors: &mut Errors) {
    signature(k, errors);
    let grid_rank = grid(k, errors);
    let mut seen_operand = false;
    for p in &k.params {
        let Some(role) = p.role else {
            errors.spanned(
                &p.ty,
                format!(
                    "unsupported kernel parameter type `{}`; expected `Ref<T>` (input), `RefMut<T>` \
                     (output), `Scratch<T>`, `Smem<T>` (scalar prefetch) or a `#[comptime]` parameter",
                    tokens_text(&p.ty)
                ),
            );
            continue;
        };
        param(p, role, grid_rank, errors);
        match role {
            Role::Prefetch if seen_operand => errors.spanned(
                &p.ident,
                format!(
                    "scalar prefetch `{}` must come before the `Ref`, `RefMut` and `Scratch` \
                     parameters (as in Pallas)",
                    p.ident
                ),
            ),
            Role::Input | Role::Output | Role::Scratch => seen_operand = true,
            _ => {}
        }
    }
    optional_operands(k, errors);
    let has_output = k.params.iter().any(|p| p.role == Some(Role::Output));
    // A parameter of an unsupported type or a return type may have been meant as the output:
    // no second error for the same mistake.
    let returns = matches!(k.func.sig.output, ReturnType::Type(..));
    if !has_output && !returns && k.params.iter().all(|p| p.role.is_some()) {
        errors.spanned(
            &k.func.sig.ident,
            format!(
                "kernel `{}` has no output; declare at least one `RefMut<T>` parameter",
                k.func.sig.ident
            ),
        );
    }
}

/// `Option<..>` is for inputs and scalar prefetch, and an optional operand's shape names only
/// sizes known without it (it may be absent, so it cannot bind a name the body sees).
fn optional_operands(k: &Kernel, errors: &mut Errors) {
    let mut bound: HashSet<syn::Ident> = k
        .params
        .iter()
        .filter(|p| p.role == Some(Role::Comptime))
        .map(|p| p.ident.clone())
        .collect();
    bound.extend(k.func.sig.generics.const_params().map(|c| c.ident.clone()));
    for p in &k.params {
        let Some(role) = p.role else { continue };
        if p.optional && !matches!(role, Role::Input | Role::Prefetch) {
            errors.spanned(
                &p.ty,
                format!(
                    "`{}` cannot be optional: `Option<..>` is for inputs (`Option<Ref<T>>`) and \
                     scalar prefetch (`Option<Smem<T>>`), which a caller may leave out",
                    p.ident
                ),
            );
            continue;
        }
        if !matches!(role, Role::Input | Role::Prefetch) {
            continue;
        }
        let Some(shape) = &p.shape else { continue };
        for e in &shape.items {
            let Expr::Path(path) = e else { continue };
            let Some(sym) = path.path.get_ident() else {
                continue;
            };
            if bound.contains(sym) {
                continue;
            }
            if p.optional {
                errors.spanned(
                    sym,
                    format!(
                        "`{sym}` is first named by `{}`, which is optional and may be absent; \
                         name it in the `#[shape]` of an earlier required operand, or write this \
                         size with names known without `{}`",
                        p.ident, p.ident
                    ),
                );
            } else {
                bound.insert(sym.clone());
            }
        }
    }
}

fn signature(k: &Kernel, errors: &mut Errors) {
    let sig = &k.func.sig;
    if let Some(t) = &sig.constness {
        errors.spanned(t, "a kernel cannot be `const`");
    }
    if let Some(t) = &sig.asyncness {
        errors.spanned(
            t,
            "a kernel cannot be `async`: its body runs once, when it is instantiated",
        );
    }
    if let Some(t) = &sig.unsafety {
        errors.spanned(t, "a kernel cannot be `unsafe`");
    }
    if let Some(t) = &sig.abi {
        errors.spanned(t, "a kernel cannot be `extern`");
    }
    if let Some(t) = &sig.variadic {
        errors.spanned(t, "a kernel cannot be variadic");
    }
    if let ReturnType::Type(arrow, ty) = &sig.output {
        errors.spanned(
            quote!(#arrow #ty),
            "a kernel returns nothing: it writes its results to its `RefMut` outputs",
        );
    }
    for lt in sig.generics.lifetimes() {
        errors.spanned(lt, "a kernel cannot be generic over lifetimes");
    }
}

/// Checks the grid and its semantics; returns the grid rank when it is known.
fn grid(k: &Kernel, errors: &mut Errors) -> Option<usize> {
    let rank = match &k.grid {
        None if !k.attr_parsed => None,
        None => {
            let msg = "missing `grid`: a kernel needs a grid, e.g. `#[tpu_kernel(grid = (M / BM, N / BN))]`";
            if k.attr.is_empty() {
                errors.at(proc_macro2::Span::call_site(), msg);
            } else {
                errors.spanned(&k.attr, msg);
            }
            None
        }
        Some(g) if g.items.is_empty() => {
            errors.spanned(
                &g.tokens,
                "the grid needs at least one dimension, e.g. `grid = (1,)`",
            );
            None
        }
        Some(g) => Some(g.items.len()),
    };
    if let Some(sem) = &k.semantics {
        for d in &sem.items {
            let known = matches!(d, Expr::Path(p) if SEMANTICS.iter().any(|s| p.path.is_ident(s)));
            if !known {
                errors.spanned(
                    d,
                    format!(
                        "unknown dimension semantics `{}`; expected `parallel` or `arbitrary`",
                        tokens_text(d)
                    ),
                );
            }
        }
        if let Some(rank) = rank {
            let n = sem.items.len();
            if n != rank {
                errors.spanned(
                    &sem.tokens,
                    format!(
                        "{n} dimension semantics for a grid of rank {rank}; give one per grid \
                         dimension"
                    ),
                );
            }
        }
    }
    rank
}

fn param(p: &Param, role: Role, grid_rank: Option<usize>, errors: &mut Errors) {
    let name = &p.ident;
    let ty = role.ty_name();
    if role != Role::Comptime && p.elem.is_none() {
        errors.spanned(
            &p.ty,
            format!("`{ty}` needs one element type, e.g. `{ty}<f32>`"),
        );
    }
    match role {
        Role::Input | Role::Output | Role::Prefetch => {
            if p.shape.is_none() {
                errors.spanned(
                    name,
                    format!(
                        "`{name}` needs its array shape, e.g. `#[shape(M, K)]` (a new name binds \
                         the argument's dim, a known one checks it)"
                    ),
                );
            }
            if let Some(s) = &p.scratch {
                errors.spanned(
                    &s.tokens,
                    format!(
                        "`{name}` is not a scratch buffer; `#[scratch(..)]` is for `Scratch<T>`"
                    ),
                );
            }
        }
        Role::Scratch => {
            if p.scratch.is_none() {
                errors.spanned(
                    name,
                    format!("`{name}` needs its size, e.g. `#[scratch(BM, BN)]`"),
                );
            }
            if let Some(s) = &p.shape {
                errors.spanned(
                    &s.tokens,
                    "a scratch buffer is sized by `#[scratch(..)]`, not `#[shape(..)]`",
                );
            }
        }
        Role::Comptime => {
            for (list, what) in [(&p.shape, "shape"), (&p.scratch, "scratch")] {
                if let Some(l) = list {
                    errors.spanned(
                        &l.tokens,
                        format!("a `#[comptime]` parameter has no `#[{what}]`"),
                    );
                }
            }
        }
    }
    let Some(block) = &p.block else { return };
    let no_block = match role {
        Role::Input | Role::Output => None,
        Role::Prefetch => Some(format!(
            "`{name}` is scalar prefetch: it lives whole in SMEM and has no `#[block]`"
        )),
        Role::Scratch => Some(format!(
            "`{name}` is a scratch buffer: it persists across grid steps and has no `#[block]`"
        )),
        Role::Comptime => Some("a `#[comptime]` parameter has no `#[block]`".into()),
    };
    if let Some(msg) = no_block {
        errors.spanned(&block.attr, msg);
        return;
    }
    block_spec(p, block, grid_rank, errors);
}

/// A `BlockSpec`: block rank against the shape, index map against the grid and the array.
fn block_spec(p: &Param, block: &Block, grid_rank: Option<usize>, errors: &mut Errors) {
    let name = &p.ident;
    let block_rank = block.dims.len();
    // The index map returns one block index per array dim; without a shape, per block dim.
    let (rank, of_what) = match &p.shape {
        Some(shape) => {
            let rank = shape.items.len();
            if rank != block_rank {
                let dims: Vec<String> = shape.items.iter().map(tokens_text).collect();
                errors.spanned(
                    &block.shape,
                    format!(
                        "the block has rank {block_rank} but `{name}` has rank {rank} \
                         (`#[shape({})]`); give one block dim per array dim (`None` squeezes a dim)",
                        dims.join(", ")
                    ),
                );
            }
            (rank, format!("`{name}` has rank {rank}"))
        }
        None => (block_rank, format!("the block has rank {block_rank}")),
    };
    let Some(c) = &block.index else { return };
    if let Some(grid_rank) = grid_rank {
        if c.inputs.len() != grid_rank {
            let (or1, inputs, or2) = (&c.or1_token, &c.inputs, &c.or2_token);
            errors.spanned(
                quote!(#or1 #inputs #or2),
                format!(
                    "the index map takes {} but the grid has rank {grid_rank}; it takes one \
                     index per grid dimension",
                    count(c.inputs.len(), "grid index", "grid indices")
                ),
            );
        }
    }
    if let Some(returned) = returned(c) {
        let n = returned.elems().len();
        if n != rank {
            errors.spanned(
                returned.expr,
                format!(
                    "the index map returns {} but {of_what}; return one block index per \
                     array dim, as a tuple",
                    count(n, "block index", "block indices")
                ),
            );
        }
    }
}

/// What an index map visibly returns: a tuple, or a single index, seen through parentheses
/// and the tail of a block `{ ..; (i, 0) }`.
pub struct Returned<'a> {
    pub expr: &'a Expr,
    tuple: Option<&'a syn::ExprTuple>,
}

impl<'a> Returned<'a> {
    pub fn is_tuple(&self) -> bool {
        self.tuple.is_some()
    }

    /// The returned block indices, one per block dim.
    pub fn elems(&self) -> Vec<&'a Expr> {
        match self.tuple {
            Some(t) => t.elems.iter().collect(),
            None => vec![self.expr],
        }
    }
}

/// `None` when the returned arity cannot be told from the syntax (a call, a `match`...).
pub fn returned(c: &ExprClosure) -> Option<Returned<'_>> {
    fn tail(e: &Expr) -> Option<Returned<'_>> {
        match e {
            Expr::Tuple(t) => Some(Returned {
                expr: e,
                tuple: Some(t),
            }),
            Expr::Paren(p) => tail(&p.expr),
            Expr::Block(b) => match b.block.stmts.last() {
                Some(syn::Stmt::Expr(e, None)) => tail(e),
                _ => None,
            },
            Expr::Lit(_)
            | Expr::Path(_)
            | Expr::Binary(_)
            | Expr::MethodCall(_)
            | Expr::Unary(_) => Some(Returned {
                expr: e,
                tuple: None,
            }),
            _ => None,
        }
    }
    tail(&c.body)
}

/// `1 grid index`, `2 grid indices`.
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proc_macro2::TokenStream;
    use quote::quote;

    fn errors(attr: TokenStream, item: TokenStream) -> Vec<String> {
        let (k, mut errors) = crate::parse::parse(attr, &syn::parse2(item).unwrap());
        validate(&k, &mut errors);
        errors.messages()
    }

    fn assert_errors(got: Vec<String>, expected: &[&str]) {
        assert_eq!(got.len(), expected.len(), "{got:#?}");
        for (e, want) in got.iter().zip(expected) {
            assert!(e.contains(want), "{e:?} should contain {want:?}");
        }
    }

    #[test]
    fn a_valid_kernel_has_no_errors() {
        let got = errors(
            quote!(
                grid = (M / BM, N / BN),
                dimension_semantics = (parallel, arbitrary)
            ),
            quote! {
                fn k<T: Element, const BM: usize, const BN: usize>(
                    #[shape(S)] sched: Smem<i32>,
                    #[shape(M, N)] #[block((BM, BN), |i, j| { let a = sched.get([i]); (a, j) })] x: Ref<T>,
                    #[shape(M, N)] #[block((None, BN), |i, j| (i, j))] out: RefMut<f32>,
                    #[scratch(BM, BN)] acc: Scratch<f32>,
                    #[comptime] causal: bool,
                ) {}
            },
        );
        assert_errors(got, &[]);
    }

    #[test]
    fn block_specs_are_checked_against_grid_and_shape() {
        let got = errors(
            quote!(grid = (M / 8, 1)),
            quote! {
                fn k(
                    #[shape(M, N)] #[block((8, 128), |i| (i, 0))] x: Ref<f32>,
                    #[shape(M, N)] #[block((8, 128), |i, j| (i, 0, j))] y: Ref<f32>,
                    #[shape(M, N)] #[block((8, 128, 1), |i, j| (i, j))] out: RefMut<f32>,
                    #[shape(M, N)] #[block((8, 128), |i, j| i)] out2: RefMut<f32>,
                ) {}
            },
        );
        assert_errors(
            got,
            &[
                "the index map takes 1 grid index but the grid has rank 2",
                "the index map returns 3 block indices but `y` has rank 2",
                "the block has rank 3 but `out` has rank 2 (`#[shape(M, N)]`)",
                "the index map returns 1 block index but `out2` has rank 2",
            ],
        );
    }

    #[test]
    fn grid_and_semantics() {
        assert_errors(
            errors(
                quote!(dimension_semantics = (parallel,)),
                quote!(
                    fn k(#[shape(N)] o: RefMut<f32>) {}
                ),
            ),
            &["missing `grid`"],
        );
        assert_errors(
            errors(
                quote!(
                    grid = (1, 2),
                    dimension_semantics = (parallel, sequential, arbitrary)
                ),
                quote!(
                    fn k(#[shape(N)] o: RefMut<f32>) {}
                ),
            ),
            &[
                "unknown dimension semantics `sequential`",
                "3 dimension semantics for a grid of rank 2",
            ],
        );
        assert_errors(
            errors(
                quote!(grid = ()),
                quote!(
                    fn k(#[shape(N)] o: RefMut<f32>) {}
                ),
            ),
            &["the grid needs at least one dimension"],
        );
    }

    #[test]
    fn roles_and_order() {
        let got = errors(
            quote!(grid = 1),
            quote! {
                async fn k<'a>(
                    x: Ref<f32>,
                    #[shape(N)] t: Smem<i32>,
                    #[shape(N)] #[block((8,), |i| i)] s: Scratch,
                    #[shape(N)] v: Vec<f32>,
                ) -> u32 {}
            },
        );
        assert_errors(
            got,
            &[
                "a kernel cannot be `async`",
                "a kernel returns nothing",
                "a kernel cannot be generic over lifetimes",
                "`x` needs its array shape",
                "scalar prefetch `t` must come before",
                "`Scratch` needs one element type",
                "`s` needs its size",
                "a scratch buffer is sized by `#[scratch(..)]`",
                "`s` is a scratch buffer: it persists across grid steps and has no `#[block]`",
                "unsupported kernel parameter type `Vec<f32>`",
            ],
        );
        assert_errors(
            errors(
                quote!(grid = 1),
                quote!(
                    fn k(#[shape(N)] x: Ref<f32>) {}
                ),
            ),
            &["kernel `k` has no output"],
        );
    }

    #[test]
    fn returned_arity_is_seen_through_blocks_and_parens() {
        let arity = |c: TokenStream| {
            let c: ExprClosure = syn::parse2(c).unwrap();
            returned(&c).map(|r| r.elems().len())
        };
        assert_eq!(arity(quote!(|i| (i, 0))), Some(2));
        assert_eq!(arity(quote!(|i| ((i, 0, 1)))), Some(3));
        assert_eq!(
            arity(quote!(|i| {
                let a = i;
                (a, 0)
            })),
            Some(2)
        );
        assert_eq!(arity(quote!(|i| i)), Some(1));
        assert_eq!(arity(quote!(|i| (i,))), Some(1));
        assert_eq!(arity(quote!(|i| f(i))), None);
    }
}

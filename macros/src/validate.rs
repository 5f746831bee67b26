//! Validation of a parsed kernel: every rule the macro can check, all errors collected, each
//! spanned on the smallest offending tokens.

use std::collections::HashSet;

use quote::{quote, ToTokens};
use syn::{Expr, ExprClosure, ReturnType};

use crate::parse::{tokens_text, Block, Kernel, Param, Role};
use crate::Errors;

const SEMANTICS: [&str; 2] = ["parallel", "arbitrary"];

pub fn validate(k: &Kernel, errors: &mut Errors) {
    signature(k, errors);
    let grid_rank = grid(k, errors);
    let mut devices: Option<&Param> = None;
    for p in &k.params {
        let Some(role) = p.role else {
            errors.spanned_help(
                &p.ty,
                format!("unsupported kernel parameter type `{}`", tokens_text(&p.ty)),
                "a kernel parameter is `Ref<T>` or `RefMut<T>` (blocks the grid pipelines), \
                 `Hbm<T>` or `HbmMut<T>` (left in HBM), `Smem<T>` (scalar prefetch), \
                 `Scratch<T>` or `Vmem<T>` (VMEM), `DmaSem` or `Sem` (semaphores), \
                 `Devices<M>` (the mesh), or a `#[comptime]` value",
            );
            continue;
        };
        param(p, role, grid_rank, errors);
        if role == Role::Devices {
            if let Some(first) = devices {
                errors.spanned_help(
                    &p.ident,
                    format!(
                        "the kernel's mesh is declared twice (`{}` and `{}`)",
                        first.ident, p.ident
                    ),
                    format!(
                        "a kernel runs on one mesh: keep `{}` and remove this parameter",
                        first.ident
                    ),
                );
            }
            devices = devices.or(Some(p));
        }
    }
    prefetch_before_readers(k, errors);
    aliases(k, errors);
    optional_operands(k, errors);
    let has_output = k.params.iter().any(|p| p.role.is_some_and(Role::is_output));
    // A parameter of an unsupported type or a return type may have been meant as the output:
    // no second error for the same mistake.
    let returns = matches!(k.func.sig.output, ReturnType::Type(..));
    if !has_output && !returns && k.params.iter().all(|p| p.role.is_some()) {
        errors.spanned_help(
            &k.func.sig.ident,
            format!("kernel `{}` has no output", k.func.sig.ident),
            "declare at least one `RefMut<T>` (or `HbmMut<T>`) parameter",
        );
    }
}

/// `#[alias(x)]` is on an output and names an earlier input, which one output aliases.
fn aliases(k: &Kernel, errors: &mut Errors) {
    let mut taken: Vec<&syn::Ident> = Vec::new();
    for (i, p) in k.params.iter().enumerate() {
        let (Some(input), Some(role)) = (&p.alias, p.role) else {
            continue;
        };
        if !role.is_output() {
            errors.spanned_help(
                input,
                format!(
                    "`{}` is not an output: only outputs alias an input",
                    p.ident
                ),
                "put `#[alias(x)]` on a `RefMut<T>` or `HbmMut<T>` parameter",
            );
            continue;
        }
        let found = k.params[..i].iter().find(|q| q.ident == *input);
        match found.and_then(|q| q.role) {
            Some(Role::Input | Role::HbmInput) => {
                if taken.contains(&input) {
                    errors.spanned_help(
                        input,
                        format!("input `{input}` is aliased by two outputs"),
                        "an input's buffer becomes one output; alias another input",
                    );
                }
                taken.push(input);
            }
            _ => errors.spanned_help(
                input,
                format!("`{input}` is not an input declared before `{}`", p.ident),
                format!(
                    "`#[alias(x)]` names a `Ref<T>` or `Hbm<T>` parameter before `{}`, whose \
                     buffer `{}` becomes",
                    p.ident, p.ident
                ),
            ),
        }
    }
}

/// Arguments are taken in signature order, so an index map can read only scalar prefetch
/// declared before its operand.
fn prefetch_before_readers(k: &Kernel, errors: &mut Errors) {
    for (i, p) in k.params.iter().enumerate() {
        let Some(index) = p.block.as_ref().and_then(|b| b.index.as_ref()) else {
            continue;
        };
        let later = k.params[i + 1..]
            .iter()
            .filter(|q| q.role == Some(Role::Prefetch));
        for q in later {
            if mentions(index.to_token_stream(), &q.ident) {
                errors.spanned_help(
                    &q.ident,
                    format!(
                        "scalar prefetch `{}` is read by the index map of `{}`, declared before it",
                        q.ident, p.ident
                    ),
                    format!(
                        "declare `{}` before `{}` (arguments are taken in signature order, as \
                         in Pallas, where scalar prefetch comes first)",
                        q.ident, p.ident
                    ),
                );
            }
        }
    }
}

/// Whether the identifier `name` is one of `tokens`, at any depth.
fn mentions(tokens: proc_macro2::TokenStream, name: &syn::Ident) -> bool {
    tokens.into_iter().any(|t| match t {
        proc_macro2::TokenTree::Ident(i) => i == *name,
        proc_macro2::TokenTree::Group(g) => mentions(g.stream(), name),
        _ => false,
    })
}

/// `Option<..>` is for inputs and outputs, blocked or in HBM, and scalar prefetch (Pallas' `None`
/// out spec: an output a caller does not want, such as a forward's residuals at inference), and an
/// optional operand's shape names only sizes known without it (it may be absent, so it cannot
/// bind a name the body sees). An optional output aliases no input: the input's buffer would
/// have nowhere to go.
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
        if p.optional
            && !matches!(
                role,
                Role::Input | Role::Prefetch | Role::HbmInput | Role::Output | Role::HbmOutput
            )
        {
            errors.spanned_help(
                &p.ty,
                format!("`{}` cannot be optional", p.ident),
                format!(
                    "`Option<..>` is for inputs (`Option<Ref<T>>`, `Option<Hbm<T>>`), scalar \
                     prefetch (`Option<Smem<T>>`) and outputs (`Option<RefMut<T>>`, \
                     `Option<HbmMut<T>>`), which a caller may leave out; declare `{}: {}<..>`",
                    p.ident,
                    role.ty_name()
                ),
            );
            continue;
        }
        if p.optional && p.alias.is_some() {
            errors.spanned_help(
                &p.ty,
                format!("`{}` cannot be optional: it aliases an input", p.ident),
                format!(
                    "an aliased output is the input's buffer, which must go somewhere; \
                     declare `{}: RefMut<..>`, or drop the `#[alias]`",
                    p.ident
                ),
            );
            continue;
        }
        if !role.is_argument() {
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
    match role {
        Role::Comptime => {}
        Role::Devices if p.elem.is_none() => errors.spanned_help(
            &p.ty,
            "`Devices` needs the mesh the kernel runs on",
            "name it: `Devices<RingMesh>`, with `RingMesh` declared by `mesh!(pub RingMesh = [Context])`",
        ),
        Role::DmaSem | Role::Sem if p.elem.is_some() || has_generic_args(&p.ty) => errors
            .spanned_help(
                &p.ty,
                format!("`{ty}` has no element type"),
                format!(
                    "write `{ty}` for one semaphore, or `#[scratch(N)] {name}: {ty}` for an \
                     array of N"
                ),
            ),
        Role::DmaSem | Role::Sem => {}
        _ if p.elem.is_none() => errors.spanned_help(
            &p.ty,
            format!("`{ty}` needs one element type"),
            format!("write `{ty}<f32>`, `{ty}<bf16>`, `{ty}<i32>` or a type parameter `{ty}<T>`"),
        ),
        _ => {}
    }
    if role.has_shape() && p.shape.is_none() {
        errors.spanned_help(
            name,
            format!("`{name}` needs its array shape"),
            "add `#[shape(M, K)]`: a new name binds the argument's dim, a known one checks it",
        );
    }
    // (Given a `#[shape]` instead, the error about that says how to size it.)
    if matches!(role, Role::Scratch | Role::Vmem) && p.scratch.is_none() && p.shape.is_none() {
        errors.spanned_help(
            name,
            format!("`{name}` needs its size"),
            format!("add `#[scratch(BM, BN)]` before `{name}: {ty}<..>`"),
        );
    }
    if let Some(s) = &p.scratch {
        if !role.is_scratch() {
            let what = match role {
                Role::Comptime => "a `#[comptime]` parameter has no `#[scratch]`".to_string(),
                Role::Devices => format!("`{name}` is the kernel's mesh, not a scratch buffer"),
                _ => format!("`{name}` is not a scratch buffer"),
            };
            errors.spanned_help(
                &s.tokens,
                what,
                "`#[scratch(..)]` sizes `Scratch<T>`, `Vmem<T>`, `Smem<T>` scratch and arrays of \
                 `DmaSem` or `Sem`",
            );
        }
    }
    if let Some(s) = &p.shape {
        if !role.has_shape() {
            let (what, help) = match role {
                r if r.is_scratch() => (
                    format!("`{name}` is allocated by the kernel: it has no `#[shape]`"),
                    format!("size `{name}` with `#[scratch(..)]`"),
                ),
                Role::Devices => (
                    format!("`{name}` is the kernel's mesh: it has no `#[shape]`"),
                    "the mesh's sizes come from the instantiation; read them with \
                     `devices.size::<Axis>()`"
                        .to_string(),
                ),
                _ => (
                    "a `#[comptime]` parameter has no `#[shape]`".to_string(),
                    "its value is given where the kernel is defined: remove the `#[shape]`"
                        .to_string(),
                ),
            };
            errors.spanned_help(&s.tokens, what, help);
        }
    }
    let Some(block) = &p.block else { return };
    let no_block = match role {
        Role::Input | Role::Output => None,
        Role::Prefetch => Some((
            format!("`{name}` is scalar prefetch: it lives whole in SMEM and has no `#[block]`"),
            "read its elements with `.get([i])`, in the body or in another operand's index map"
                .to_string(),
        )),
        Role::HbmInput | Role::HbmOutput => Some((
            format!(
                "`{name}` is left in HBM: the grid does not pipeline it, so it has no `#[block]`"
            ),
            format!(
                "copy windows of it with `async_copy`, or declare it `{}<T>` to have the grid \
                 pipeline its blocks",
                if role == Role::HbmInput {
                    "Ref"
                } else {
                    "RefMut"
                }
            ),
        )),
        Role::Comptime => Some((
            "a `#[comptime]` parameter has no `#[block]`".into(),
            "remove it".into(),
        )),
        _ => Some((
            format!(
                "`{name}` is a {}: it persists across grid steps and has no `#[block]`",
                if role.is_semaphore() {
                    "semaphore"
                } else if role == Role::Devices {
                    "mesh"
                } else {
                    "scratch buffer"
                }
            ),
            "remove the `#[block]`; index it with `.at(..)` in the body".into(),
        )),
    };
    if let Some((msg, help)) = no_block {
        errors.spanned_help(&block.attr, msg, help);
        return;
    }
    block_spec(p, block, grid_rank, errors);
}

/// `DmaSem<..>`: generic arguments on a type that takes none.
fn has_generic_args(ty: &syn::Type) -> bool {
    let syn::Type::Path(tp) = ty else {
        return false;
    };
    tp.path
        .segments
        .last()
        .is_some_and(|s| !s.arguments.is_none())
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
                    #[shape(N)] #[block((8,), |i| t.get([i]))] x: Ref<f32>,
                    #[shape(N)] t: Smem<i32>,
                    #[shape(N)] #[block((8,), |i| i)] s: Scratch,
                    #[shape(N)] v: Vec<f32>,
                    y: Hbm<f32>,
                    #[scratch(2)] b: Vmem<f32>,
                    #[scratch(2)] sems: DmaSem<i32>,
                    d: Devices,
                    #[scratch(1)] e: Devices<RingMesh>,
                ) -> u32 {}
            },
        );
        assert_errors(
            got,
            &[
                "a kernel cannot be `async`",
                "a kernel returns nothing",
                "a kernel cannot be generic over lifetimes",
                "`Scratch` needs one element type",
                "`s` is allocated by the kernel: it has no `#[shape]`",
                "`s` is a scratch buffer: it persists across grid steps and has no `#[block]`",
                "unsupported kernel parameter type `Vec<f32>`",
                "`y` needs its array shape",
                "`DmaSem` has no element type",
                "`Devices` needs the mesh the kernel runs on",
                "`e` is the kernel's mesh, not a scratch buffer",
                "the kernel's mesh is declared twice (`d` and `e`)",
                "scalar prefetch `t` is read by the index map of `x`, declared before it",
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

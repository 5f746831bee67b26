//! The IR verifier: rejects ill-formed kernels with errors naming the op and source location.

use std::collections::HashSet;

use super::{
    infer, DType, Inst, Kernel, Loc, MemorySpace, Op, OperandRole, RefId, Region, ValueId,
    ValueType,
};

/// An ill-formed piece of IR: which op, where the kernel author wrote it, and what is wrong.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{loc}: `{op}`: {message}")]
pub struct VerifyError {
    pub op: String,
    pub loc: Loc,
    pub message: String,
}

/// Checks every structural and typing rule of the IR; returns all problems found.
pub fn verify(k: &Kernel) -> Result<(), Vec<VerifyError>> {
    let mut v = Verifier {
        k,
        defined: HashSet::new(),
        scoped: HashSet::new(),
        live: HashSet::new(),
        errors: Vec::new(),
    };
    v.kernel();
    if v.errors.is_empty() {
        Ok(())
    } else {
        Err(v.errors)
    }
}

struct Verifier<'k> {
    k: &'k Kernel,
    /// Values visible at the current point (SSA dominance within nested regions).
    defined: HashSet<ValueId>,
    /// Refs allocated by a `run_scoped` region, and those whose region is being verified.
    scoped: HashSet<RefId>,
    live: HashSet<RefId>,
    errors: Vec<VerifyError>,
}

/// Calls `f` for every ref a `run_scoped` op in `r` (or nested in it) allocates.
pub(crate) fn scoped_allocs<'a>(r: &'a Region, f: &mut dyn FnMut(&'a Inst, RefId)) {
    for inst in &r.insts {
        if let Op::Scoped { allocs, .. } = &inst.op {
            for &a in allocs {
                f(inst, a);
            }
        }
        for nested in inst.op.regions() {
            scoped_allocs(nested, f);
        }
    }
}

impl Verifier<'_> {
    fn err(&mut self, op: &str, loc: Loc, message: impl Into<String>) {
        self.errors.push(VerifyError {
            op: op.to_string(),
            loc,
            message: message.into(),
        });
    }

    fn kernel(&mut self) {
        let k = self.k;
        if k.grid.len() != k.semantics.len() {
            self.err(
                "kernel",
                k.loc,
                format!(
                    "the grid has rank {} but {} dimension semantics are given",
                    k.grid.len(),
                    k.semantics.len()
                ),
            );
        }
        if k.grid.contains(&0) {
            self.err(
                "kernel",
                k.loc,
                format!("grid {:?} has an empty dimension", k.grid),
            );
        }
        for (i, o) in k.operands.iter().enumerate() {
            let what = k.describe(super::RefId(i as u32));
            let ok_memory = match o.role {
                OperandRole::Input | OperandRole::Output => match o.memory {
                    MemorySpace::Vmem => o.block.is_some(),
                    MemorySpace::Smem | MemorySpace::Any => o.block.is_none(),
                    MemorySpace::Semaphore(_) => false,
                },
                OperandRole::Scratch => o.block.is_none() && o.memory != MemorySpace::Any,
                OperandRole::ScalarPrefetch => o.block.is_none() && o.memory == MemorySpace::Smem,
            };
            if o.memory.semaphore().is_some() && o.dtype != DType::I32 {
                self.err(
                    "operand",
                    o.loc,
                    format!("{what}: semaphores count in i32, not {}", o.dtype),
                );
            }
            if !ok_memory {
                self.err(
                    "operand",
                    o.loc,
                    format!(
                        "{what}: a {} operand cannot live in {} memory here",
                        o.role.name(),
                        o.memory.name()
                    ),
                );
            }
            if o.memory == MemorySpace::Smem && o.dtype.size_bytes() != 4 {
                self.err(
                    "operand",
                    o.loc,
                    format!(
                        "{what}: SMEM holds 32-bit words; {} is not supported there (use i32)",
                        o.dtype
                    ),
                );
            }
            if let Some(b) = &o.block {
                if b.block_shape.len() != o.array_shape.len() {
                    self.err(
                        "operand",
                        o.loc,
                        format!(
                            "{what}: block rank {} differs from the array rank {}",
                            b.block_shape.len(),
                            o.array_shape.len()
                        ),
                    );
                }
                self.index_map(&what, o.loc, &b.index_map, o.array_shape.len());
            }
        }
        let mut seen = HashSet::new();
        scoped_allocs(&k.body, &mut |inst, r| {
            if !seen.insert(r) {
                self.err(
                    "run_scoped",
                    inst.loc,
                    format!("`{}` is allocated by two scopes", k.operand(r).name),
                );
            }
        });
        self.scoped = seen;
        self.region(&k.body, false);
    }

    fn index_map(&mut self, what: &str, loc: Loc, r: &Region, array_rank: usize) {
        let k = self.k;
        if r.params.len() != k.grid.len() {
            self.err(
                "index_map",
                loc,
                format!(
                    "{what}: the index map takes {} grid indices but the grid has rank {}",
                    r.params.len(),
                    k.grid.len()
                ),
            );
        }
        if r.yields.len() != array_rank {
            self.err(
                "index_map",
                loc,
                format!("{what}: the index map returns {} block indices but the array has rank {array_rank}", r.yields.len()),
            );
        }
        let saved = std::mem::take(&mut self.defined);
        self.region(r, true);
        for &y in &r.yields {
            if *k.value_type(y) != ValueType::scalar(DType::I32) {
                self.err(
                    "index_map",
                    loc,
                    format!(
                        "{what}: block indices must be i32 scalars, got {}",
                        k.value_type(y)
                    ),
                );
            }
        }
        self.defined = saved;
    }

    /// Verifies a region in a fresh nested scope; `scalar_only` for index maps.
    fn region(&mut self, r: &Region, scalar_only: bool) {
        let outer = self.defined.clone();
        for &p in &r.params {
            self.defined.insert(p);
        }
        for inst in &r.insts {
            self.inst(inst, scalar_only);
        }
        for &y in &r.yields {
            if !self.defined.contains(&y) {
                self.err(
                    "yield",
                    Loc::internal(),
                    format!("{y} is used before it is defined"),
                );
            }
        }
        self.defined = outer;
    }

    fn inst(&mut self, inst: &Inst, scalar_only: bool) {
        let name = inst.op.name();
        if scalar_only
            && matches!(
                inst.op,
                Op::Load { .. }
                    | Op::Store { .. }
                    | Op::StoreScalar { .. }
                    | Op::When { .. }
                    | Op::ForLoop { .. }
                    | Op::Dot { .. }
                    | Op::DmaStart { .. }
                    | Op::DmaWait { .. }
                    | Op::SemSignal { .. }
                    | Op::SemWait { .. }
                    | Op::SemRead { .. }
                    | Op::Scoped { .. }
                    | Op::DebugPrint { .. }
                    | Op::DebugCheck { .. }
            )
        {
            self.err(
                name,
                inst.loc,
                "index maps compute scalars only (arithmetic and SMEM reads)",
            );
            return;
        }
        for v in inst.op.operands() {
            if !self.defined.contains(&v) {
                self.err(
                    name,
                    inst.loc,
                    format!("{v} is used before it is defined or outside its scope"),
                );
                return;
            }
        }
        for r in inst.op.refs() {
            if self.scoped.contains(&r) && !self.live.contains(&r) {
                if let Op::Scoped { .. } = inst.op {
                    continue;
                }
                self.err(
                    name,
                    inst.loc,
                    format!(
                        "`{}` belongs to a `run_scoped` region and is used outside it",
                        self.k.operand(r).name
                    ),
                );
                return;
            }
        }
        let allocs = match &inst.op {
            Op::Scoped { allocs, .. } => allocs.clone(),
            _ => Vec::new(),
        };
        self.live.extend(allocs.iter().copied());
        for r in inst.op.regions() {
            self.region(r, scalar_only);
        }
        for r in &allocs {
            self.live.remove(r);
        }
        match infer(&inst.op, self.k) {
            Ok(types) => {
                if types.len() != inst.results.len() {
                    self.err(
                        name,
                        inst.loc,
                        format!(
                            "defines {} values but its type has {}",
                            inst.results.len(),
                            types.len()
                        ),
                    );
                } else {
                    for (&r, t) in inst.results.iter().zip(&types) {
                        let recorded = self.k.types.get(r.index());
                        if recorded != Some(t) {
                            self.err(
                                name,
                                inst.loc,
                                format!("{r} is recorded as {recorded:?} but the op produces {t}"),
                            );
                        }
                    }
                }
            }
            Err(error) => self.err(name, inst.loc, error.to_string()),
        }
        for &r in &inst.results {
            if !self.defined.insert(r) {
                self.err(name, inst.loc, format!("{r} is defined twice"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{
        BlockDim, BlockMapping, DimSemantics, Inst, Kernel, Literal, MemorySpace, Operand,
        OperandRole, RefId, Slice, ValueType,
    };

    fn loc(line: u32) -> Loc {
        Loc {
            file: "kernel.rs",
            line,
            column: 5,
        }
    }

    /// A one-step kernel with an input `x` and an output `out` (f32[8, 128] blocks).
    fn kernel(body: Vec<Inst>, types: Vec<ValueType>) -> Kernel {
        let mut types = types;
        let g = ValueId(types.len() as u32);
        types.push(ValueType::scalar(DType::I32));
        let zero = ValueId(types.len() as u32);
        types.push(ValueType::scalar(DType::I32));
        let index_map = Region {
            params: vec![g],
            insts: vec![Inst {
                op: Op::Constant {
                    value: Literal::Int(0),
                    ty: ValueType::scalar(DType::I32),
                },
                results: vec![zero],
                loc: loc(1),
            }],
            yields: vec![g, zero],
        };
        let operand = |name: &str, role| Operand {
            name: name.into(),
            role,
            dtype: DType::F32,
            memory: MemorySpace::Vmem,
            array_shape: vec![8, 128],
            block: Some(BlockMapping {
                block_shape: vec![BlockDim::Sized(8), BlockDim::Sized(128)],
                index_map: index_map.clone(),
                buffering: Default::default(),
            }),
            aliases: None,
            loc: loc(2),
        };
        Kernel {
            name: "k".into(),
            params: vec![],
            grid: vec![1],
            semantics: vec![DimSemantics::Parallel],
            operands: vec![
                operand("x", OperandRole::Input),
                operand("out", OperandRole::Output),
            ],
            checks: Default::default(),
            mesh: Vec::new(),
            body: Region {
                params: vec![],
                insts: body,
                yields: vec![],
            },
            types,
            loc: loc(0),
        }
    }

    fn full() -> Vec<Slice> {
        vec![Slice::Full, Slice::Full]
    }

    fn block() -> ValueType {
        ValueType::new(DType::F32, [8, 128])
    }

    #[test]
    fn a_well_formed_kernel_verifies() {
        let body = vec![
            Inst {
                op: Op::Load {
                    src: RefId(0),
                    slices: full(),
                },
                results: vec![ValueId(0)],
                loc: loc(10),
            },
            Inst {
                op: Op::Store {
                    dst: RefId(1),
                    slices: full(),
                    value: ValueId(0),
                },
                results: vec![],
                loc: loc(11),
            },
        ];
        assert_eq!(verify(&kernel(body, vec![block()])), Ok(()));
    }

    #[test]
    fn use_before_definition_names_the_op_and_line() {
        let body = vec![
            Inst {
                op: Op::Store {
                    dst: RefId(1),
                    slices: full(),
                    value: ValueId(0),
                },
                results: vec![],
                loc: loc(11),
            },
            Inst {
                op: Op::Load {
                    src: RefId(0),
                    slices: full(),
                },
                results: vec![ValueId(0)],
                loc: loc(12),
            },
        ];
        let errors = verify(&kernel(body, vec![block()])).unwrap_err();
        assert_eq!(errors[0].op, "store");
        assert_eq!(errors[0].loc.line, 11);
        assert!(
            errors[0]
                .to_string()
                .contains("%0 is used before it is defined"),
            "{}",
            errors[0]
        );
    }

    #[test]
    fn stores_to_inputs_and_wrong_recorded_types_are_rejected() {
        let body = vec![
            Inst {
                op: Op::Load {
                    src: RefId(0),
                    slices: full(),
                },
                results: vec![ValueId(0)],
                loc: loc(10),
            },
            Inst {
                op: Op::Store {
                    dst: RefId(0),
                    slices: full(),
                    value: ValueId(0),
                },
                results: vec![],
                loc: loc(11),
            },
        ];
        let errors = verify(&kernel(body, vec![block()])).unwrap_err();
        assert!(
            errors[0]
                .message
                .contains("`x` is an input; inputs are read-only"),
            "{errors:?}"
        );

        let body = vec![Inst {
            op: Op::Load {
                src: RefId(0),
                slices: full(),
            },
            results: vec![ValueId(0)],
            loc: loc(10),
        }];
        let errors =
            verify(&kernel(body, vec![ValueType::new(DType::BF16, [8, 128])])).unwrap_err();
        assert!(errors[0].message.contains("recorded as"), "{errors:?}");
    }

    #[test]
    fn region_values_do_not_escape_their_scope() {
        // %1 is defined inside the `when`, then used after it.
        let then = Region {
            params: vec![],
            insts: vec![Inst {
                op: Op::Load {
                    src: RefId(0),
                    slices: full(),
                },
                results: vec![ValueId(1)],
                loc: loc(21),
            }],
            yields: vec![],
        };
        let body = vec![
            Inst {
                op: Op::Constant {
                    value: Literal::Bool(true),
                    ty: ValueType::scalar(DType::Bool),
                },
                results: vec![ValueId(0)],
                loc: loc(20),
            },
            Inst {
                op: Op::When {
                    cond: ValueId(0),
                    then,
                    otherwise: Region::default(),
                },
                results: vec![],
                loc: loc(20),
            },
            Inst {
                op: Op::Store {
                    dst: RefId(1),
                    slices: full(),
                    value: ValueId(1),
                },
                results: vec![],
                loc: loc(22),
            },
        ];
        let errors =
            verify(&kernel(body, vec![ValueType::scalar(DType::Bool), block()])).unwrap_err();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].loc.line, 22);
    }

    #[test]
    fn grid_and_semantics_ranks_must_agree() {
        let mut k = kernel(vec![], vec![]);
        k.semantics.push(DimSemantics::Arbitrary);
        let errors = verify(&k).unwrap_err();
        assert!(
            errors[0].message.contains("2 dimension semantics"),
            "{errors:?}"
        );
    }
}

//! The TPU rules for what Mosaic accepts inside a kernel: each refused kernel gets one
//! message naming the line that breaks the rule and the fix; the same kernel instantiates
//! under portable rules (it runs on the interpreter and the StableHLO backends).

mod illegal_kernels;

use tessera::dsl::{KernelRules, ProblemKind};

#[test]
fn each_tpu_rule_names_the_kernel_line_and_the_fix() {
    for case in illegal_kernels::all() {
        let e = match case.def.instantiate(&case.args, &KernelRules::tpu()) {
            Ok(k) => panic!("{}: the TPU rules accepted\n{k}", case.name),
            Err(e) => e,
        };
        assert_eq!(
            e.problems.len(),
            1,
            "{}: one mistake, one message: {e}",
            case.name
        );
        let p = &e.problems[0];
        assert_eq!(p.kind, ProblemKind::TpuOp, "{}: {e}", case.name);
        let loc = p.loc.expect("a located problem");
        assert!(
            loc.file.ends_with("illegal_kernels/mod.rs"),
            "{}: {e}",
            case.name
        );
        assert_eq!(
            loc.line,
            illegal_kernels::marked_line(case.marker),
            "{}: the message names another line: {e}",
            case.name
        );
        assert!(
            e.to_string().contains(case.fix),
            "{}: no fix in: {e}",
            case.name
        );
        case.def
            .instantiate(&case.args, &KernelRules::portable())
            .unwrap_or_else(|e| panic!("{}: portable rules refused: {e}", case.name));
    }
}

/// A kernel's semaphores over a TPU's semaphore memory (2 KiB, 4 bytes each) are refused
/// with the count, the bytes and the largest operand named; the portable rules take them.
#[test]
fn semaphores_over_the_semaphore_memory_are_refused() {
    let (def, args) = illegal_kernels::semaphores(600);
    let e = def.instantiate(&args, &KernelRules::tpu()).unwrap_err();
    assert_eq!(e.problems.len(), 1, "{e}");
    assert_eq!(e.problems[0].kind, ProblemKind::SemaphoreMemory, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("600 semaphores need 2400 B") && text.contains("(sems) 600 (2400 B)"),
        "{text}"
    );
    def.instantiate(&args, &KernelRules::portable()).unwrap();
    let (def, args) = illegal_kernels::semaphores(512);
    def.instantiate(&args, &KernelRules::tpu()).unwrap();
}

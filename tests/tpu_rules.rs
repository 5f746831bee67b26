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

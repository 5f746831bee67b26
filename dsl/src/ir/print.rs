//! The stable, readable text form of the kernel IR (snapshot-tested).

use std::fmt::Write;

use super::{
    join, BlockMapping, Buffering, Inst, Kernel, Op, RefWindow, Region, SemRef, Slice, ValueId,
};

pub(super) fn print_kernel(k: &Kernel) -> String {
    let mut out = String::new();
    let params = if k.params.is_empty() {
        String::new()
    } else {
        let ps: Vec<String> = k
            .params
            .iter()
            .map(|p| format!("{} = {}", p.name, p.value))
            .collect();
        format!("<{}>", ps.join(", "))
    };
    let _ = writeln!(out, "kernel @{}{}", k.name, params);
    let sems: Vec<&str> = k.semantics.iter().map(|s| s.name()).collect();
    let _ = writeln!(
        out,
        "  grid = [{}], semantics = [{}]",
        join(&k.grid, ", "),
        sems.join(", ")
    );
    if !k.mesh.is_empty() {
        let axes: Vec<String> = k
            .mesh
            .iter()
            .map(|a| format!("{}: {}", a.name, a.size))
            .collect();
        let _ = writeln!(out, "  mesh = {{{}}}", axes.join(", "));
    }
    let p = Printer { k };
    for o in &k.operands {
        let _ = write!(
            out,
            "  {} {}: {}[{}] {}",
            o.role.name(),
            o.name,
            o.dtype,
            join(&o.array_shape, ", "),
            o.memory.name()
        );
        if let Some(b) = &o.block {
            p.block_mapping(&mut out, b);
        }
        if let Some(input) = o.aliases {
            let _ = write!(out, " aliases {}", k.operand(input).name);
        }
        out.push('\n');
    }
    // A kernel without run-time indices prints as it did before the checks pass.
    let c = &k.checks;
    if !c.sites.is_empty() || c.proven > 0 || c.unchecked > 0 {
        let _ = writeln!(
            out,
            "  checks: {} at run time, {} indices proven in range, {} marked unchecked",
            c.sites.len(),
            c.proven,
            c.unchecked
        );
    }
    for (i, site) in c.sites.iter().enumerate() {
        let _ = writeln!(out, "    check {i} at {}: {}", site.loc, site.kind);
    }
    out.push_str("{\n");
    p.region_body(&mut out, &k.body, 1);
    out.push_str("}\n");
    out
}

struct Printer<'k> {
    k: &'k Kernel,
}

impl Printer<'_> {
    fn block_mapping(&self, out: &mut String, b: &BlockMapping) {
        let _ = write!(
            out,
            " block [{}] index ({})",
            join(&b.block_shape, ", "),
            join(&b.index_map.params, ", ")
        );
        if !b.index_map.insts.is_empty() {
            out.push_str(" {\n");
            self.region_body(out, &b.index_map, 3);
            out.push_str("    }");
        }
        let _ = write!(out, " -> ({})", join(&b.index_map.yields, ", "));
        if b.buffering == Buffering::Single {
            out.push_str(" single-buffered");
        }
    }

    fn region_body(&self, out: &mut String, r: &Region, depth: usize) {
        for inst in &r.insts {
            self.inst(out, inst, depth);
        }
    }

    fn types_of(&self, vs: &[ValueId]) -> String {
        let ts: Vec<String> = vs
            .iter()
            .map(|v| self.k.value_type(*v).to_string())
            .collect();
        ts.join(", ")
    }

    fn slices(&self, name: &str, slices: &[Slice]) -> String {
        let s: Vec<String> = slices
            .iter()
            .map(|s| match s {
                Slice::Full => ":".to_string(),
                Slice::Static { start, len } => format!("{start}:{}", start + len),
                Slice::Dynamic { start, len } => format!("{start}:+{len}"),
            })
            .collect();
        format!("{name}[{}]", s.join(", "))
    }

    fn window(&self, w: &RefWindow) -> String {
        self.slices(&self.k.operand(w.r).name, &w.slices)
    }

    fn sem(&self, s: &SemRef) -> String {
        let name = &self.k.operand(s.sem).name;
        if s.index.is_empty() {
            name.clone()
        } else {
            format!("{name}[{}]", join(&s.index, ", "))
        }
    }

    fn inst(&self, out: &mut String, inst: &Inst, depth: usize) {
        let pad = "  ".repeat(depth);
        out.push_str(&pad);
        if !inst.results.is_empty() {
            let _ = write!(out, "{} = ", join(&inst.results, ", "));
        }
        let name = |r: super::RefId| self.k.operand(r).name.as_str();
        let body = match &inst.op {
            Op::ProgramId { axis } | Op::NumPrograms { axis } => {
                format!("{} {axis}", inst.op.name())
            }
            Op::Constant { value, .. } => format!("constant {value}"),
            Op::Load { src, slices } => format!("load {}", self.slices(name(*src), slices)),
            Op::Store { dst, slices, value } => {
                format!("store {}, {value}", self.slices(name(*dst), slices))
            }
            Op::LoadScalar { src, indices } => {
                format!("load_scalar {}[{}]", name(*src), join(indices, ", "))
            }
            Op::StoreScalar {
                dst,
                indices,
                value,
            } => format!(
                "store_scalar {}[{}], {value}",
                name(*dst),
                join(indices, ", ")
            ),
            Op::Unary { x, .. } => format!("{} {x}", inst.op.name()),
            Op::Binary { lhs, rhs, .. } | Op::Compare { lhs, rhs, .. } => {
                format!("{} {lhs}, {rhs}", inst.op.name())
            }
            Op::Select {
                cond,
                on_true,
                on_false,
            } => format!("select {cond}, {on_true}, {on_false}"),
            Op::Cast { x, .. } | Op::Broadcast { x, .. } | Op::Reshape { x, .. } => {
                format!("{} {x}", inst.op.name())
            }
            Op::Repeat { x, times, axis } => format!("repeat {x} times {times} axis {axis}"),
            Op::Iota { dim, .. } => format!("iota dim {dim}"),
            Op::Reduce { x, axis, .. } => format!("{} {x} axis {axis}", inst.op.name()),
            Op::Dot {
                lhs,
                rhs,
                transpose_lhs,
                transpose_rhs,
            } => {
                let mut s = format!("dot {lhs}, {rhs}");
                match (transpose_lhs, transpose_rhs) {
                    (false, false) => {}
                    (true, false) => s.push_str(" {transpose_lhs}"),
                    (false, true) => s.push_str(" {transpose_rhs}"),
                    (true, true) => s.push_str(" {transpose_lhs, transpose_rhs}"),
                }
                s
            }
            Op::When {
                cond,
                then,
                otherwise,
            } => {
                let _ = writeln!(out, "when {cond} {{");
                self.region_body(out, then, depth + 1);
                if !otherwise.insts.is_empty() {
                    let _ = writeln!(out, "{pad}}} else {{");
                    self.region_body(out, otherwise, depth + 1);
                }
                let _ = writeln!(out, "{pad}}}");
                return;
            }
            Op::ForLoop { lo, hi, init, body } => {
                let _ = writeln!(
                    out,
                    "fori_loop {lo} to {hi} init({}) ({}) {{",
                    join(init, ", "),
                    join(&body.params, ", ")
                );
                self.region_body(out, body, depth + 1);
                let _ = writeln!(out, "{pad}  yield {}", join(&body.yields, ", "));
                let _ = writeln!(out, "{pad}}} : {}", self.types_of(&inst.results));
                return;
            }
            Op::DeviceId => "device_id".to_string(),
            Op::DmaStart {
                src,
                dst,
                sem,
                remote,
            } => {
                let mut s = format!(
                    "{} {} -> {}, {}",
                    inst.op.name(),
                    self.window(src),
                    self.window(dst),
                    self.sem(sem)
                );
                if let Some(r) = remote {
                    let _ = write!(s, " to device {} send {}", r.device, self.sem(&r.send_sem));
                }
                s
            }
            Op::DmaWait { src, dst, sem } => format!(
                "wait_copy {} -> {}, {}",
                self.window(src),
                self.window(dst),
                self.sem(sem)
            ),
            Op::SemSignal { sem, inc, device } => {
                let mut s = format!("semaphore_signal {}, {inc}", self.sem(sem));
                if let Some(d) = device {
                    let _ = write!(s, " to device {d}");
                }
                s
            }
            Op::SemWait { sem, value } => format!("semaphore_wait {}, {value}", self.sem(sem)),
            Op::SemRead { sem } => format!("semaphore_read {}", self.sem(sem)),
            Op::DebugPrint { format, args } => {
                format!("debug_print {format:?}({})", join(args, ", "))
            }
            Op::DebugCheck { cond, message } => format!("debug_check {cond}, {message:?}"),
            Op::Scoped { allocs, body } => {
                let names: Vec<&str> = allocs.iter().map(|r| name(*r)).collect();
                let _ = writeln!(out, "run_scoped ({}) {{", names.join(", "));
                self.region_body(out, body, depth + 1);
                if !body.yields.is_empty() {
                    let _ = writeln!(out, "{pad}  yield {}", join(&body.yields, ", "));
                }
                let _ = writeln!(out, "{pad}}}");
                return;
            }
        };
        out.push_str(&body);
        if !inst.results.is_empty() {
            let _ = write!(out, " : {}", self.types_of(&inst.results));
        }
        out.push('\n');
    }
}

//! The Mosaic rules of control flow: `when` as `scf.if` (with its `else` region) and loops as
//! `scf.for` over i32 bounds with their carried values.

use super::{results_prefix, value_type, Emitter, R};
use crate::ir::{Inst, Loc, Region, ValueId};

impl Emitter<'_> {
    /// `scf.if` with its regions.
    pub(super) fn when(
        &mut self,
        cond: &ValueId,
        then: &Region,
        otherwise: &Region,
        loc: Loc,
    ) -> R<()> {
        let c = self.v(*cond);
        self.open(&format!("scf.if {c} {{"));
        self.region(then)?;
        if !otherwise.insts.is_empty() {
            self.depth -= 1;
            self.open("} else {");
            self.region(otherwise)?;
        }
        self.close(Some(loc));
        Ok(())
    }

    /// `scf.for` with its carried values; binds the loop's results.
    pub(super) fn for_loop(
        &mut self,
        inst: &Inst,
        lo: &ValueId,
        hi: &ValueId,
        init: &[ValueId],
        body: &Region,
        loc: Loc,
    ) -> R<()> {
        let one = self.emit("arith.constant 1 : i32", loc);
        let (lo, hi) = (self.v(*lo), self.v(*hi));
        let iv = format!("%v{}", body.params[0].0);
        self.env.insert(body.params[0], iv.clone());
        let mut iter_args = Vec::new();
        let mut types = Vec::new();
        for (&p, &i) in body.params[1..].iter().zip(init) {
            let name = format!("%v{}", p.0);
            iter_args.push(format!("{name} = {}", self.v(i)));
            types.push(value_type(self.ty(i)));
            self.env.insert(p, name);
        }
        let results = results_prefix(inst);
        let carried = if init.is_empty() {
            String::new()
        } else {
            format!(
                " iter_args({}) -> ({})",
                iter_args.join(", "),
                types.join(", ")
            )
        };
        self.open(&format!(
            "{results}scf.for {iv} = {lo} to {hi} step {one}{carried} : i32 {{"
        ));
        self.region(body)?;
        if !body.yields.is_empty() {
            let ys: Vec<String> = body.yields.iter().map(|y| self.v(*y)).collect();
            self.line(
                &format!("scf.yield {} : {}", ys.join(", "), types.join(", ")),
                loc,
            );
        }
        self.close(Some(loc));
        self.bind_results(inst);
        Ok(())
    }
}

//! What Mosaic accepts of copies, checked when a kernel is instantiated under TPU rules.
//! Each rule is one libtpu was seen to enforce (`tests/memory_tpu_compile.rs` compiles a
//! kernel breaking each one and expects the compiler to refuse it):
//!
//! - DMAs move whole 128-lane tiles along a window's last dim: on either side of a copy (as
//!   started; a wait names the same windows) the
//!   last dim's offset must be a multiple of 128 (Mosaic proves it from the arithmetic that
//!   computes it: constants, products, sums, remainders) and its length the whole dim or a
//!   multiple of 128. Offsets and lengths along the other dims are free.
//! - A vector load or store at a run-time offset along a window's last dim needs that offset
//!   proven a multiple of 128 the same way (libtpu's `E2003`, "cannot statically prove that
//!   index in dimension 1 is a multiple of 128", for `x.at(&[all(), ds(j * 125, 125)])`).
//! - Mosaic waits a remote copy's send side differently from the arrival of a copy
//!   ([`crate::mosaic`]), so a DMA semaphore remote copies count their sends on may not also
//!   count arrivals.

use std::collections::HashMap;

use crate::error::{Problem, ProblemKind};
use crate::ir::{BinaryOp, Inst, Kernel, Literal, Op, RefId, RefWindow, Region, Slice, ValueId};
use crate::tpu_facts::SendSems;

/// The lanes of a vector register: the tile of a window's last dim.
const LANES: usize = 128;

/// Every copy of `k` that Mosaic would refuse, with its line and the fix.
pub(super) fn check(k: &Kernel) -> Vec<Problem> {
    let mut c = Copies {
        k,
        multiples: HashMap::new(),
        sends: SendSems::of(k),
        problems: Vec::new(),
    };
    c.region(&k.body);
    c.problems
}

struct Copies<'k> {
    k: &'k Kernel,
    /// The largest known divisor of each integer scalar (0: the value is 0).
    multiples: HashMap<ValueId, u64>,
    sends: SendSems,
    problems: Vec<Problem>,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Copies<'_> {
    fn multiple(&self, v: ValueId) -> u64 {
        self.multiples.get(&v).copied().unwrap_or(1)
    }

    /// What the arithmetic of `inst` says about the divisors of its result.
    fn learn(&mut self, inst: &Inst) {
        let [result] = inst.results.as_slice() else {
            return;
        };
        let m = match &inst.op {
            Op::Constant {
                value: Literal::Int(i),
                ty,
            } if ty.is_scalar() => i.unsigned_abs(),
            Op::Binary { op, lhs, rhs } => {
                let (a, b) = (self.multiple(*lhs), self.multiple(*rhs));
                match op {
                    BinaryOp::Mul => a.saturating_mul(b),
                    BinaryOp::Add
                    | BinaryOp::Sub
                    | BinaryOp::Rem
                    | BinaryOp::Max
                    | BinaryOp::Min => gcd(a, b),
                    _ => 1,
                }
            }
            Op::Select {
                on_true, on_false, ..
            } => gcd(self.multiple(*on_true), self.multiple(*on_false)),
            _ => return,
        };
        self.multiples.insert(*result, m);
    }

    fn region(&mut self, r: &Region) {
        for inst in &r.insts {
            self.learn(inst);
            match &inst.op {
                Op::Load { src: r, slices } => self.lane_offset(inst, *r, slices, "loaded"),
                Op::Store { dst: r, slices, .. } => self.lane_offset(inst, *r, slices, "stored"),
                _ => {}
            }
            if let Op::DmaStart {
                src,
                dst,
                sem,
                remote,
            } = &inst.op
            {
                self.window(inst, src);
                self.window(inst, dst);
                if self.sends.may_be_send(sem) {
                    let name = &self.k.operand(sem.sem).name;
                    let what = if remote.is_some() {
                        "receive"
                    } else {
                        "local copy"
                    };
                    self.problem(
                        inst,
                        format!(
                            "the {what} semaphore `{name}` may be one that remote copies \
                                 count their sends on; Mosaic waits sends and arrivals \
                                 differently, so give the sends DMA semaphores of their own"
                        ),
                    );
                }
            }
            for nested in inst.op.regions() {
                self.region(nested);
            }
        }
    }

    /// Checks the run-time offset along the last dim of a vector load or store (`how`:
    /// loaded, stored).
    fn lane_offset(&mut self, inst: &Inst, r: RefId, slices: &[Slice], how: &str) {
        let Some(&Slice::Dynamic { start, .. }) = slices.last() else {
            return;
        };
        if self.multiple(start) % LANES as u64 == 0 {
            return;
        }
        let name = self.k.operand(r).name.clone();
        self.problem(
            inst,
            format!(
                "`{name}` is {how} at a run-time offset along its last dim that Mosaic cannot \
                 prove a multiple of 128 (its 128-lane tiles); compute the offset as a \
                 multiple of 128 (`i * 128`), e.g. by choosing sizes whose shards span whole \
                 tiles"
            ),
        );
    }

    /// Checks the last dim of one window of a copy.
    fn window(&mut self, inst: &Inst, w: &RefWindow) {
        let o = self.k.operand(w.r);
        let (Some(slice), Some(&n)) = (w.slices.last(), o.array_shape.last()) else {
            return;
        };
        let name = o.name.clone();
        let (offset, len) = match *slice {
            Slice::Full => return,
            Slice::Static { start, len } => (start as u64, len),
            Slice::Dynamic { start, len } => (self.multiple(start), len),
        };
        if offset % LANES as u64 != 0 {
            let how = match slice {
                Slice::Static { start, .. } => format!("starts at {start}"),
                _ => "starts at an offset not known to be a multiple of 128".into(),
            };
            self.problem(
                inst,
                format!(
                    "the window of `{name}` {how} along its last dim; Mosaic copies whole \
                     128-lane tiles there, so start it at a multiple of 128 (computed as \
                     `i * 128`, or a constant)"
                ),
            );
        }
        if len != n && len % LANES != 0 {
            self.problem(
                inst,
                format!(
                    "the window of `{name}` is {len} wide of {n} along its last dim; Mosaic \
                     copies whole 128-lane tiles there, so copy all {n} or a multiple of 128"
                ),
            );
        }
    }

    /// Records a problem once: a helper the kernel traces twice (a closure called in two
    /// places) breaks a rule at the same line twice.
    fn problem(&mut self, inst: &Inst, message: String) {
        let subject = format!("`{}`", inst.op.name());
        let seen = self
            .problems
            .iter()
            .any(|p| p.loc == Some(inst.loc) && p.subject == subject && p.message == message);
        if !seen {
            self.problems.push(Problem {
                kind: ProblemKind::TpuOp,
                subject,
                message,
                loc: Some(inst.loc),
            });
        }
    }
}

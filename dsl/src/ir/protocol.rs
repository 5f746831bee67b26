//! The copy and semaphore protocol, checked when a kernel is instantiated, for what the
//! types of the tracing API cannot see: signals and waits across grid steps, loop iterations
//! and devices.
//!
//! Two checks, each naming the kernel lines involved:
//!
//! 1. **Pairing** (always): a semaphore that copies or signals increment is waited somewhere,
//!    and a semaphore that is waited is incremented somewhere.
//! 2. **Counting** (when every `when` condition, loop bound, semaphore index and target device
//!    around the semaphore operations is computed from grid indices, loop indices, device ids
//!    and constants): the kernel is run abstractly on every device of its mesh over its whole
//!    grid, counting each semaphore. A wait on a semaphore only this device increments must
//!    find its count already started (else it waits forever), and every semaphore must end
//!    the kernel (and every `run_scoped` region its own) at zero. The same run follows the
//!    copies this device started and has not waited: a load or store of a copy's destination,
//!    or a store into its source, before the wait that ends it is reported with both lines
//!    (what a copy descriptor started in one step and waited in another leaves to this
//!    check). Copies other devices start into this one's buffers are left to the
//!    interpreter's vector clocks: the abstract run takes the devices one after the other,
//!    which is not an order they keep. Counts that depend on data (a condition read from
//!    SMEM, say) are left to the interpreter.

use std::collections::{BTreeSet, HashMap};

use super::{
    device_count, Inst, Kernel, Literal, Loc, MemorySpace, Op, RefId, RefWindow, Region, SemKind,
    SemRef, ValueId,
};
use crate::error::{Problem, ProblemKind};
use crate::ir::{BinaryOp, CmpOp, DType, UnaryOp};

/// Most instructions the counting check evaluates before leaving the kernel to the
/// interpreter.
const MAX_EVALUATED: usize = 1 << 22;

/// Every protocol problem of `k` found before it runs.
pub fn check_protocol(k: &Kernel) -> Vec<Problem> {
    let mut uses = Uses::default();
    uses.region(&k.body);
    if uses.inc.is_empty() && uses.dec.is_empty() {
        return Vec::new();
    }
    let mut problems = uses.pairing(k);
    if problems.is_empty() {
        problems.extend(count(k, &uses));
    }
    problems
}

/// Where each semaphore operand is incremented and decremented.
#[derive(Default)]
struct Uses {
    inc: HashMap<RefId, Vec<Loc>>,
    dec: HashMap<RefId, Vec<Loc>>,
    /// Semaphores incremented by other devices (remote copies and signals).
    remote: BTreeSet<RefId>,
}

impl Uses {
    fn region(&mut self, r: &Region) {
        for inst in &r.insts {
            let loc = inst.loc;
            match &inst.op {
                Op::DmaStart { sem, remote, .. } => {
                    self.inc.entry(sem.sem).or_default().push(loc);
                    if let Some(rd) = remote {
                        self.remote.insert(sem.sem);
                        self.inc.entry(rd.send_sem.sem).or_default().push(loc);
                    }
                }
                Op::SemSignal { sem, device, .. } => {
                    self.inc.entry(sem.sem).or_default().push(loc);
                    if device.is_some() {
                        self.remote.insert(sem.sem);
                    }
                }
                Op::DmaWait { sem, .. } | Op::SemWait { sem, .. } => {
                    self.dec.entry(sem.sem).or_default().push(loc);
                }
                _ => {}
            }
            for nested in inst.op.regions() {
                self.region(nested);
            }
        }
    }

    fn pairing(&self, k: &Kernel) -> Vec<Problem> {
        let mut problems = Vec::new();
        let name = |r: RefId| k.operand(r).name.clone();
        let kind = |r: RefId| k.operand(r).memory.semaphore();
        let mut refs: Vec<&RefId> = self.inc.keys().chain(self.dec.keys()).collect();
        refs.sort();
        refs.dedup();
        for &r in refs {
            match (self.inc.get(&r), self.dec.get(&r)) {
                (Some(incs), None) => {
                    let message = if kind(r) == Some(SemKind::Dma) {
                        format!(
                            "this copy signals `{}` but nothing ever waits on `{}`: every copy \
                             must be waited (`.wait()` on its token, or `wait_copy`)",
                            name(r),
                            name(r)
                        )
                    } else {
                        format!(
                            "this signals `{}` but nothing ever waits on it, so it ends the \
                             kernel non-zero: every signal must be consumed by a `wait`",
                            name(r)
                        )
                    };
                    problems.push(problem(incs[0], "semaphore", message));
                }
                (None, Some(decs)) => {
                    let what = if kind(r) == Some(SemKind::Dma) {
                        "no copy signals it"
                    } else {
                        "nothing signals it"
                    };
                    problems.push(problem(
                        decs[0],
                        "semaphore",
                        format!(
                            "this waits on `{}` but {what}, so the wait never returns (deadlock)",
                            name(r)
                        ),
                    ));
                }
                _ => {}
            }
        }
        problems
    }
}

fn problem(loc: Loc, subject: &str, message: String) -> Problem {
    Problem {
        kind: ProblemKind::Protocol,
        subject: subject.into(),
        message,
        loc: Some(loc),
    }
}

/// A scalar the abstract run knows (ints and bools as i64), or not.
type Known = Option<i64>;

/// The value of a pure scalar op on known operands (`None`: unknown, or not a scalar op).
pub(crate) fn eval_scalar(k: &Kernel, op: &Op, get: &dyn Fn(ValueId) -> Known) -> Known {
    let scalar = |v: ValueId| k.value_type(v).is_scalar();
    let wrap = |x: i64, dtype: DType| match dtype {
        DType::I32 => Some(x as i32 as i64),
        DType::I8 => Some(x as i8 as i64),
        DType::Bool => Some(i64::from(x != 0)),
        _ => None,
    };
    match op {
        Op::Constant { value, ty } if ty.is_scalar() => match value {
            Literal::Int(i) if ty.dtype.is_int() => Some(*i),
            Literal::Bool(b) => Some(i64::from(*b)),
            _ => None,
        },
        Op::Binary { op, lhs, rhs } if scalar(*lhs) => {
            let dtype = k.value_type(*lhs).dtype;
            if dtype.is_float() {
                return None;
            }
            let (a, b) = (get(*lhs)?, get(*rhs)?);
            let r = match op {
                BinaryOp::Add => a.checked_add(b)?,
                BinaryOp::Sub => a.checked_sub(b)?,
                BinaryOp::Mul => a.checked_mul(b)?,
                BinaryOp::Div => a.checked_div(b)?,
                BinaryOp::Rem => a.checked_rem(b)?,
                BinaryOp::Max => a.max(b),
                BinaryOp::Min => a.min(b),
                BinaryOp::And => a & b,
                BinaryOp::Or => a | b,
                BinaryOp::Xor => a ^ b,
            };
            wrap(r, dtype)
        }
        Op::Compare { op, lhs, rhs } if scalar(*lhs) => {
            if k.value_type(*lhs).dtype.is_float() {
                return None;
            }
            let (a, b) = (get(*lhs)?, get(*rhs)?);
            Some(i64::from(match op {
                CmpOp::Eq => a == b,
                CmpOp::Ne => a != b,
                CmpOp::Lt => a < b,
                CmpOp::Le => a <= b,
                CmpOp::Gt => a > b,
                CmpOp::Ge => a >= b,
            }))
        }
        Op::Select {
            cond,
            on_true,
            on_false,
        } if scalar(*cond) => {
            if get(*cond)? != 0 {
                get(*on_true)
            } else {
                get(*on_false)
            }
        }
        Op::Cast { x, to } if scalar(*x) && !k.value_type(*x).dtype.is_float() => {
            wrap(get(*x)?, *to)
        }
        Op::Unary { op, x } if scalar(*x) && !k.value_type(*x).dtype.is_float() => {
            let a = get(*x)?;
            let dtype = k.value_type(*x).dtype;
            match op {
                UnaryOp::Neg => wrap(a.checked_neg()?, dtype),
                UnaryOp::Abs => wrap(a.abs(), dtype),
                UnaryOp::Not => Some(i64::from(a == 0)),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The bytes a copy between these windows moves (the destination window's elements).
pub(crate) fn window_bytes(k: &Kernel, w: &RefWindow) -> i64 {
    let o = k.operand(w.r);
    let shape = o.view_shape();
    let elems: usize = w
        .slices
        .iter()
        .zip(&shape)
        .map(|(s, &n)| s.len(n))
        .product();
    (elems * o.dtype.size_bytes()) as i64
}

/// Why the counting run stopped early (the kernel is left to the interpreter).
struct Dynamic;

/// One semaphore on one device.
type SemKey = (usize, RefId, usize);

/// A window of a ref whose every offset is known: `(start, len)` per dim of its view.
type Extent = Vec<(i64, i64)>;

/// A side of a copy this device started and has not waited: the window it writes (its
/// destination) or reads (its source), and the semaphore whose wait ends it.
struct InFlight {
    sem: SemKey,
    bytes: i64,
    r: RefId,
    extent: Extent,
    writes: bool,
    started: Loc,
}

struct Counter<'k> {
    k: &'k Kernel,
    uses: &'k Uses,
    env: Vec<Known>,
    step: Vec<usize>,
    device: usize,
    counts: HashMap<SemKey, i64>,
    /// This device's copies in flight, in start order.
    in_flight: Vec<InFlight>,
    /// Whether this device has waited on the barrier semaphore yet.
    met_at_barrier: bool,
    evaluated: usize,
    problems: Vec<Problem>,
}

fn count(k: &Kernel, uses: &Uses) -> Vec<Problem> {
    let mut c = Counter {
        k,
        uses,
        env: vec![None; k.types.len()],
        step: Vec::new(),
        device: 0,
        counts: HashMap::new(),
        in_flight: Vec::new(),
        met_at_barrier: false,
        evaluated: 0,
        problems: Vec::new(),
    };
    let n = device_count(&k.mesh);
    let steps: Vec<Vec<usize>> = grid_steps(&k.grid);
    for d in 0..n {
        c.device = d;
        c.in_flight.clear();
        c.met_at_barrier = false;
        for step in &steps {
            c.step = step.clone();
            if c.region(&k.body).is_err() {
                return std::mem::take(&mut c.problems);
            }
            if !c.problems.is_empty() {
                return c.problems;
            }
        }
    }
    c.exit_check(None, "the kernel");
    c.problems
}

fn grid_steps(grid: &[usize]) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new()];
    for &n in grid {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                (0..n).map(move |i| {
                    let mut p = prefix.clone();
                    p.push(i);
                    p
                })
            })
            .collect();
    }
    out
}

/// Whether any semaphore op is in `r` (or nested in it).
fn has_sem_ops(r: &Region) -> bool {
    r.insts.iter().any(|i| {
        matches!(
            i.op,
            Op::DmaStart { .. } | Op::DmaWait { .. } | Op::SemSignal { .. } | Op::SemWait { .. }
        ) || i.op.regions().into_iter().any(has_sem_ops)
    })
}

impl Counter<'_> {
    fn get(&self, v: ValueId) -> Known {
        self.env[v.index()]
    }

    fn flat(&self, sem: &SemRef) -> Result<usize, Dynamic> {
        let shape = &self.k.operand(sem.sem).array_shape;
        let mut flat = 0;
        for (&i, &n) in sem.index.iter().zip(shape) {
            let i = self.get(i).ok_or(Dynamic)?;
            if i < 0 || i as usize >= n {
                // Out of bounds: the interpreter reports it with the grid step.
                return Err(Dynamic);
            }
            flat = flat * n + i as usize;
        }
        Ok(flat)
    }

    fn device_value(&self, v: ValueId) -> Result<usize, Dynamic> {
        let d = self.get(v).ok_or(Dynamic)?;
        let n = device_count(&self.k.mesh) as i64;
        if (0..n).contains(&d) {
            Ok(d as usize)
        } else {
            Err(Dynamic)
        }
    }

    fn add(&mut self, device: usize, sem: &SemRef, amount: i64) -> Result<(), Dynamic> {
        let key = (device, sem.sem, self.flat(sem)?);
        *self.counts.entry(key).or_default() += amount;
        Ok(())
    }

    fn take(&mut self, sem: &SemRef, amount: i64, inst: &Inst) -> Result<(), Dynamic> {
        let key = (self.device, sem.sem, self.flat(sem)?);
        let count = self.counts.entry(key).or_default();
        let local_only = !self.uses.remote.contains(&sem.sem)
            && self.k.operand(sem.sem).memory != MemorySpace::Semaphore(SemKind::Barrier);
        if local_only && *count < amount {
            let have = *count;
            let sem_name = self.describe(sem, key.2);
            let unit = self.unit(sem.sem);
            self.problems.push(problem(
                inst.loc,
                &format!("`{}`", inst.op.name()),
                format!(
                    "deadlock: this waits for {amount} {unit} on {sem_name} at grid step {:?}{} \
                     but only {have} can have arrived by then (nothing later in this device's \
                     order can satisfy it)",
                    self.step,
                    self.on_device(),
                ),
            ));
            return Err(Dynamic);
        }
        *count -= amount;
        Ok(())
    }

    fn on_device(&self) -> String {
        if device_count(&self.k.mesh) > 1 {
            format!(" on device {}", self.device)
        } else {
            String::new()
        }
    }

    fn unit(&self, r: RefId) -> &'static str {
        if self.k.operand(r).memory == MemorySpace::Semaphore(SemKind::Dma) {
            "bytes"
        } else {
            "signals"
        }
    }

    fn describe(&self, sem: &SemRef, flat: usize) -> String {
        let o = self.k.operand(sem.sem);
        if o.array_shape.is_empty() {
            format!("`{}`", o.name)
        } else {
            let mut idx = vec![0; o.array_shape.len()];
            let mut rest = flat;
            for (d, &n) in o.array_shape.iter().enumerate().rev() {
                idx[d] = rest % n;
                rest /= n;
            }
            format!("`{}`{idx:?}", o.name)
        }
    }

    /// Reports the semaphores (all, or `only` those) whose count is not zero at the end of
    /// `what`.
    fn exit_check(&mut self, only: Option<&[RefId]>, what: &str) {
        let mut left: Vec<(SemKey, i64)> = self
            .counts
            .iter()
            .filter(|(key, &v)| v != 0 && only.is_none_or(|o| o.contains(&key.1)))
            .map(|(&key, &v)| (key, v))
            .collect();
        left.sort();
        for ((device, r, flat), v) in left {
            let sem = SemRef {
                sem: r,
                index: Vec::new(),
            };
            let name = self.describe(&sem, flat);
            let lines = |locs: Option<&Vec<Loc>>| {
                let set: BTreeSet<u32> = locs.into_iter().flatten().map(|l| l.line).collect();
                set.iter()
                    .map(u32::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let on = if device_count(&self.k.mesh) > 1 {
                format!(" on device {device}")
            } else {
                String::new()
            };
            let unit = self.unit(r);
            let (verb, fix) = if v > 0 {
                (
                    format!("{v} {unit} more arrive than are waited for"),
                    "every copy must be waited and every signal consumed",
                )
            } else {
                (
                    format!("waits take {} {unit} more than arrive", -v),
                    "a wait without its copy or signal never returns",
                )
            };
            let loc = self
                .uses
                .inc
                .get(&r)
                .and_then(|l| l.first())
                .copied()
                .unwrap_or(self.k.operand(r).loc);
            self.problems.push(problem(
                loc,
                "semaphore",
                format!(
                    "{name}{on} is not zero at the end of {what}: {verb} (incremented at lines \
                     [{}], waited at lines [{}]); {fix}",
                    lines(self.uses.inc.get(&r)),
                    lines(self.uses.dec.get(&r)),
                ),
            ));
        }
    }

    fn region(&mut self, r: &Region) -> Result<(), Dynamic> {
        for inst in &r.insts {
            self.inst(inst)?;
            if !self.problems.is_empty() {
                return Err(Dynamic);
            }
        }
        Ok(())
    }

    fn inst(&mut self, inst: &Inst) -> Result<(), Dynamic> {
        self.evaluated += 1;
        if self.evaluated > MAX_EVALUATED {
            return Err(Dynamic);
        }
        let k = self.k;
        match &inst.op {
            Op::ProgramId { axis } => self.set(inst, Some(self.step[*axis] as i64)),
            Op::NumPrograms { axis } => self.set(inst, Some(k.grid[*axis] as i64)),
            Op::DeviceId => self.set(inst, Some(self.device as i64)),
            Op::When {
                cond,
                then,
                otherwise,
            } => match self.get(*cond) {
                Some(0) => self.region(otherwise)?,
                Some(_) => self.region(then)?,
                None if has_sem_ops(then) || has_sem_ops(otherwise) => return Err(Dynamic),
                None => {}
            },
            Op::ForLoop { lo, hi, init, body } => {
                let (lo, hi) = match (self.get(*lo), self.get(*hi)) {
                    (Some(l), Some(h)) => (l, h),
                    _ if has_sem_ops(body) => return Err(Dynamic),
                    _ => {
                        for &v in &inst.results {
                            self.env[v.index()] = None;
                        }
                        return Ok(());
                    }
                };
                let mut carry: Vec<Known> = init.iter().map(|&v| self.get(v)).collect();
                for i in lo..hi {
                    self.env[body.params[0].index()] = Some(i);
                    for (&p, &c) in body.params[1..].iter().zip(&carry) {
                        self.env[p.index()] = c;
                    }
                    self.region(body)?;
                    carry = body.yields.iter().map(|&y| self.get(y)).collect();
                }
                for (&v, c) in inst.results.iter().zip(carry) {
                    self.env[v.index()] = c;
                }
            }
            Op::Scoped { allocs, body } => {
                self.counts
                    .retain(|key, _| !(key.0 == self.device && allocs.contains(&key.1)));
                self.region(body)?;
                self.exit_check(Some(allocs), "its `run_scoped` region");
                for (&v, &y) in inst.results.iter().zip(&body.yields) {
                    self.env[v.index()] = self.get(y);
                }
            }
            Op::DmaStart {
                src,
                dst,
                sem,
                remote,
            } => {
                let bytes = window_bytes(k, dst);
                // The side whose wait on this device ends the copy's hold on `src` (and, for
                // a local copy, on `dst`).
                let local_sem = match remote {
                    None => {
                        self.add(self.device, sem, bytes)?;
                        sem
                    }
                    Some(rd) => {
                        let target = self.device_value(rd.device)?;
                        self.before_barrier(target, inst);
                        self.add(target, sem, bytes)?;
                        self.add(self.device, &rd.send_sem, bytes)?;
                        &rd.send_sem
                    }
                };
                let key = (self.device, local_sem.sem, self.flat(local_sem)?);
                let sides = [(src, false), (dst, true)];
                let sides = if remote.is_some() {
                    &sides[..1]
                } else {
                    &sides[..]
                };
                for &(w, writes) in sides {
                    if let Some(extent) = self.extent(w.r, &w.slices) {
                        self.in_flight.push(InFlight {
                            sem: key,
                            bytes,
                            r: w.r,
                            extent,
                            writes,
                            started: inst.loc,
                        });
                    }
                }
            }
            Op::DmaWait { dst, sem, .. } => {
                let bytes = window_bytes(k, dst);
                self.take(sem, bytes, inst)?;
                self.landed(sem, bytes)?;
            }
            Op::Load { src, slices } => {
                self.access(*src, slices, false, inst);
                self.set(inst, None);
            }
            Op::Store { dst, slices, .. } => self.access(*dst, slices, true, inst),
            Op::SemSignal { sem, inc, device } => {
                let inc = self.get(*inc).ok_or(Dynamic)?;
                let target = match device {
                    Some(d) => self.device_value(*d)?,
                    None => self.device,
                };
                if !self.is_barrier(sem) {
                    self.before_barrier(target, inst);
                }
                self.add(target, sem, inc)?;
            }
            Op::SemWait { sem, value } => {
                let n = self.get(*value).ok_or(Dynamic)?;
                self.take(sem, n, inst)?;
                self.met_at_barrier |= self.is_barrier(sem);
            }
            op => {
                let value = {
                    let env = &self.env;
                    eval_scalar(k, op, &|v| env[v.index()])
                };
                for &r in &inst.results {
                    self.env[r.index()] = value;
                }
            }
        }
        Ok(())
    }

    /// The window `slices` of `r` when every offset is known.
    fn extent(&self, r: RefId, slices: &[super::Slice]) -> Option<Extent> {
        let shape = self.k.operand(r).view_shape();
        slices
            .iter()
            .zip(&shape)
            .map(|(s, &n)| match *s {
                super::Slice::Full => Some((0, n as i64)),
                super::Slice::Static { start, len } => Some((start as i64, len as i64)),
                super::Slice::Dynamic { start, len } => Some((self.get(start)?, len as i64)),
            })
            .collect()
    }

    /// A wait of `bytes` on `sem` ends the oldest copies in flight on it, both sides.
    fn landed(&mut self, sem: &SemRef, mut bytes: i64) -> Result<(), Dynamic> {
        let key = (self.device, sem.sem, self.flat(sem)?);
        while bytes > 0 {
            let Some(i) = self.in_flight.iter().position(|f| f.sem == key) else {
                break;
            };
            let copy_bytes = self.in_flight[i].bytes;
            let started = self.in_flight[i].started;
            self.in_flight
                .retain(|f| !(f.sem == key && f.started == started && f.bytes == copy_bytes));
            bytes -= copy_bytes;
        }
        Ok(())
    }

    /// Reports a load or store (`writes`) of `r` that touches a copy in flight: any access to
    /// its destination, a store into its source.
    fn access(&mut self, r: RefId, slices: &[super::Slice], writes: bool, inst: &Inst) {
        let Some(extent) = self.extent(r, slices) else {
            return;
        };
        let overlaps = |a: &Extent, b: &Extent| {
            a.iter()
                .zip(b)
                .all(|(&(s0, l0), &(s1, l1))| s0 < s1 + l1 && s1 < s0 + l0)
        };
        let Some(f) = self
            .in_flight
            .iter()
            .find(|f| f.r == r && (f.writes || writes) && overlaps(&f.extent, &extent))
        else {
            return;
        };
        let name = &self.k.operand(r).name;
        let (access, side) = match (writes, f.writes) {
            (false, _) => ("reads", "into"),
            (true, true) => ("writes", "into"),
            (true, false) => ("writes", "out of"),
        };
        let sem = SemRef {
            sem: f.sem.1,
            index: Vec::new(),
        };
        let sem_name = self.describe(&sem, f.sem.2);
        self.problems.push(problem(
            inst.loc,
            &format!("`{}`", inst.op.name()),
            format!(
                "this {access} `{name}` at grid step {:?}{} while the copy {side} it started at \
                 line {} may still be in flight (it ends at a wait on {sem_name}); wait the copy \
                 before touching its destination, or writing its source",
                self.step,
                self.on_device(),
                f.started.line,
            ),
        ));
    }

    fn is_barrier(&self, sem: &SemRef) -> bool {
        self.k.operand(sem.sem).memory == MemorySpace::Semaphore(SemKind::Barrier)
    }

    /// Reports a remote copy or signal into another device before this device has waited at
    /// the barrier: nothing tells it that the target has entered the kernel, so its buffers
    /// and semaphores may not exist yet (the barrier semaphore is the one that does).
    fn before_barrier(&mut self, target: usize, inst: &Inst) {
        if self.met_at_barrier || target == self.device {
            return;
        }
        // Once per kernel: the first such op is where the barrier goes.
        self.met_at_barrier = true;
        self.problems.push(problem(
            inst.loc,
            &format!("`{}`", inst.op.name()),
            format!(
                "writes into device {target} (at grid step {:?}{}) before this device has met \
                 the devices it writes into at the barrier, so device {target} may not have \
                 entered the kernel yet; before this line, signal the barrier semaphore to \
                 each of them (`devices.barrier().signal_to(1, ..)`) and wait for their \
                 signals (`.wait(n)`), as Pallas kernels do with `get_barrier_semaphore`",
                self.step,
                self.on_device(),
            ),
        ));
    }

    fn set(&mut self, inst: &Inst, v: Known) {
        self.env[inst.results[0].index()] = v;
    }
}

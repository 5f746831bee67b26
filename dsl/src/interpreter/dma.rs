//! The interpreter's model of kernels that move their own data: memory that copies read and
//! write, semaphores, asynchronous copies, and several devices running one kernel.
//!
//! **Devices.** A kernel on a mesh of N devices runs as N instances of the kernel, one per
//! device, each on its own thread, interleaved by a scheduler that lets exactly one run at a
//! time and switches at every copy and semaphore operation (round robin, or in an order drawn
//! from [`InterpretOptions::schedule_seed`](super::InterpretOptions)). A wait that cannot be
//! satisfied blocks its device; when no device can run and no copy is left in flight, the
//! kernel is deadlocked and the error names every blocked wait.
//!
//! **Copies.** A started copy is in flight until it lands: at the wait that needs it (the
//! default), or at a random later operation ([`InterpretOptions::copy_landing`](super::InterpretOptions::copy_landing)). Landing
//! reads the source and writes the destination then, and adds the copy's bytes to its
//! semaphores (the destination device's, and the sender's for a remote copy).
//!
//! **Races: vector clocks.** Every device and every copy is an actor with a vector clock
//! (happens-before as in Pallas' interpret mode and race detectors like FastTrack). A device
//! ticks its own entry when it starts a copy or signals; a copy's clock is its issuer's at
//! the start plus its own entry; a signal or a landing copy hands its clock to the semaphore,
//! and a wait joins the clocks of the arrivals it takes. Every element of a buffer that copies
//! touch remembers its last write and its reads (actor, time, line); an access that is not
//! ordered after a conflicting one (at least one write) is a race, reported with both lines:
//! a read of a copy's destination before its wait, a write of its source before its wait, two
//! copies into the same elements, a remote copy landing in a device that is not known to have
//! entered the kernel (each device "writes" its buffers when it enters; a barrier orders that).
//! At the end every semaphore must be zero: a copy never waited or a signal never consumed is
//! named by its line.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Condvar, Mutex, MutexGuard};

use super::tensor::{for_each_index, strides, Tensor};
use crate::error::{KernelError, Problem, ProblemKind};
use crate::ir::{Kernel, Loc, MemorySpace, Op, OperandRole, RefId, Region, SemKind};

/// A box of elements of a ref: starts and sizes per dim of its array.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Window {
    pub starts: Vec<usize>,
    pub sizes: Vec<usize>,
}

impl Window {
    fn overlaps(&self, other: &Window) -> bool {
        self.starts
            .iter()
            .zip(&self.sizes)
            .zip(other.starts.iter().zip(&other.sizes))
            .all(|((&a, &la), (&b, &lb))| a < b + lb && b < a + la)
    }

    fn elements(&self) -> usize {
        self.sizes.iter().product()
    }

    /// Calls `f` with the flat index (in an array of `shape`) of every element.
    fn for_each(&self, shape: &[usize], mut f: impl FnMut(usize)) {
        let st = strides(shape);
        for_each_index(&self.sizes, |_, idx| {
            let flat = idx
                .iter()
                .zip(&self.starts)
                .zip(&st)
                .map(|((i, s), m)| (i + s) * m)
                .sum();
            f(flat)
        });
    }
}

/// A semaphore on a device: (device, operand, flat index).
pub(crate) type SemKey = (usize, RefId, usize);

/// A copy as a device starts it.
#[derive(Debug, Clone)]
pub(crate) struct CopyStart {
    pub src: (RefId, Window),
    pub dst: (RefId, Window),
    /// The device that holds `dst` (the issuer, for a local copy).
    pub target: usize,
    pub sem: SemKey,
    pub send: Option<SemKey>,
    pub loc: Loc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AccessKind {
    Enter,
    Load,
    Store,
    CopyRead,
    CopyWrite,
}

/// One access of an element: who (actor), when (the actor's own clock entry), where.
#[derive(Debug, Clone, Copy)]
struct Access {
    actor: usize,
    time: u32,
    loc: Loc,
    kind: AccessKind,
}

#[derive(Debug, Clone, Default)]
struct Cell {
    write: Option<Access>,
    reads: Vec<Access>,
}

#[derive(Debug, Default)]
struct SemCell {
    count: i64,
    /// Increments not yet taken by a wait: amount, the clock they carry, their line.
    arrivals: VecDeque<(i64, Vec<u32>, Loc)>,
}

#[derive(Debug)]
struct Dma {
    issuer: usize,
    start: CopyStart,
    actor: usize,
    /// For random landing: the tick after which it lands.
    deadline: Option<u64>,
    bytes: i64,
}

#[derive(Debug, Clone)]
enum Status {
    Running,
    Blocked { sem: SemKey, amount: i64, loc: Loc },
    Done,
}

pub(crate) struct State {
    turn: usize,
    status: Vec<Status>,
    failure: Option<KernelError>,
    /// Per device: the arrays and buffers copies touch (HBM operands, `Vmem` scratch).
    mem: Vec<HashMap<RefId, Tensor>>,
    /// Per device: the access history of every element of writable shared refs.
    shadow: Vec<HashMap<RefId, Vec<Cell>>>,
    sems: HashMap<SemKey, SemCell>,
    /// Vector clocks: devices first, then one per copy.
    clocks: Vec<Vec<u32>>,
    dmas: Vec<Dma>,
    /// Copies in flight (indices into `dmas`), in start order.
    pending: Vec<usize>,
    landing: Option<fastrand::Rng>,
    schedule: Option<fastrand::Rng>,
    tick: u64,
}

/// All devices of one run: their shared memory, semaphores, copies and the scheduler.
pub(crate) struct World<'k> {
    k: &'k Kernel,
    n: usize,
    /// Refs whose storage lives here (HBM operands, `Vmem` scratch that copies touch).
    pub shared: HashSet<RefId>,
    /// Shared refs that can be written (shadowed for races).
    writable: HashSet<RefId>,
    state: Mutex<State>,
    cv: Condvar,
}

/// Returned by a device that stops because another one failed (the failure is recorded).
fn aborted(k: &Kernel) -> KernelError {
    KernelError::new(&k.name, Vec::new())
}

impl<'k> World<'k> {
    pub fn new(k: &'k Kernel, landing: Option<u64>, schedule: Option<u64>) -> Self {
        let n = k.num_devices();
        let mut shared = HashSet::new();
        collect_copy_refs(&k.body, &mut shared);
        for (i, o) in k.operands.iter().enumerate() {
            if o.memory == MemorySpace::Any {
                shared.insert(RefId(i as u32));
            }
        }
        let writable = shared
            .iter()
            .copied()
            .filter(|r| k.operand(*r).role != OperandRole::Input)
            .collect();
        let clocks = (0..n)
            .map(|d| {
                let mut c = vec![0; n];
                c[d] = 1;
                c
            })
            .collect();
        World {
            k,
            n,
            shared,
            writable,
            state: Mutex::new(State {
                turn: 0,
                status: vec![Status::Running; n],
                failure: None,
                mem: vec![HashMap::new(); n],
                shadow: vec![HashMap::new(); n],
                sems: HashMap::new(),
                clocks,
                dmas: Vec::new(),
                pending: Vec::new(),
                landing: landing.map(fastrand::Rng::with_seed),
                schedule: schedule.map(fastrand::Rng::with_seed),
                tick: 0,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn error(&self, loc: Option<Loc>, subject: impl Into<String>, message: String) -> KernelError {
        KernelError::new(
            &self.k.name,
            vec![Problem {
                kind: ProblemKind::Protocol,
                subject: subject.into(),
                message,
                loc,
            }],
        )
    }

    fn device_note(&self, d: usize) -> String {
        if self.n > 1 {
            format!(" on device {d}")
        } else {
            String::new()
        }
    }

    /// Records `e` as the run's failure (the first one wins) and wakes every device.
    fn fail(&self, mut g: MutexGuard<'_, State>, e: KernelError) -> KernelError {
        if g.failure.is_none() {
            g.failure = Some(e);
        }
        self.cv.notify_all();
        aborted(self.k)
    }

    /// The number of devices.
    pub fn devices(&self) -> usize {
        self.n
    }

    /// Records a device's error as the run's failure (unless it only stopped because another
    /// device failed) and wakes every device.
    pub fn record(&self, e: KernelError) -> KernelError {
        if e.problems.is_empty() {
            return e;
        }
        self.fail(self.lock(), e)
    }

    /// The recorded failure, if any device failed.
    pub fn failure(&self) -> Option<KernelError> {
        self.lock().failure.clone()
    }

    /// Waits until it is device `d`'s turn.
    fn wait_turn<'g>(
        &'g self,
        mut g: MutexGuard<'g, State>,
        d: usize,
    ) -> Result<MutexGuard<'g, State>, KernelError> {
        while g.turn != d && g.failure.is_none() {
            g = self.cv.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        if g.failure.is_some() {
            return Err(aborted(self.k));
        }
        Ok(g)
    }

    /// Allocates device `d`'s shared arrays and buffers before any device runs; each counts
    /// as written by its device when it enters the kernel.
    pub fn allocate(&self, d: usize, buffers: Vec<(RefId, Tensor)>) {
        let mut g = self.lock();
        for (r, t) in buffers {
            self.fresh(&mut g, d, r, t);
        }
    }

    /// Device `d` starts: it waits for its turn.
    pub fn enter(&self, d: usize) -> Result<(), KernelError> {
        self.wait_turn(self.lock(), d).map(|_| ())
    }

    /// Puts a fresh buffer (kernel entry, or a scoped allocation) in place, written by `d`.
    fn fresh(&self, g: &mut State, d: usize, r: RefId, t: Tensor) {
        if self.writable.contains(&r) {
            let time = g.clocks[d][d];
            let enter = Access {
                actor: d,
                time,
                loc: self.k.operand(r).loc,
                kind: AccessKind::Enter,
            };
            let cells = vec![
                Cell {
                    write: Some(enter),
                    reads: Vec::new(),
                };
                t.len()
            ];
            g.shadow[d].insert(r, cells);
        }
        g.mem[d].insert(r, t);
    }

    /// A scoped allocation on entry to its region: fresh buffers, semaphores at zero.
    pub fn scope_enter(&self, d: usize, buffers: Vec<(RefId, Tensor)>, sems: &[RefId]) {
        let mut g = self.lock();
        for (r, t) in buffers {
            self.fresh(&mut g, d, r, t);
        }
        g.sems
            .retain(|key, _| !(key.0 == d && sems.contains(&key.1)));
    }

    /// At the end of a scoped region: no copy in flight touches its allocations, and its
    /// semaphores are back at zero.
    pub fn scope_exit(&self, d: usize, allocs: &[RefId], loc: Loc) -> Result<(), KernelError> {
        let g = self.lock();
        for &i in &g.pending {
            let dma = &g.dmas[i];
            let s = &dma.start;
            let touches = (dma.issuer == d && allocs.contains(&s.src.0))
                || (s.target == d && allocs.contains(&s.dst.0))
                || (s.sem.0 == d && allocs.contains(&s.sem.1));
            if touches {
                let e = self.error(
                    Some(s.loc),
                    "`run_scoped`",
                    format!(
                        "the copy started here{} is still in flight when its `run_scoped` \
                         region (line {}) ends, but it uses the region's allocations; wait it \
                         inside the region",
                        self.device_note(dma.issuer),
                        loc.line
                    ),
                );
                return Err(self.fail(g, e));
            }
        }
        let mut left: Vec<(&SemKey, &SemCell)> = g
            .sems
            .iter()
            .filter(|(key, cell)| key.0 == d && allocs.contains(&key.1) && cell.count != 0)
            .collect();
        left.sort_by_key(|(key, _)| **key);
        if left.is_empty() {
            let mut g = g;
            for r in allocs {
                g.mem[d].remove(r);
                g.shadow[d].remove(r);
            }
            return Ok(());
        }
        if let Some((key, cell)) = left.first() {
            let message = self.nonzero(
                key,
                cell,
                &format!("its `run_scoped` region (line {})", loc.line),
            );
            let at = cell.arrivals.front().map(|a| a.2).unwrap_or(loc);
            let e = self.error(Some(at), "semaphore", message);
            return Err(self.fail(g, e));
        }
        Ok(())
    }

    fn sem_name(&self, key: &SemKey) -> String {
        let o = self.k.operand(key.1);
        if o.array_shape.is_empty() {
            format!("`{}`", o.name)
        } else {
            let mut idx = vec![0; o.array_shape.len()];
            let mut rest = key.2;
            for (i, &n) in o.array_shape.iter().enumerate().rev() {
                idx[i] = rest % n;
                rest /= n;
            }
            format!("`{}`{idx:?}", o.name)
        }
    }

    fn unit(&self, r: RefId) -> &'static str {
        match self.k.operand(r).memory {
            MemorySpace::Semaphore(SemKind::Dma) => "bytes",
            _ => "signals",
        }
    }

    fn nonzero(&self, key: &SemKey, cell: &SemCell, what: &str) -> String {
        let mut lines: Vec<u32> = cell.arrivals.iter().map(|a| a.2.line).collect();
        lines.sort_unstable();
        lines.dedup();
        let lines: Vec<String> = lines.iter().map(u32::to_string).collect();
        let fix = if self.k.operand(key.1).memory == MemorySpace::Semaphore(SemKind::Dma) {
            "copies that landed were never waited: wait every copy once"
        } else {
            "signals were never consumed: every signal needs its wait"
        };
        format!(
            "{}{} is {} {} at the end of {what}, not zero: from lines [{}]; {fix}",
            self.sem_name(key),
            self.device_note(key.0),
            cell.count,
            self.unit(key.1),
            lines.join(", ")
        )
    }

    /// The shared state for the next copy or semaphore operation: one tick later, with the
    /// copies due by then landed.
    fn operation(&self) -> Result<MutexGuard<'_, State>, KernelError> {
        let mut g = self.lock();
        if g.failure.is_some() {
            return Err(aborted(self.k));
        }
        g.tick += 1;
        match self.land_due(&mut g) {
            Ok(()) => Ok(g),
            Err(e) => Err(self.fail(g, e)),
        }
    }

    /// Runs one operation of device `d` on the shared state, then lets another device run.
    pub fn sync<R>(
        &self,
        d: usize,
        f: impl FnOnce(&World<'k>, &mut State) -> Result<R, KernelError>,
    ) -> Result<R, KernelError> {
        let mut g = self.operation()?;
        match f(self, &mut g) {
            Ok(r) => {
                self.yield_turn(g, d)?;
                Ok(r)
            }
            Err(e) => Err(self.fail(g, e)),
        }
    }

    /// Accesses shared memory without a scheduling point (loads and stores of `Vmem`).
    pub fn access<R>(
        &self,
        f: impl FnOnce(&World<'k>, &mut State) -> Result<R, KernelError>,
    ) -> Result<R, KernelError> {
        let mut g = self.lock();
        match f(self, &mut g) {
            Ok(r) => Ok(r),
            Err(e) => Err(self.fail(g, e)),
        }
    }

    /// Whether device `o` can make progress now (counting copies in flight toward it).
    fn runnable(&self, g: &State, o: usize) -> bool {
        match &g.status[o] {
            Status::Running => true,
            Status::Done => false,
            Status::Blocked { sem, amount, .. } => {
                let have = g.sems.get(sem).map_or(0, |c| c.count);
                let coming: i64 = g
                    .pending
                    .iter()
                    .map(|&i| &g.dmas[i])
                    .filter(|dma| dma.start.sem == *sem || dma.start.send == Some(*sem))
                    .map(|dma| dma.bytes)
                    .sum();
                have + coming >= *amount
            }
        }
    }

    /// The device to run after `d` (which may be `d` itself when it can still run).
    fn pick(&self, g: &mut State, d: usize) -> Option<usize> {
        let candidates: Vec<usize> = (1..=self.n)
            .map(|i| (d + i) % self.n)
            .filter(|&o| self.runnable(g, o))
            .collect();
        if candidates.is_empty() {
            return None;
        }
        Some(match &mut g.schedule {
            Some(rng) => candidates[rng.usize(..candidates.len())],
            None => candidates[0],
        })
    }

    /// Hands the turn from `d` to another device (or keeps it) and waits until `d` runs
    /// again.
    fn yield_turn(&self, mut g: MutexGuard<'_, State>, d: usize) -> Result<(), KernelError> {
        if self.n == 1 {
            return Ok(());
        }
        match self.pick(&mut g, d) {
            Some(next) if next != d => {
                g.turn = next;
                self.cv.notify_all();
                self.wait_turn(g, d).map(|_| ())
            }
            _ => Ok(()),
        }
    }

    /// Device `d` has run its whole grid: the turn passes on; a deadlock among the others is
    /// found here when nothing else can run.
    pub fn finish(&self, d: usize) -> Result<(), KernelError> {
        let mut g = self.lock();
        g.status[d] = Status::Done;
        loop {
            if let Some(next) = self.pick(&mut g, d) {
                g.turn = next;
                self.cv.notify_all();
                return Ok(());
            }
            if g.status.iter().all(|s| matches!(s, Status::Done)) {
                self.cv.notify_all();
                return Ok(());
            }
            if g.pending.is_empty() {
                let e = self.deadlock(&g);
                return Err(self.fail(g, e));
            }
            if let Err(e) = self.land_all(&mut g) {
                return Err(self.fail(g, e));
            }
        }
    }

    fn deadlock(&self, g: &State) -> KernelError {
        let mut waits = Vec::new();
        let mut first = None;
        for (o, s) in g.status.iter().enumerate() {
            if let Status::Blocked { sem, amount, loc } = s {
                first.get_or_insert(*loc);
                let have = g.sems.get(sem).map_or(0, |c| c.count);
                waits.push(format!(
                    "{}line {} waits on {}{} for {amount} {} (it has {have})",
                    if self.n > 1 {
                        format!("device {o} at ")
                    } else {
                        String::new()
                    },
                    loc.line,
                    self.sem_name(sem),
                    if sem.0 != o {
                        format!(" of device {}", sem.0)
                    } else {
                        String::new()
                    },
                    self.unit(sem.1)
                ));
            }
        }
        let done: Vec<String> = g
            .status
            .iter()
            .enumerate()
            .filter(|(_, s)| matches!(s, Status::Done))
            .map(|(o, _)| o.to_string())
            .collect();
        let finished = if done.is_empty() || self.n == 1 {
            String::new()
        } else {
            format!(" (devices [{}] have finished)", done.join(", "))
        };
        self.error(
            first,
            "wait",
            format!(
                "deadlock: {}; no copy is in flight and no running device can signal them{finished}",
                waits.join("; ")
            ),
        )
    }

    /// Device `d` waits until semaphore `sem` counts `amount`, then takes it (joining the
    /// clocks of what it takes). Copies in flight toward it land first.
    pub fn wait(&self, d: usize, sem: SemKey, amount: i64, loc: Loc) -> Result<(), KernelError> {
        let mut g = self.operation()?;
        loop {
            if let Err(e) = self.land_toward(&mut g, sem, amount) {
                return Err(self.fail(g, e));
            }
            if g.sems.get(&sem).map_or(0, |c| c.count) >= amount {
                g.status[d] = Status::Running;
                take(&mut g, d, sem, amount);
                return self.yield_turn(g, d);
            }
            g.status[d] = Status::Blocked { sem, amount, loc };
            match self.pick(&mut g, d) {
                Some(next) if next != d => {
                    g.turn = next;
                    self.cv.notify_all();
                    g = self.wait_turn(g, d)?;
                }
                Some(_) => {}
                None if !g.pending.is_empty() => {
                    if let Err(e) = self.land_all(&mut g) {
                        return Err(self.fail(g, e));
                    }
                }
                None => {
                    let e = self.deadlock(&g);
                    return Err(self.fail(g, e));
                }
            }
        }
    }

    /// Lands the copies whose random landing time has come.
    fn land_due(&self, g: &mut State) -> Result<(), KernelError> {
        let tick = g.tick;
        while let Some(pos) = g
            .pending
            .iter()
            .position(|&i| g.dmas[i].deadline.is_some_and(|t| t <= tick))
        {
            let i = g.pending.remove(pos);
            self.land(g, i)?;
        }
        Ok(())
    }

    /// Lands copies in flight that signal `sem`, oldest first, until it counts `amount`.
    fn land_toward(&self, g: &mut State, sem: SemKey, amount: i64) -> Result<(), KernelError> {
        while g.sems.get(&sem).map_or(0, |c| c.count) < amount {
            let Some(pos) = g.pending.iter().position(|&i| {
                let s = &g.dmas[i].start;
                s.sem == sem || s.send == Some(sem)
            }) else {
                return Ok(());
            };
            let i = g.pending.remove(pos);
            self.land(g, i)?;
        }
        Ok(())
    }

    fn land_all(&self, g: &mut State) -> Result<(), KernelError> {
        while !g.pending.is_empty() {
            let i = g.pending.remove(0);
            self.land(g, i)?;
        }
        Ok(())
    }

    /// Device `d` starts a copy; it lands later.
    pub fn start_copy(&self, g: &mut State, d: usize, start: CopyStart) -> Result<(), KernelError> {
        let k = self.k;
        // Two copies in flight into overlapping elements: reported at the start, clearly.
        for &i in &g.pending {
            let other = &g.dmas[i];
            if other.start.target == start.target
                && other.start.dst.0 == start.dst.0
                && other.start.dst.1.overlaps(&start.dst.1)
            {
                return Err(self.error(
                    Some(start.loc),
                    format!(
                        "`{}`",
                        if start.target == d {
                            "async_copy"
                        } else {
                            "remote_copy"
                        }
                    ),
                    format!(
                        "this copy writes elements of `{}`{} that the copy started at line {}{} \
                         is still writing (it has not been waited); two copies in flight must \
                         not write overlapping memory: wait the first one before starting this",
                        k.operand(start.dst.0).name,
                        self.device_note(start.target),
                        other.start.loc.line,
                        self.device_note(other.issuer)
                    ),
                ));
            }
        }
        let actor = g.clocks.len();
        let mut clock = g.clocks[d].clone();
        clock.resize(actor + 1, 0);
        clock[actor] = 1;
        g.clocks.push(clock);
        g.clocks[d][d] += 1;
        let bytes = (start.dst.1.elements() * k.operand(start.dst.0).dtype.size_bytes()) as i64;
        let deadline = match &mut g.landing {
            Some(rng) => Some(g.tick + rng.u64(0..16)),
            None => None,
        };
        g.dmas.push(Dma {
            issuer: d,
            start,
            actor,
            deadline,
            bytes,
        });
        g.pending.push(g.dmas.len() - 1);
        Ok(())
    }

    /// A copy lands: it reads its source, writes its destination and signals.
    fn land(&self, g: &mut State, i: usize) -> Result<(), KernelError> {
        let (issuer, start, actor, bytes) = {
            let dma = &g.dmas[i];
            (dma.issuer, dma.start.clone(), dma.actor, dma.bytes)
        };
        let time = 1;
        let (src_ref, src_win) = &start.src;
        let (dst_ref, dst_win) = &start.dst;
        let clock = g.clocks[actor].clone();
        self.check(
            g,
            issuer,
            *src_ref,
            src_win,
            &clock,
            Access {
                actor,
                time,
                loc: start.loc,
                kind: AccessKind::CopyRead,
            },
        )?;
        self.check(
            g,
            start.target,
            *dst_ref,
            dst_win,
            &clock,
            Access {
                actor,
                time,
                loc: start.loc,
                kind: AccessKind::CopyWrite,
            },
        )?;
        let missing = |dev: usize, r: RefId| {
            self.error(
                Some(start.loc),
                "`remote_copy`",
                format!(
                    "the copy started here{} lands while `{}` does not exist on device {dev}: it \
                     belongs to a `run_scoped` region that device is not in",
                    self.device_note(issuer),
                    self.k.operand(r).name
                ),
            )
        };
        let Some(src) = g.mem[issuer].get(src_ref) else {
            return Err(missing(issuer, *src_ref));
        };
        let data = src
            .window(&src_win.starts, &src_win.sizes)
            .reshape(&dst_win.sizes);
        let Some(dst) = g.mem[start.target].get_mut(dst_ref) else {
            return Err(missing(start.target, *dst_ref));
        };
        dst.write_window(&dst_win.starts, &data);
        arrive(g, start.sem, bytes, clock.clone(), start.loc);
        if let Some(send) = start.send {
            arrive(g, send, bytes, clock, start.loc);
        }
        Ok(())
    }

    /// Device `d` signals `sem` (on any device) by `amount`.
    pub fn signal(&self, g: &mut State, d: usize, sem: SemKey, amount: i64, loc: Loc) {
        let clock = g.clocks[d].clone();
        g.clocks[d][d] += 1;
        arrive(g, sem, amount, clock, loc);
    }

    pub fn read_sem(&self, g: &State, sem: SemKey) -> i64 {
        g.sems.get(&sem).map_or(0, |c| c.count)
    }

    /// Records an access of device `d` (at its current time) to a window of shared ref `r`.
    fn device_access(
        &self,
        g: &mut State,
        d: usize,
        r: RefId,
        w: &Window,
        loc: Loc,
        kind: AccessKind,
    ) -> Result<(), KernelError> {
        let clock = g.clocks[d].clone();
        let access = Access {
            actor: d,
            time: clock[d],
            loc,
            kind,
        };
        self.check(g, d, r, w, &clock, access)
    }

    /// Device `d` loads a window of shared ref `r`.
    pub fn load(
        &self,
        g: &mut State,
        d: usize,
        r: RefId,
        w: &Window,
        loc: Loc,
    ) -> Result<Tensor, KernelError> {
        self.device_access(g, d, r, w, loc, AccessKind::Load)?;
        Ok(g.mem[d][&r].window(&w.starts, &w.sizes))
    }

    /// Device `d` stores `value` into a window of shared ref `r`.
    pub fn store(
        &self,
        g: &mut State,
        d: usize,
        r: RefId,
        w: &Window,
        value: &Tensor,
        loc: Loc,
    ) -> Result<(), KernelError> {
        self.device_access(g, d, r, w, loc, AccessKind::Store)?;
        g.mem[d]
            .get_mut(&r)
            .expect("shared refs are allocated")
            .write_window(&w.starts, value);
        Ok(())
    }

    /// Records `access` of the elements of `w` of ref `r` on device `dev`, reporting the
    /// first conflicting access that does not happen before it.
    fn check(
        &self,
        g: &mut State,
        dev: usize,
        r: RefId,
        w: &Window,
        clock: &[u32],
        access: Access,
    ) -> Result<(), KernelError> {
        let Some(cells) = g.shadow[dev].get_mut(&r) else {
            return Ok(());
        };
        let shape = &self.k.operand(r).array_shape;
        let before = |a: &Access| clock.get(a.actor).copied().unwrap_or(0) >= a.time;
        let writes = matches!(access.kind, AccessKind::Store | AccessKind::CopyWrite);
        let mut conflict = None;
        w.for_each(shape, |flat| {
            if conflict.is_some() {
                return;
            }
            let cell = &mut cells[flat];
            if let Some(prev) = cell.write {
                if prev.actor != access.actor && !before(&prev) {
                    conflict = Some((prev, flat));
                    return;
                }
            }
            if writes {
                if let Some(prev) = cell
                    .reads
                    .iter()
                    .find(|a| a.actor != access.actor && !before(a))
                {
                    conflict = Some((*prev, flat));
                    return;
                }
                cell.write = Some(access);
                cell.reads.clear();
            } else {
                cell.reads.retain(|a| a.actor != access.actor);
                cell.reads.push(access);
            }
        });
        match conflict {
            None => Ok(()),
            Some((prev, flat)) => Err(self.race(g, dev, r, flat, prev, access)),
        }
    }

    fn describe(&self, g: &State, a: &Access) -> String {
        let who = |actor: usize| {
            if actor < self.n {
                self.device_note(actor)
            } else {
                self.device_note(g.dmas[actor - self.n].issuer)
            }
        };
        match a.kind {
            AccessKind::Enter => format!("the kernel's entry{}", who(a.actor)),
            AccessKind::Load => format!("the load at line {}{}", a.loc.line, who(a.actor)),
            AccessKind::Store => format!("the store at line {}{}", a.loc.line, who(a.actor)),
            AccessKind::CopyRead => format!(
                "the copy started at line {}{} (reading it)",
                a.loc.line,
                who(a.actor)
            ),
            AccessKind::CopyWrite => format!(
                "the copy started at line {}{} (writing it)",
                a.loc.line,
                who(a.actor)
            ),
        }
    }

    fn race(
        &self,
        g: &State,
        dev: usize,
        r: RefId,
        flat: usize,
        prev: Access,
        now: Access,
    ) -> KernelError {
        let o = self.k.operand(r);
        let mut idx = vec![0; o.array_shape.len()];
        let mut rest = flat;
        for (i, &n) in o.array_shape.iter().enumerate().rev() {
            idx[i] = rest % n;
            rest /= n;
        }
        use AccessKind::*;
        let hint = match (prev.kind, now.kind) {
            (Enter, CopyWrite) => {
                "a remote copy may land only in a device known to have entered the kernel: \
                 signal the barrier semaphore (`devices.barrier()`) to the neighbours and wait \
                 for theirs before the first remote copy"
            }
            (CopyWrite, Load | Store) | (Load | Store, CopyWrite) => {
                "wait the copy before touching its destination"
            }
            (CopyRead, Store) | (Store, CopyRead) => "wait the copy before overwriting its source",
            (CopyWrite, CopyWrite) | (CopyRead, CopyWrite) | (CopyWrite, CopyRead) => {
                "wait the first copy before starting the second"
            }
            _ => "order them with a semaphore signal and wait",
        };
        let subject = match now.kind {
            Load => "`load`",
            Store => "`store`",
            Enter | CopyRead | CopyWrite => "copy",
        };
        self.error(
            Some(now.loc),
            subject,
            format!(
                "race on `{}`{idx:?}{}: {} and {} are not ordered by any wait; {hint}",
                o.name,
                self.device_note(dev),
                self.describe(g, &now),
                self.describe(g, &prev),
            ),
        )
    }

    /// At the end of the run: copies never waited and semaphores not back at zero.
    pub fn exit_check(&self) -> Result<(), KernelError> {
        let mut g = self.lock();
        if let Some(f) = g.failure.clone() {
            return Err(f);
        }
        self.land_all(&mut g)?;
        let mut left: Vec<(&SemKey, &SemCell)> =
            g.sems.iter().filter(|(_, c)| c.count != 0).collect();
        left.sort_by_key(|(key, _)| **key);
        let problems: Vec<Problem> = left
            .iter()
            .map(|(key, cell)| Problem {
                kind: ProblemKind::Protocol,
                subject: "semaphore".into(),
                message: self.nonzero(key, cell, "the kernel"),
                loc: cell.arrivals.front().map(|a| a.2),
            })
            .collect();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(KernelError::new(&self.k.name, problems))
        }
    }

    /// Takes the shared arrays of device `d` (its HBM outputs, at the end).
    pub fn take_array(&self, d: usize, r: RefId) -> Tensor {
        self.lock().mem[d]
            .remove(&r)
            .expect("shared refs are allocated")
    }
}

fn arrive(g: &mut State, sem: SemKey, amount: i64, clock: Vec<u32>, loc: Loc) {
    let cell = g.sems.entry(sem).or_default();
    cell.count += amount;
    cell.arrivals.push_back((amount, clock, loc));
}

/// Device `d` takes `amount` from `sem`, joining the clocks of the arrivals it consumes.
fn take(g: &mut State, d: usize, sem: SemKey, amount: i64) {
    let cell = g.sems.entry(sem).or_default();
    cell.count -= amount;
    let mut need = amount;
    let mut joined: Vec<Vec<u32>> = Vec::new();
    while need > 0 {
        let Some(front) = cell.arrivals.front_mut() else {
            break;
        };
        joined.push(front.1.clone());
        if front.0 <= need {
            need -= front.0;
            cell.arrivals.pop_front();
        } else {
            front.0 -= need;
            need = 0;
        }
    }
    let mine = &mut g.clocks[d];
    for c in joined {
        if mine.len() < c.len() {
            mine.resize(c.len(), 0);
        }
        for (m, v) in mine.iter_mut().zip(c) {
            *m = (*m).max(v);
        }
    }
}

/// The refs copies read or write anywhere in `r`.
fn collect_copy_refs(r: &Region, out: &mut HashSet<RefId>) {
    for inst in &r.insts {
        if let Op::DmaStart { src, dst, .. } | Op::DmaWait { src, dst, .. } = &inst.op {
            out.insert(src.r);
            out.insert(dst.r);
        }
        for nested in inst.op.regions() {
            collect_copy_refs(nested, out);
        }
    }
}

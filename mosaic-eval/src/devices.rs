//! Several devices running one kernel: one thread per device, taking turns.
//!
//! One device runs at a time. A device hands the turn to the next live device (round
//! robin) at every memory op (DMA start and wait, semaphore signal, wait and read), so the
//! devices interleave at the points where they can observe each other. What a device sends
//! to another (a remote DMA's data and semaphore increment, a remote signal) waits in the
//! target's inbox until the target runs again. A device blocked at a wait hands the turn on;
//! when every live device has been offered the turn since anything last progressed, nothing
//! can change any more: a deadlock, reported with every blocked wait.

use std::sync::{Condvar, Mutex, MutexGuard};

use crate::exec::Tensor;
use crate::{EvalError, KernelFailure};

/// One semaphore: a buffer and the flat index of the semaphore in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SemAt {
    pub buf: usize,
    pub flat: usize,
}

/// What one device sends another.
#[derive(Debug)]
pub(crate) enum Msg {
    /// A remote DMA landing: `data` (shaped as the window in the buffer's rank) at `starts`
    /// of buffer `buf`, then `bytes` added to `sem`.
    Write {
        buf: usize,
        starts: Vec<usize>,
        data: Tensor,
        sem: SemAt,
        bytes: i64,
        from: usize,
        loc: String,
    },
    /// A remote signal.
    Signal {
        sem: SemAt,
        inc: i64,
        from: usize,
        loc: String,
    },
}

impl Msg {
    fn describe(&self) -> String {
        match self {
            Msg::Write { from, loc, .. } => format!("a remote DMA from device {from} at {loc}"),
            Msg::Signal { from, loc, .. } => format!("a remote signal from device {from} at {loc}"),
        }
    }
}

struct State {
    /// The device whose turn it is.
    turn: usize,
    live: Vec<bool>,
    /// The wait each device is blocked at, if any.
    blocked: Vec<Option<String>>,
    inbox: Vec<Vec<Msg>>,
    /// Turns offered to blocked devices since anything last progressed.
    stalled: usize,
    /// The first error: every device stops.
    failed: Option<EvalError>,
}

/// The devices of one run.
pub(crate) struct World {
    state: Mutex<State>,
    turn: Condvar,
    barrier: Option<usize>,
}

/// The error a device returns when another device failed first.
fn stopped() -> EvalError {
    KernelFailure::StoppedByAnotherDevice.into()
}

impl World {
    /// `n` devices; device 0 runs first. `barrier` is the buffer index of each device's
    /// barrier semaphore.
    pub fn new(n: usize, barrier: Option<usize>) -> World {
        World {
            state: Mutex::new(State {
                turn: 0,
                live: vec![true; n],
                blocked: vec![None; n],
                inbox: (0..n).map(|_| Vec::new()).collect(),
                stalled: 0,
                failed: None,
            }),
            turn: Condvar::new(),
            barrier,
        }
    }

    pub fn barrier_buffer(&self) -> Option<usize> {
        self.barrier
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for device `d`'s turn; returns its inbox.
    pub fn enter(&self, d: usize) -> Result<Vec<Msg>, EvalError> {
        let mut s = self.lock();
        while s.turn != d && s.failed.is_none() {
            s = self.turn.wait(s).unwrap_or_else(|e| e.into_inner());
        }
        if s.failed.is_some() {
            return Err(stopped());
        }
        Ok(std::mem::take(&mut s.inbox[d]))
    }

    /// Hands the turn from `d` to the next live device.
    fn hand_on(&self, s: &mut State, d: usize) {
        let n = s.live.len();
        if let Some(next) = (1..=n).map(|i| (d + i) % n).find(|&i| s.live[i]) {
            s.turn = next;
        }
        self.turn.notify_all();
    }

    /// Device `d` lets the others run, and gets its turn and its inbox back.
    pub fn pass(&self, d: usize, _loc: &str) -> Result<Vec<Msg>, EvalError> {
        {
            let mut s = self.lock();
            self.hand_on(&mut s, d);
        }
        self.enter(d)
    }

    /// Device `d` did something another device may observe.
    pub fn progress(&self, d: usize) {
        let mut s = self.lock();
        s.stalled = 0;
        s.blocked[d] = None;
    }

    /// Device `d` is blocked at `wait`: it lets the others run; fails with a deadlock when
    /// no device can progress.
    pub fn stall(&self, d: usize, wait: &str) -> Result<Vec<Msg>, EvalError> {
        {
            let mut s = self.lock();
            s.blocked[d] = Some(wait.to_string());
            s.stalled += 1;
            let live = s.live.iter().filter(|l| **l).count();
            if s.stalled > live {
                let waits: Vec<String> = s
                    .blocked
                    .iter()
                    .enumerate()
                    .filter_map(|(i, w)| w.as_ref().map(|w| format!("device {i} at {w}")))
                    .collect();
                let e = EvalError::from(KernelFailure::Deadlock { blocked: waits });
                s.failed = Some(e.clone());
                self.turn.notify_all();
                return Err(e);
            }
            self.hand_on(&mut s, d);
        }
        self.enter(d)
    }

    /// Queues `m` for device `to`.
    pub fn send(&self, to: i64, m: Msg, loc: &str) -> Result<(), EvalError> {
        let mut s = self.lock();
        let n = s.live.len();
        let Some(to) = usize::try_from(to).ok().filter(|&t| t < n) else {
            return Err(EvalError::Run {
                loc: loc.to_string(),
                message: format!("device id {to} is not one of the {n} devices"),
            });
        };
        if !s.live[to] {
            return Err(EvalError::Run {
                loc: loc.to_string(),
                message: format!("{} reaches device {to} after it finished", m.describe()),
            });
        }
        s.inbox[to].push(m);
        Ok(())
    }

    /// Device `d` finished (or failed with `error`): it hands the turn on for good.
    pub fn leave(&self, d: usize, error: Option<EvalError>) {
        let mut s = self.lock();
        s.live[d] = false;
        s.blocked[d] = None;
        s.stalled = 0;
        if let Some(e) = error {
            if s.failed.is_none() {
                s.failed = Some(e);
            }
        }
        self.hand_on(&mut s, d);
    }

    /// Messages still queued for device `d` after it finished, described.
    pub fn undelivered(&self, d: usize) -> Vec<String> {
        self.lock().inbox[d].iter().map(Msg::describe).collect()
    }

    /// The first error of the run, if any.
    pub fn failure(&self) -> Option<EvalError> {
        self.lock().failed.clone()
    }
}

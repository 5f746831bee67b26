//! The semantics of memory, semaphore and device ops.
//!
//! A DMA reads its source and writes its destination when it starts, and adds its bytes to
//! its target semaphore (and, for a remote DMA, to its source semaphore); a wait takes the
//! bytes of its window from its semaphore, or blocks. A kernel whose copies are race-free
//! (which the interpreter checks) computes the same numbers whenever its copies land. On
//! several devices (`crate::devices`) a remote DMA's data and semaphore increment, and a
//! remote signal, are delivered to the target device as a message it applies the next time
//! it runs; the devices take turns at every memory op.

use std::collections::HashMap;
use std::rc::Rc;

use super::{fail, Data, Flow, Machine, Tensor, Val, R};
use crate::devices::{Msg, SemAt, World};
use crate::parse::{Elem, MemOp, Op};

/// This device among `world`'s devices.
#[derive(Clone, Copy)]
pub(crate) struct Device<'w> {
    pub id: usize,
    pub world: &'w World,
}

/// A window of a buffer: `starts` and `sizes` in the buffer's rank, `shape` the window's
/// own shape (its sizes with some unit dims squeezed).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct View {
    pub buf: usize,
    pub starts: Vec<usize>,
    pub sizes: Vec<usize>,
    pub shape: Vec<usize>,
}

impl View {
    fn whole(buf: usize, shape: &[usize]) -> View {
        View {
            buf,
            starts: vec![0; shape.len()],
            sizes: shape.to_vec(),
            shape: shape.to_vec(),
        }
    }

    fn len(&self) -> usize {
        self.sizes.iter().product()
    }
}

impl Machine<'_> {
    /// The window a memref value names.
    fn view(&self, env: &HashMap<String, Val>, name: &str, loc: &str) -> R<View> {
        match env.get(name) {
            Some(Val::Ref(b)) => Ok(View::whole(*b, &self.buffers[*b].shape)),
            Some(Val::View(v)) => Ok((**v).clone()),
            _ => Err(fail(loc, format!("{name} is not a memref"))),
        }
    }

    fn scalar(&self, env: &HashMap<String, Val>, name: &str, loc: &str) -> R<i64> {
        match env.get(name) {
            Some(Val::T(t)) => t
                .int()
                .ok_or_else(|| fail(loc, format!("{name} is not an integer scalar"))),
            _ => Err(fail(loc, format!("{name} is not a defined scalar"))),
        }
    }

    /// One semaphore: a rank-0 window of a semaphore buffer.
    fn sem(&self, env: &HashMap<String, Val>, name: &str, loc: &str) -> R<SemAt> {
        let v = self.view(env, name, loc)?;
        let buf = &self.buffers[v.buf];
        if !matches!(buf.elem, Elem::DmaSem | Elem::Sem) {
            return Err(fail(loc, format!("{name} is not a semaphore")));
        }
        if v.len() != 1 {
            return Err(fail(loc, format!("{name} is not one semaphore")));
        }
        let flat = super::strides(&buf.shape)
            .iter()
            .zip(&v.starts)
            .map(|(s, i)| s * i)
            .sum();
        Ok(SemAt { buf: v.buf, flat })
    }

    fn count(&mut self, s: SemAt) -> &mut i64 {
        match &mut self.buffers[s.buf].data {
            Data::I(v) => &mut v[s.flat],
            _ => unreachable!("semaphore buffers hold integers"),
        }
    }

    /// Applies a message from another device.
    pub(crate) fn apply(&mut self, m: Msg) {
        match m {
            Msg::Write {
                buf,
                starts,
                data,
                sem,
                bytes,
                ..
            } => {
                self.buffers[buf].write_window(&starts, &data);
                *self.count(sem) += bytes;
            }
            Msg::Signal { sem, inc, .. } => *self.count(sem) += inc,
        }
    }

    /// Lets the other devices run (a no-op on one device), then applies what they sent.
    fn take_turns(&mut self, loc: &str) -> R<()> {
        if let Some(d) = self.device {
            for m in d.world.pass(d.id, loc)? {
                self.apply(m);
            }
        }
        Ok(())
    }

    /// Waits until semaphore `s` counts at least `n`, then takes `n`.
    fn wait(&mut self, s: SemAt, n: i64, what: &str, loc: &str) -> R<()> {
        self.take_turns(loc)?;
        loop {
            if *self.count(s) >= n {
                *self.count(s) -= n;
                if let Some(d) = self.device {
                    d.world.progress(d.id);
                }
                return Ok(());
            }
            let Some(d) = self.device else {
                return Err(fail(
                    loc,
                    format!(
                        "deadlock: {what} waits for {n} but its semaphore counts {} and \
                         nothing else runs",
                        *self.count(s)
                    ),
                ));
            };
            for m in d
                .world
                .stall(d.id, &format!("{loc}: {what} waits for {n}"))?
            {
                self.apply(m);
            }
        }
    }

    pub(super) fn mem_op(&mut self, m: &MemOp, op: &Op, env: &mut HashMap<String, Val>) -> R<Flow> {
        let loc = op.loc.as_str();
        let result = |env: &mut HashMap<String, Val>, v: Val| -> R<Flow> {
            match op.results.as_slice() {
                [r] => {
                    env.insert(r.clone(), v);
                    Ok(Flow::Next)
                }
                _ => Err(fail(loc, "expected one result")),
            }
        };
        match m {
            MemOp::DeviceId => {
                let id = self.device.map_or(0, |d| d.id) as i64;
                result(env, Val::T(Rc::new(Tensor::scalar_int(Elem::I32, id))))
            }
            MemOp::SemBarrier => {
                let b = match self.device {
                    Some(d) => d.world.barrier_buffer(),
                    None => None,
                }
                .ok_or_else(|| {
                    fail(
                        loc,
                        "tpu.sem_barrier outside a run on several devices (the barrier \
                         semaphore is shared by the devices of a collective)",
                    )
                })?;
                result(env, Val::Ref(b))
            }
            MemOp::Slice {
                mem,
                offsets,
                shape,
            } => {
                let v = self.view(env, mem, loc)?;
                if v.shape.len() != v.sizes.len() || offsets.len() != v.shape.len() {
                    return Err(fail(loc, "tpu.memref_slice of a squeezed window"));
                }
                let mut starts = Vec::with_capacity(shape.len());
                for (d, o) in offsets.iter().enumerate() {
                    let o = self.scalar(env, o, loc)?;
                    if o < 0 || o as usize + shape[d] > v.sizes[d] {
                        return Err(fail(
                            loc,
                            format!(
                                "tpu.memref_slice: dim {d} takes {}..{} of {}",
                                o,
                                o + shape[d] as i64,
                                v.sizes[d]
                            ),
                        ));
                    }
                    starts.push(v.starts[d] + o as usize);
                }
                let view = View {
                    buf: v.buf,
                    starts,
                    sizes: shape.clone(),
                    shape: shape.clone(),
                };
                result(env, Val::View(Rc::new(view)))
            }
            MemOp::Squeeze { mem, shape } => {
                let v = self.view(env, mem, loc)?;
                let kept: Vec<usize> = v.shape.iter().copied().filter(|&d| d != 1).collect();
                let to: Vec<usize> = shape.iter().copied().filter(|&d| d != 1).collect();
                if kept != to || shape.len() > v.shape.len() {
                    return Err(fail(
                        loc,
                        format!(
                            "tpu.memref_squeeze: {:?} to {shape:?} is not a squeeze",
                            v.shape
                        ),
                    ));
                }
                result(
                    env,
                    Val::View(Rc::new(View {
                        shape: shape.clone(),
                        ..v
                    })),
                )
            }
            MemOp::EnqueueDma {
                source,
                target,
                source_sem,
                target_sem,
                device,
            } => {
                let (s, t) = (self.view(env, source, loc)?, self.view(env, target, loc)?);
                let (sb, tb) = (&self.buffers[s.buf], &self.buffers[t.buf]);
                if s.shape != t.shape || sb.elem != tb.elem {
                    return Err(fail(
                        loc,
                        format!(
                            "tpu.enqueue_dma: source {:?} ({:?}) and target {:?} ({:?}) differ",
                            s.shape, sb.elem, t.shape, tb.elem
                        ),
                    ));
                }
                let bytes = (s.len() * sb.elem.bytes()) as i64;
                let data = Tensor {
                    shape: t.sizes.clone(),
                    ..sb.window(&s.starts, &s.sizes)
                };
                let recv = self.sem(env, target_sem, loc)?;
                self.take_turns(loc)?;
                match (source_sem, device) {
                    (Some(send), Some(dev)) => {
                        let send = self.sem(env, send, loc)?;
                        let to = self.scalar(env, dev, loc)?;
                        let d = self.device.ok_or_else(|| {
                            fail(loc, "a remote DMA outside a run on several devices")
                        })?;
                        *self.count(send) += bytes;
                        let msg = Msg::Write {
                            buf: t.buf,
                            starts: t.starts,
                            data,
                            sem: recv,
                            bytes,
                            from: d.id,
                            loc: loc.to_string(),
                        };
                        if to == d.id as i64 {
                            self.apply(msg);
                        } else {
                            d.world.send(to, msg, loc)?;
                        }
                    }
                    _ => {
                        self.buffers[t.buf].write_window(&t.starts, &data);
                        *self.count(recv) += bytes;
                    }
                }
                if let Some(d) = self.device {
                    d.world.progress(d.id);
                }
                Ok(Flow::Next)
            }
            MemOp::WaitDma { sem, src, dst } => {
                let (s, t) = (self.view(env, src, loc)?, self.view(env, dst, loc)?);
                if s.len() != t.len() {
                    return Err(fail(loc, "tpu.wait_dma2: src and dst differ in size"));
                }
                let bytes = (t.len() * self.buffers[t.buf].elem.bytes()) as i64;
                let s = self.sem(env, sem, loc)?;
                self.wait(s, bytes, "tpu.wait_dma2", loc)?;
                Ok(Flow::Next)
            }
            MemOp::SemSignal { sem, inc, device } => {
                let s = self.sem(env, sem, loc)?;
                let inc = self.scalar(env, inc, loc)?;
                self.take_turns(loc)?;
                let me = self.device.map_or(0, |d| d.id) as i64;
                match device {
                    Some(dev) if self.scalar(env, dev, loc)? != me => {
                        let to = self.scalar(env, dev, loc)?;
                        let d = self.device.ok_or_else(|| {
                            fail(loc, "a remote signal outside a run on several devices")
                        })?;
                        d.world.send(
                            to,
                            Msg::Signal {
                                sem: s,
                                inc,
                                from: d.id,
                                loc: loc.to_string(),
                            },
                            loc,
                        )?;
                    }
                    _ => *self.count(s) += inc,
                }
                if let Some(d) = self.device {
                    d.world.progress(d.id);
                }
                Ok(Flow::Next)
            }
            MemOp::SemWait { sem, value } => {
                let s = self.sem(env, sem, loc)?;
                let n = self.scalar(env, value, loc)?;
                self.wait(s, n, "tpu.sem_wait", loc)?;
                Ok(Flow::Next)
            }
            MemOp::SemRead { sem } => {
                let s = self.sem(env, sem, loc)?;
                self.take_turns(loc)?;
                let c = *self.count(s);
                result(env, Val::T(Rc::new(Tensor::scalar_int(Elem::I32, c))))
            }
            MemOp::Alloc { ty } => {
                let b = self.buffers.len();
                self.buffers.push(Tensor::garbage(ty.elem(), ty.shape()));
                result(env, Val::Ref(b))
            }
            MemOp::Region { body } => {
                let allocated = self.buffers.len();
                let mut inner = env.clone();
                let values = match self.block(body, &mut inner)? {
                    Flow::Yield(v) => v,
                    Flow::Next => Vec::new(),
                    Flow::Return(_) => return Err(fail(loc, "`return` inside tpu.region")),
                };
                // The region's semaphores must be back at zero: nothing in flight.
                for (i, b) in self.buffers[allocated..].iter().enumerate() {
                    if let (Elem::DmaSem | Elem::Sem, Data::I(v)) = (b.elem, &b.data) {
                        if v.iter().any(|&c| c != 0) {
                            return Err(fail(
                                loc,
                                format!(
                                    "semaphore {} allocated by this region is not zero at its \
                                     end ({v:?})",
                                    i
                                ),
                            ));
                        }
                    }
                }
                self.buffers.truncate(allocated);
                if values.len() != op.results.len() {
                    return Err(fail(loc, "tpu.region yields a different number of values"));
                }
                for (r, v) in op.results.iter().zip(values) {
                    env.insert(r.clone(), v);
                }
                Ok(Flow::Next)
            }
        }
    }
}

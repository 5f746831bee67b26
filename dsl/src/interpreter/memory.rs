//! The interpreter's rules for the ops of kernels that move their own data: copies,
//! semaphores, scoped allocations and accesses of buffers that copies touch. The shared state
//! they act on (and the scheduler of devices) is in [`dma`](super::dma).

use super::dma::{self, CopyStart, SemKey};
use super::tensor::Tensor;
use super::Machine;
use crate::error::KernelError;
use crate::ir::{Inst, Loc, MemorySpace, Op, RefId, RefWindow, SemRef};

impl<'k, 'w> Machine<'k, 'w> {
    pub(super) fn world(&self) -> (&'w dma::World<'k>, usize) {
        self.dev
            .expect("kernel bodies run with a world (only index maps run without)")
    }

    /// Whether `r`'s storage is in the shared world (HBM operands, buffers copies touch).
    pub(super) fn is_shared(&self, r: RefId) -> bool {
        self.dev.is_some_and(|(w, _)| w.shared.contains(&r))
    }

    pub(super) fn shared_load(
        &self,
        r: RefId,
        w: dma::Window,
        loc: Loc,
    ) -> Result<Tensor, KernelError> {
        let (world, d) = self.world();
        world.access(|world, g| world.load(g, d, r, &w, loc))
    }

    pub(super) fn shared_store(
        &self,
        r: RefId,
        w: dma::Window,
        value: Tensor,
        loc: Loc,
    ) -> Result<(), KernelError> {
        let (world, d) = self.world();
        world.access(|world, g| world.store(g, d, r, &w, &value, loc))
    }

    fn window(&self, inst: &Inst, w: &RefWindow) -> Result<dma::Window, KernelError> {
        let (starts, sizes) = self.starts(inst, w.r, &w.slices)?;
        Ok(dma::Window { starts, sizes })
    }

    /// The semaphore `sem` of device `device`, its indices checked.
    fn sem_on(&self, inst: &Inst, sem: &SemRef, device: usize) -> Result<SemKey, KernelError> {
        let o = self.k.operand(sem.sem);
        let mut flat = 0;
        for (dim, (&i, &n)) in sem.index.iter().zip(&o.array_shape).enumerate() {
            let i = self.get(i).as_i32();
            if i < 0 || i as usize >= n {
                return Err(self.error(
                    inst.loc,
                    format!("`{}` of `{}`", inst.op.name(), o.name),
                    format!("semaphore index {i} is out of bounds for dim {dim} of size {n}"),
                ));
            }
            flat = flat * n + i as usize;
        }
        Ok((device, sem.sem, flat))
    }

    pub(super) fn sem_key(&self, inst: &Inst, sem: &SemRef) -> Result<SemKey, KernelError> {
        let (_, d) = self.world();
        self.sem_on(inst, sem, d)
    }

    /// The device a remote copy or signal targets, checked against the mesh.
    fn target(&self, inst: &Inst, v: crate::ir::ValueId) -> Result<usize, KernelError> {
        let (world, _) = self.world();
        let t = self.get(v).as_i32();
        let n = world.devices();
        if t < 0 || t as usize >= n {
            return Err(self.error(
                inst.loc,
                format!("`{}`", inst.op.name()),
                format!("the target device {t} is outside the mesh of {n} devices"),
            ));
        }
        Ok(t as usize)
    }

    fn count(&self, inst: &Inst, v: crate::ir::ValueId, what: &str) -> Result<i64, KernelError> {
        let n = self.get(v).as_i32();
        if n < 0 {
            return Err(self.error(
                inst.loc,
                format!("`{}`", inst.op.name()),
                format!("{what} is {n}; semaphore counts change by non-negative amounts"),
            ));
        }
        Ok(i64::from(n))
    }

    pub(super) fn memory_op(&mut self, inst: &Inst) -> Result<(), KernelError> {
        let (world, d) = self.world();
        let k = self.k;
        match &inst.op {
            Op::DmaStart {
                src,
                dst,
                sem,
                remote,
            } => {
                let target = match remote {
                    Some(r) => self.target(inst, r.device)?,
                    None => d,
                };
                let start = CopyStart {
                    src: (src.r, self.window(inst, src)?),
                    dst: (dst.r, self.window(inst, dst)?),
                    target,
                    sem: self.sem_on(inst, sem, target)?,
                    send: match remote {
                        Some(r) => Some(self.sem_on(inst, &r.send_sem, d)?),
                        None => None,
                    },
                    loc: inst.loc,
                };
                world.sync(d, |w, g| w.start_copy(g, d, start))
            }
            Op::DmaWait { dst, sem, .. } => {
                let window = self.window(inst, dst)?;
                let bytes =
                    window.sizes.iter().product::<usize>() * k.operand(dst.r).dtype.size_bytes();
                let key = self.sem_key(inst, sem)?;
                world.wait(d, key, bytes as i64, inst.loc)
            }
            Op::SemSignal { sem, inc, device } => {
                let target = match device {
                    Some(v) => self.target(inst, *v)?,
                    None => d,
                };
                let key = self.sem_on(inst, sem, target)?;
                let amount = self.count(inst, *inc, "the increment")?;
                let loc = inst.loc;
                world.sync(d, |w, g| {
                    w.signal(g, d, key, amount, loc);
                    Ok(())
                })
            }
            Op::SemWait { sem, value } => {
                let key = self.sem_key(inst, sem)?;
                let amount = self.count(inst, *value, "the count to wait for")?;
                world.wait(d, key, amount, inst.loc)
            }
            Op::Scoped { allocs, body } => {
                let mut shared = Vec::new();
                let mut sems = Vec::new();
                for &r in allocs {
                    let o = k.operand(r);
                    match o.memory {
                        MemorySpace::Semaphore(_) => sems.push(r),
                        _ if world.shared.contains(&r) => {
                            shared.push((r, Tensor::garbage(o.dtype, &o.array_shape)))
                        }
                        _ => {
                            self.buffers
                                .insert(r, Tensor::garbage(o.dtype, &o.array_shape));
                            // A fresh buffer: nothing stored in it yet.
                            if let Some(tags) = self.tags.get_mut(&r) {
                                *tags = Tensor::unwritten(&o.array_shape);
                            }
                        }
                    }
                }
                world.scope_enter(d, shared, &sems);
                let yields = self.region(body, &[])?;
                world.scope_exit(d, allocs, inst.loc)?;
                for r in allocs {
                    self.buffers.remove(r);
                }
                for (&r, t) in inst.results.iter().zip(yields) {
                    self.set(r, t);
                }
                Ok(())
            }
            other => unreachable!("`{}` is not a memory op", other.name()),
        }
    }
}

//! Parses the ops of kernels that move their own data: memref windows, DMAs, semaphores,
//! the device id and scoped regions, in the forms tessera's lowering (and JAX's) emits.

use super::{Op, OpKind, Parser, Type, R};
use crate::lex::Tok;

/// An op on memory, semaphores or devices.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MemOp {
    /// `tpu.device_id : i32`.
    DeviceId,
    /// `tpu.sem_barrier : memref<!tpu.semaphore, ..>`.
    SemBarrier,
    /// `tpu.memref_slice %m[%i, ..] : T -> U` (i32 offsets; `shape` is U's).
    Slice {
        mem: String,
        offsets: Vec<String>,
        shape: Vec<usize>,
    },
    /// `tpu.memref_squeeze %m : T -> U`.
    Squeeze { mem: String, shape: Vec<usize> },
    /// `tpu.enqueue_dma source(..) target(..) [source_semaphore(..)] target_semaphore(..)
    /// [device_id(..)]`.
    EnqueueDma {
        source: String,
        target: String,
        source_sem: Option<String>,
        target_sem: String,
        device: Option<String>,
    },
    /// `tpu.wait_dma2 semaphore(..) src(..) dst(..) [device_id(..)] [core_id(..)]`.
    WaitDma {
        sem: String,
        src: String,
        dst: String,
    },
    /// `tpu.sem_signal %s, %n [device_id %d] : T`.
    SemSignal {
        sem: String,
        inc: String,
        device: Option<String>,
    },
    /// `tpu.sem_wait %s, %n : T`.
    SemWait { sem: String, value: String },
    /// `tpu.sem_read %s : T -> i32`.
    SemRead { sem: String },
    /// `memref.alloca() : T` and `tpu.sem_alloc : T`: a fresh buffer of the region.
    Alloc { ty: Type },
    /// `"tpu.region"() ({ .. }) : () -> (T, ..)`: its body, ending in `tpu.yield`.
    Region { body: Vec<Op> },
}

impl Parser {
    /// `keyword(%v : T)`, returning `%v`.
    fn keyword_operand(&mut self, keyword: &str) -> R<String> {
        self.expect_ident(keyword)?;
        self.expect("(")?;
        let v = self.value()?;
        if self.eat(":") {
            self.ty()?;
        }
        self.expect(")")?;
        Ok(v)
    }

    fn optional_keyword_operand(&mut self, keyword: &str) -> R<Option<String>> {
        if matches!(self.peek(), Some(Tok::Ident(n)) if n == keyword) {
            self.keyword_operand(keyword).map(Some)
        } else {
            Ok(None)
        }
    }

    /// `: T -> U`, returning U.
    fn arrow_type(&mut self) -> R<Type> {
        self.expect(":")?;
        self.ty()?;
        self.expect("->")?;
        self.ty()
    }

    /// The memory ops by name, or `None` for other names.
    pub(super) fn memory_op(&mut self, name: &str) -> R<Option<OpKind>> {
        let op = match name {
            "tpu.device_id" => {
                self.expect(":")?;
                self.ty()?;
                MemOp::DeviceId
            }
            "tpu.sem_barrier" => {
                self.expect(":")?;
                self.ty()?;
                MemOp::SemBarrier
            }
            "tpu.memref_slice" => {
                let mem = self.value()?;
                let offsets = self.indices()?;
                let shape = self.arrow_type()?.shape().to_vec();
                MemOp::Slice {
                    mem,
                    offsets,
                    shape,
                }
            }
            "tpu.memref_squeeze" => {
                let mem = self.value()?;
                let shape = self.arrow_type()?.shape().to_vec();
                MemOp::Squeeze { mem, shape }
            }
            "tpu.enqueue_dma" => {
                let source = self.keyword_operand("source")?;
                let target = self.keyword_operand("target")?;
                let source_sem = self.optional_keyword_operand("source_semaphore")?;
                let target_sem = self.keyword_operand("target_semaphore")?;
                let device = self.optional_keyword_operand("device_id")?;
                if source_sem.is_some() != device.is_some() {
                    return Err(self.error(
                        "tpu.enqueue_dma: a remote DMA has both a source semaphore and a \
                         device id",
                    ));
                }
                MemOp::EnqueueDma {
                    source,
                    target,
                    source_sem,
                    target_sem,
                    device,
                }
            }
            "tpu.wait_dma2" => {
                let sem = self.keyword_operand("semaphore")?;
                let src = self.keyword_operand("src")?;
                let dst = self.keyword_operand("dst")?;
                self.optional_keyword_operand("device_id")?;
                self.optional_keyword_operand("core_id")?;
                MemOp::WaitDma { sem, src, dst }
            }
            "tpu.sem_signal" => {
                let sem = self.value()?;
                self.expect(",")?;
                let inc = self.value()?;
                let device = if self.eat_ident("device_id") {
                    Some(self.value()?)
                } else {
                    None
                };
                self.expect(":")?;
                self.ty()?;
                MemOp::SemSignal { sem, inc, device }
            }
            "tpu.sem_wait" => {
                let sem = self.value()?;
                self.expect(",")?;
                let value = self.value()?;
                self.expect(":")?;
                self.ty()?;
                MemOp::SemWait { sem, value }
            }
            "tpu.sem_read" => {
                let sem = self.value()?;
                self.arrow_type()?;
                MemOp::SemRead { sem }
            }
            "memref.alloca" => {
                self.expect("(")?;
                self.expect(")")?;
                self.expect(":")?;
                MemOp::Alloc { ty: self.ty()? }
            }
            "tpu.sem_alloc" => {
                self.expect(":")?;
                MemOp::Alloc { ty: self.ty()? }
            }
            "tpu.region" => {
                self.expect("(")?;
                self.expect(")")?;
                self.expect("(")?;
                let body = self.block()?;
                self.expect(")")?;
                self.expect(":")?;
                self.expect("(")?;
                self.expect(")")?;
                self.expect("->")?;
                self.expect("(")?;
                if !self.eat(")") {
                    loop {
                        self.ty()?;
                        if self.eat(")") {
                            break;
                        }
                        self.expect(",")?;
                    }
                }
                MemOp::Region { body }
            }
            "tpu.yield" => {
                let values = if matches!(self.peek(), Some(Tok::Value(_))) {
                    let v = self.values()?;
                    self.expect(":")?;
                    self.ty()?;
                    while self.eat(",") {
                        self.ty()?;
                    }
                    v
                } else {
                    Vec::new()
                };
                return Ok(Some(OpKind::Yield { values }));
            }
            _ => return Ok(None),
        };
        Ok(Some(OpKind::Mem(op)))
    }
}

impl MemOp {
    /// The values the op reads, and the ops of its region.
    pub(super) fn uses(&self) -> (Vec<&String>, Vec<&Op>) {
        match self {
            MemOp::DeviceId | MemOp::SemBarrier | MemOp::Alloc { .. } => (vec![], vec![]),
            MemOp::Slice { mem, offsets, .. } => {
                (std::iter::once(mem).chain(offsets).collect(), vec![])
            }
            MemOp::Squeeze { mem, .. } => (vec![mem], vec![]),
            MemOp::EnqueueDma {
                source,
                target,
                source_sem,
                target_sem,
                device,
            } => (
                [source, target, target_sem]
                    .into_iter()
                    .chain(source_sem)
                    .chain(device)
                    .collect(),
                vec![],
            ),
            MemOp::WaitDma { sem, src, dst } => (vec![sem, src, dst], vec![]),
            MemOp::SemSignal { sem, inc, device } => {
                ([sem, inc].into_iter().chain(device).collect(), vec![])
            }
            MemOp::SemWait { sem, value } => (vec![sem, value], vec![]),
            MemOp::SemRead { sem } => (vec![sem], vec![]),
            MemOp::Region { body } => (vec![], body.iter().collect()),
        }
    }
}

//! A test-only evaluator of the Mosaic TPU subset tessera's lowering emits.
//!
//! It parses the module's MLIR text (not tessera's kernel IR) and runs it on the host with
//! the grid semantics of a Pallas TPU kernel, read from the kernel function's attributes:
//! `iteration_bounds` is the grid, walked row-major (last dim fastest); the first
//! `scalar_prefetch` memrefs are SMEM copies of the leading operands; each `window_params`
//! entry's `transform_indices` function maps the grid indices (and the SMEM tables) to block
//! indices, and `window_bounds` is the block shape; the last `scratch_operands` memrefs are
//! scratch that persists across steps. Input blocks are copied in at every step; an output
//! block is written back to its array when its block index changes and after the last step.
//! Memory that was never written holds the same garbage as tessera's interpreter (NaN for
//! floats), and floats are computed in f32 and rounded to bf16 after every bf16 op, so a
//! correct lowering gives the interpreter's numbers.
//!
//! Only the ops and forms the lowering emits are supported; anything else is a clear error
//! naming the op and its location. Not shipped in any library crate.

mod devices;
mod exec;
mod lex;
mod parse;

use std::collections::HashMap;
use std::rc::Rc;

use half::bf16;
use tessera_array::{ArrayData, DType, HostArray};

use exec::{Data, Machine, Tensor, Val};
use parse::{Attr, Elem, Func, Type};

/// Why a module could not be parsed or run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EvalError {
    #[error("line {line}: {message}")]
    Parse { line: usize, message: String },
    #[error("{loc}: {message}")]
    Run { loc: String, message: String },
    #[error("{0}")]
    Kernel(String),
}

/// A parsed Mosaic module.
#[derive(Debug, Clone)]
pub struct Module {
    funcs: HashMap<String, Func>,
}

/// The shape of an array a kernel returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputSpec {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

fn kernel_err(message: impl Into<String>) -> EvalError {
    EvalError::Kernel(message.into())
}

fn elem_of(d: DType) -> Elem {
    match d {
        DType::F32 => Elem::F32,
        DType::BF16 => Elem::BF16,
        DType::I32 => Elem::I32,
        DType::I8 => Elem::I8,
        DType::Bool => Elem::I1,
    }
}

fn to_tensor(a: &HostArray) -> Tensor {
    let data = match a.data() {
        ArrayData::F32(v) => Data::F(v.clone()),
        ArrayData::BF16(v) => Data::F(v.iter().map(|x| x.to_f32()).collect()),
        ArrayData::I32(v) => Data::I(v.iter().map(|&x| x as i64).collect()),
        ArrayData::I8(v) => Data::I(v.iter().map(|&x| x as i64).collect()),
        ArrayData::Bool(v) => Data::B(v.clone()),
    };
    Tensor {
        elem: elem_of(a.dtype()),
        shape: a.shape().to_vec(),
        data,
    }
}

fn to_host(t: Tensor, dtype: DType) -> Result<HostArray, EvalError> {
    let data = match (dtype, t.data) {
        (DType::F32, Data::F(v)) => ArrayData::F32(v),
        (DType::BF16, Data::F(v)) => ArrayData::BF16(v.into_iter().map(bf16::from_f32).collect()),
        (DType::I32, Data::I(v)) => ArrayData::I32(v.into_iter().map(|x| x as i32).collect()),
        (DType::I8, Data::I(v)) => ArrayData::I8(v.into_iter().map(|x| x as i8).collect()),
        (DType::Bool, Data::B(v)) => ArrayData::Bool(v),
        (d, _) => return Err(kernel_err(format!("an output buffer does not hold {d}"))),
    };
    HostArray::new(t.shape, data).map_err(|e| kernel_err(e.to_string()))
}

fn ints(a: Option<&Attr>, what: &str) -> Result<Vec<usize>, EvalError> {
    match a {
        Some(Attr::Angle(k, body)) if k == "array" => {
            let list = body
                .strip_prefix("i64:")
                .ok_or_else(|| kernel_err(format!("{what}: expected array<i64: ...>")))?;
            list.split(',')
                .map(|s| {
                    s.trim()
                        .parse()
                        .map_err(|_| kernel_err(format!("{what}: `{s}` is not a size")))
                })
                .collect()
        }
        _ => Err(kernel_err(format!("the kernel function has no {what}"))),
    }
}

fn count(a: Option<&Attr>, what: &str) -> Result<usize, EvalError> {
    match a {
        Some(Attr::Num(n)) => n
            .parse()
            .map_err(|_| kernel_err(format!("{what}: `{n}` is not a count"))),
        _ => Err(kernel_err(format!("the kernel function has no {what}"))),
    }
}

/// One `window_params` entry: a block and its index map, or (`{}`) an operand left in
/// HBM, whole.
struct Window {
    transform: Option<String>,
    bounds: Vec<usize>,
}

impl Module {
    /// Parses the MLIR text of a Mosaic module.
    pub fn parse(text: &str) -> Result<Module, EvalError> {
        Ok(Module {
            funcs: parse::parse_module(text)?,
        })
    }

    /// The kernel function: the one with `tpu.core_type`.
    fn kernel(&self) -> Result<&Func, EvalError> {
        let mut kernels = self
            .funcs
            .values()
            .filter(|f| f.attr("tpu.core_type").is_some());
        match (kernels.next(), kernels.next()) {
            (Some(k), None) => Ok(k),
            _ => Err(kernel_err(
                "expected exactly one function with `tpu.core_type` (the kernel)",
            )),
        }
    }

    /// Runs the kernel on `args` (the custom call's operands: scalar-prefetch tables, then
    /// inputs) and returns its outputs, which have the shapes `outputs` gives (the custom
    /// call's results; the module only knows their blocks).
    pub fn run(
        &self,
        args: &[HostArray],
        outputs: &[OutputSpec],
    ) -> Result<Vec<HostArray>, EvalError> {
        self.run_device(args, outputs, None)
    }

    /// Runs the kernel on several devices at once (a kernel with remote DMAs, remote signals
    /// or the barrier semaphore), one argument list per device (device ids are positions
    /// in `per_device`); returns each device's outputs. The devices interleave as
    /// [`devices`] describes; a deadlock, a message reaching a device that has finished, or
    /// a semaphore not back at zero when a device finishes is an error.
    pub fn run_on_devices(
        &self,
        per_device: &[Vec<HostArray>],
        outputs: &[OutputSpec],
    ) -> Result<Vec<Vec<HostArray>>, EvalError> {
        let n = per_device.len();
        // Every device's barrier semaphore is the buffer after the kernel's memrefs.
        let k = self.kernel()?;
        let grid = ints(k.attr("iteration_bounds"), "iteration_bounds")?;
        let barrier = k.args.len().saturating_sub(grid.len());
        let world = devices::World::new(n, Some(barrier));
        let results: Vec<Result<Vec<HostArray>, EvalError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = per_device
                .iter()
                .enumerate()
                .map(|(id, args)| {
                    let world = &world;
                    scope.spawn(move || {
                        let device = exec::Device { id, world };
                        let r = world
                            .enter(id)
                            .and_then(|_| self.run_device(args, outputs, Some(device)));
                        world.leave(id, r.as_ref().err().cloned());
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(kernel_err("a device's thread panicked")))
                })
                .collect()
        });
        if let Some(e) = world.failure() {
            return Err(e);
        }
        for d in 0..n {
            let lost = world.undelivered(d);
            if !lost.is_empty() {
                return Err(kernel_err(format!(
                    "device {d} finished before {} reached it",
                    lost.join(" and ")
                )));
            }
        }
        results.into_iter().collect()
    }

    /// Runs the kernel as one device of a run ([`Module::run_on_devices`]), or alone.
    fn run_device(
        &self,
        args: &[HostArray],
        outputs: &[OutputSpec],
        device: Option<exec::Device<'_>>,
    ) -> Result<Vec<HostArray>, EvalError> {
        let k = self.kernel()?;
        let grid = ints(k.attr("iteration_bounds"), "iteration_bounds")?;
        let n_prefetch = count(k.attr("scalar_prefetch"), "scalar_prefetch")?;
        let n_scratch = count(k.attr("scratch_operands"), "scratch_operands")?;
        let windows: Vec<Window> = match k.attr("window_params") {
            Some(Attr::List(items)) => items
                .iter()
                .map(|w| match w {
                    // An operand left in HBM: the kernel gets the whole array.
                    Attr::Dict(entries) if entries.is_empty() => Ok(Window {
                        transform: None,
                        bounds: Vec::new(),
                    }),
                    Attr::Dict(entries) => {
                        let get = |n: &str| entries.iter().find(|(k, _)| k == n).map(|(_, a)| a);
                        let transform = match get("transform_indices") {
                            Some(Attr::Sym(s)) => s.clone(),
                            _ => return Err(kernel_err("a window has no transform_indices")),
                        };
                        if entries.len() != 2 {
                            return Err(kernel_err(
                                "window_params entries other than transform_indices and \
                                 window_bounds are not part of the subset",
                            ));
                        }
                        Ok(Window {
                            transform: Some(transform),
                            bounds: ints(get("window_bounds"), "window_bounds")?,
                        })
                    }
                    _ => Err(kernel_err("window_params holds a non-dictionary")),
                })
                .collect::<Result<_, _>>()?,
            _ => return Err(kernel_err("the kernel function has no window_params")),
        };
        let mem_args: Vec<&(String, Type)> = k.args.iter().skip(grid.len()).collect();
        if k.args.len() < grid.len()
            || k.args[..grid.len()]
                .iter()
                .any(|(_, t)| *t != Type::Scalar(Elem::I32))
        {
            return Err(kernel_err(
                "the kernel must take one i32 per grid dim first",
            ));
        }
        if mem_args.len() != n_prefetch + windows.len() + n_scratch {
            return Err(kernel_err(format!(
                "the kernel takes {} memrefs but scalar_prefetch ({n_prefetch}), window_params \
                 ({}) and scratch_operands ({n_scratch}) account for {}",
                mem_args.len(),
                windows.len(),
                n_prefetch + windows.len() + n_scratch
            )));
        }
        let n_inputs = args.len().checked_sub(n_prefetch).ok_or_else(|| {
            kernel_err(format!(
                "{} arguments but {n_prefetch} scalar-prefetch tables",
                args.len()
            ))
        })?;
        if n_inputs + outputs.len() != windows.len() {
            return Err(kernel_err(format!(
                "{n_inputs} inputs and {} outputs but {} window_params",
                outputs.len(),
                windows.len()
            )));
        }
        let mut m = Machine {
            funcs: &self.funcs,
            buffers: Vec::new(),
            device,
        };
        // Whole arrays: inputs as given, outputs as garbage.
        let mut arrays: Vec<Tensor> = args[n_prefetch..].iter().map(to_tensor).collect();
        arrays.extend(
            outputs
                .iter()
                .map(|o| Tensor::garbage(elem_of(o.dtype), &o.shape)),
        );
        // The kernel's memrefs, in order: SMEM tables, blocks, scratch.
        let mut mem_vals = Vec::with_capacity(mem_args.len());
        for (i, (name, ty)) in mem_args.iter().enumerate() {
            let Type::MemRef { shape, elem, space } = ty else {
                return Err(kernel_err(format!(
                    "kernel argument {name} is not a memref"
                )));
            };
            let t = if i < n_prefetch {
                let t = to_tensor(&args[i]);
                if space != "smem" || t.shape != *shape || t.elem != *elem {
                    return Err(kernel_err(format!(
                        "scalar prefetch {name}: {ty:?} does not match the argument {:?}{:?}",
                        t.elem, t.shape
                    )));
                }
                t
            } else if i - n_prefetch < windows.len() && windows[i - n_prefetch].transform.is_none()
            {
                // Left in HBM: the whole array.
                let a = &arrays[i - n_prefetch];
                if space != "any" || a.shape != *shape || a.elem != *elem {
                    return Err(kernel_err(format!(
                        "{name}: {ty:?} is not its whole array {:?} ({:?}) in HBM (`any`)",
                        a.shape, a.elem
                    )));
                }
                a.clone()
            } else {
                let sem = matches!(elem, Elem::DmaSem | Elem::Sem);
                if space != "vmem" && !(sem && space == "semaphore_mem") {
                    return Err(kernel_err(format!("{name} is not in VMEM")));
                }
                let w = i - n_prefetch;
                if w < windows.len() {
                    let a = &arrays[w];
                    let ok = windows[w].bounds == *shape
                        && a.elem == *elem
                        && a.shape.len() == shape.len()
                        && a.shape.iter().zip(shape).all(|(n, b)| n % b == 0);
                    if !ok {
                        return Err(kernel_err(format!(
                            "{name}: block {shape:?} ({:?}) does not tile its array {:?} ({:?})",
                            elem, a.shape, a.elem
                        )));
                    }
                }
                Tensor::garbage(*elem, shape)
            };
            m.buffers.push(t);
            mem_vals.push(Val::Ref(m.buffers.len() - 1));
        }
        if device.is_some() {
            // The barrier semaphore (`tpu.sem_barrier`).
            m.buffers.push(Tensor::garbage(Elem::Sem, &[]));
        }
        let prefetch_vals: Vec<Val> = mem_vals[..n_prefetch].to_vec();
        let kernel_name = k.name.clone();
        // Resident block index of each output window.
        let mut resident: Vec<Option<Vec<usize>>> = vec![None; outputs.len()];
        let write_back = |m: &mut Machine<'_>, arrays: &mut [Tensor], w: usize, bidx: &[usize]| {
            let buf = &m.buffers[n_prefetch + w];
            let starts: Vec<usize> = bidx.iter().zip(&buf.shape).map(|(i, s)| i * s).collect();
            arrays[w].write_window(&starts, buf);
        };
        for step in exec::indices(&grid) {
            let grid_vals: Vec<Val> = step
                .iter()
                .map(|&i| Val::T(Rc::new(Tensor::scalar_int(Elem::I32, i as i64))))
                .collect();
            for (w, window) in windows.iter().enumerate() {
                let Some(transform) = &window.transform else {
                    continue;
                };
                let mut call_args = grid_vals.clone();
                call_args.extend(prefetch_vals.iter().cloned());
                let out = m.call(transform, call_args)?;
                let bidx = block_index(&out, &window.bounds, &arrays[w].shape, transform, &step)?;
                let buf = n_prefetch + w;
                if w < n_inputs {
                    let starts: Vec<usize> = bidx
                        .iter()
                        .zip(&window.bounds)
                        .map(|(i, s)| i * s)
                        .collect();
                    m.buffers[buf] = arrays[w].window(&starts, &window.bounds);
                } else {
                    let o = w - n_inputs;
                    if resident[o].as_deref() != Some(&bidx[..]) {
                        if let Some(prev) = resident[o].take() {
                            write_back(&mut m, &mut arrays, w, &prev);
                        }
                        m.buffers[buf] = Tensor::garbage(m.buffers[buf].elem, &window.bounds);
                        resident[o] = Some(bidx);
                    }
                }
            }
            let mut call_args = grid_vals;
            call_args.extend(mem_vals.iter().cloned());
            m.call(&kernel_name, call_args)?;
        }
        for (o, r) in resident.iter().enumerate() {
            if let Some(bidx) = r {
                write_back(&mut m, &mut arrays, n_inputs + o, bidx);
            }
        }
        for (w, window) in windows.iter().enumerate() {
            if window.transform.is_none() {
                arrays[w] = m.buffers[n_prefetch + w].clone();
            }
        }
        // Every semaphore is back at zero (libtpu checks this at run time too).
        let names = mem_args
            .iter()
            .map(|(n, _)| n.as_str())
            .chain(["the barrier"]);
        for (b, name) in m.buffers.iter().zip(names) {
            if let (Elem::DmaSem | Elem::Sem, exec::Data::I(v)) = (b.elem, &b.data) {
                if v.iter().any(|&c| c != 0) {
                    let on = device
                        .map(|d| format!(" on device {}", d.id))
                        .unwrap_or_default();
                    return Err(kernel_err(format!(
                        "semaphore {name}{on} is not zero when the kernel ends (counts {v:?}): \
                         a copy not waited or a signal not waited"
                    )));
                }
            }
        }
        arrays
            .drain(n_inputs..)
            .zip(outputs)
            .map(|(t, o)| to_host(t, o.dtype))
            .collect()
    }
}

fn block_index(
    out: &[Val],
    bounds: &[usize],
    array: &[usize],
    transform: &str,
    step: &[usize],
) -> Result<Vec<usize>, EvalError> {
    if out.len() != bounds.len() {
        return Err(kernel_err(format!(
            "@{transform} returns {} indices for a rank-{} block",
            out.len(),
            bounds.len()
        )));
    }
    out.iter()
        .enumerate()
        .map(|(d, v)| {
            let i = match v {
                Val::T(t) => match (&t.data, t.shape.is_empty()) {
                    (Data::I(x), true) => x[0],
                    _ => return Err(kernel_err(format!("@{transform} returns a non-integer"))),
                },
                Val::Ref(_) | Val::View(_) => {
                    return Err(kernel_err(format!("@{transform} returns a memref")))
                }
            };
            let blocks = array[d] / bounds[d];
            if i < 0 || i as usize >= blocks {
                return Err(kernel_err(format!(
                    "@{transform} gives block index {i} for dim {d} (of {blocks} blocks) at grid \
                     step {step:?}"
                )));
            }
            Ok(i as usize)
        })
        .collect()
}

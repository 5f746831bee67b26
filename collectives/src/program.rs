//! [`Program`]: a finished SPMD program (StableHLO, manual sharding), and running it on the
//! PJRT runtime's devices.

use std::fmt;

use tessera_hlo::Module;
use tessera_runtime::{
    Argument, Buffer, Client, CompileOptions, ElementType, HostBuffer, LoadedExecutable,
};

use crate::error::CollectiveError;
use crate::host;
use crate::mesh::{Mesh, MeshShape};
use crate::spmd::{CollectiveCall, Signature, Spmd, TensorInfo};

/// An SPMD program on the mesh `M`: a StableHLO module with one partition per device whose
/// `@main` takes and returns per-device blocks, a channel handle per collective: the form
/// `jax.shard_map` emits, printed two ways.
///
/// * [`Program::to_mlir`], what [`Program::compile`] compiles (with
///   `use_shardy_partitioner`): Shardy's form, an `sdy.mesh` and `@main` over global tensors
///   (`sdy.sharding`) whose body is an `sdy.manual_computation` over every mesh axis.
/// * [`Program::to_mlir_gspmd`]: GSPMD's form, per-device types with
///   `mhlo.sharding = "{manual}"`; the form known to compile for TPU (libtpu), compiled
///   without Shardy.
///
/// Both run the same per-device program on the same per-device buffers. The XLA CPU plugin
/// (StableHLO 1.13) compiles both; the GSPMD form makes it warn that GSPMD sharding
/// propagation is deprecated, the Shardy form compiles without the warning.
///
/// ```
/// use tessera_collectives::prelude::*;
/// use tessera_hlo::DType;
///
/// mesh!(Cp = [Context]);
/// type SeqSharded = (Replicated, Replicated, Split<Context>, Replicated); // [B, H, S/U, D]
/// type HeadSharded = (Replicated, Split<Context>, Replicated, Replicated); // [B, H/U, S, D]
///
/// let mesh = Mesh::<Cp>::new([4])?;
/// let program = Program::build("ulysses", &mesh, |p| {
///     let q = p.arg::<SeqSharded>([1, 8, 64, 16], DType::BF16)?;
///     let q: DTensor<'_, Cp, HeadSharded> = q.all_to_all::<Context, 1, 2>()?;
///     let o = q.map_local(|f, q| Ok(f.exp(q)?))?; // a local op on [B, H/U, S, D]
///     let o = o.all_to_all::<Context, 2, 1>()?;
///     o.output::<SeqSharded>()
/// })?;
/// assert!(program.to_mlir().contains("stablehlo.all_to_all"));
/// assert_eq!(program.outputs()[0].local.dims, vec![1, 8, 16, 16]);
/// # Ok::<(), CollectiveError>(())
/// ```
pub struct Program<M> {
    mesh: Mesh<M>,
    module: Module,
    signature: Signature,
    collectives: Vec<CollectiveCall>,
}

impl<M: MeshShape> fmt::Debug for Program<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("name", &self.module.name())
            .field("mesh", &self.mesh)
            .field("signature", &self.signature)
            .finish_non_exhaustive()
    }
}

impl<M: MeshShape> Program<M> {
    /// Builds the program `@main` of a module called `name`: `body` adds the arguments
    /// ([`Spmd::arg`]), computes, and declares the outputs ([`DTensor::output`](crate::DTensor::output)).
    pub fn build(
        name: impl Into<String>,
        mesh: &Mesh<M>,
        body: impl FnOnce(&Spmd<'_, M>) -> Result<(), CollectiveError>,
    ) -> Result<Self, CollectiveError> {
        let mut module = Module::new(name);
        let axes = mesh
            .axis_names()
            .iter()
            .zip(mesh.sizes())
            .map(|(&name, &size)| Ok((name, u32::try_from(size)?)))
            .collect::<Result<Vec<_>, std::num::TryFromIntError>>()
            .map_err(|_| CollectiveError::Mesh {
                reason: format!("{mesh} is too many devices"),
            })?;
        module.set_mesh(&axes)?;
        let (signature, collectives) = {
            let spmd = Spmd::new(module.func("main"), mesh)?;
            body(&spmd)?;
            let collectives = spmd.collectives();
            (spmd.finish()?, collectives)
        };
        module.verify()?;
        Ok(Program {
            mesh: mesh.clone(),
            module,
            signature,
            collectives,
        })
    }

    /// The mesh.
    pub fn mesh(&self) -> &Mesh<M> {
        &self.mesh
    }

    /// The StableHLO module.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The StableHLO text in Shardy's form (what [`Program::compile`] compiles).
    pub fn to_mlir(&self) -> String {
        self.module.to_mlir()
    }

    /// The StableHLO text in GSPMD's manual form (`{manual}` per-device arguments and
    /// results), for compilers without Shardy: compile it with
    /// `CompileOptions::manual_partitions` (no `use_shardy_partitioner`).
    pub fn to_mlir_gspmd(&self) -> String {
        self.module.to_mlir_gspmd()
    }

    /// The arguments: sharding, global and per-device types.
    pub fn inputs(&self) -> &[TensorInfo] {
        &self.signature.inputs
    }

    /// The results: sharding, global and per-device types.
    pub fn outputs(&self) -> &[TensorInfo] {
        &self.signature.outputs
    }

    /// The collectives of the program, in order.
    pub fn collectives(&self) -> &[CollectiveCall] {
        &self.collectives
    }

    /// Lets result `output` reuse the memory of argument `arg` (same type and sharding): run
    /// with that argument donated ([`MeshArgument::Donated`]), the result is written in place,
    /// as a training step updates its parameters.
    pub fn donate(&mut self, arg: usize, output: usize) -> Result<(), CollectiveError> {
        let (Some(a), Some(o)) = (
            self.signature.inputs.get(arg),
            self.signature.outputs.get(output),
        ) else {
            return Err(CollectiveError::operand(
                "donate",
                format!(
                    "argument #{arg} or result #{output} does not exist (the program takes {} \
                     and returns {})",
                    self.signature.inputs.len(),
                    self.signature.outputs.len()
                ),
            ));
        };
        if a != o {
            return Err(CollectiveError::operand(
                "donate",
                format!(
                    "argument #{arg} is {} sharded as {}, result #{output} is {} sharded as {}; \
                     only equal types and shardings share memory",
                    a.global, a.spec, o.global, o.spec
                ),
            ));
        }
        self.module.alias_output("main", arg, output)?;
        Ok(())
    }

    /// Compiles the program for the first `mesh.num_devices()` devices of `client`; fails if
    /// the client has fewer devices than the mesh.
    pub fn compile(&self, client: &Client) -> Result<Executable<M>, CollectiveError> {
        let n = self.mesh.num_devices();
        if client.devices().len() < n {
            return Err(CollectiveError::DeviceCount {
                context: format!(
                    "compile `{}` for the mesh {}: the client's devices",
                    self.module.name(),
                    self.mesh
                ),
                expected: n,
                actual: client.devices().len(),
            });
        }
        let options = CompileOptions::manual_partitions(n)?.with_shardy(true);
        let exe = client.compile(&self.to_mlir(), &options)?;
        Ok(Executable {
            exe,
            client: client.clone(),
            mesh: self.mesh.clone(),
            signature: self.signature.clone(),
        })
    }
}

/// A compiled [`Program`], loaded on a client's devices.
pub struct Executable<M> {
    exe: LoadedExecutable,
    client: Client,
    mesh: Mesh<M>,
    signature: Signature,
}

impl<M: MeshShape> fmt::Debug for Executable<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Executable")
            .field("exe", &self.exe)
            .field("mesh", &self.mesh)
            .finish_non_exhaustive()
    }
}

impl<M: MeshShape> Executable<M> {
    /// The mesh it runs on.
    pub fn mesh(&self) -> &Mesh<M> {
        &self.mesh
    }

    /// The program's signature.
    pub fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Runs on per-device inputs: `per_device[d]` are device `d`'s shards of the arguments,
    /// in order. Returns each device's results. Checks the device count and every input's
    /// shape and element type first.
    pub fn run(
        &self,
        per_device: &[Vec<HostBuffer>],
    ) -> Result<Vec<Vec<HostBuffer>>, CollectiveError> {
        let n = self.mesh.num_devices();
        if per_device.len() != n {
            return Err(CollectiveError::DeviceCount {
                context: "run: per-device input lists".into(),
                expected: n,
                actual: per_device.len(),
            });
        }
        for (d, inputs) in per_device.iter().enumerate() {
            if inputs.len() != self.signature.inputs.len() {
                return Err(CollectiveError::operand(
                    format!("run: device {d}"),
                    format!(
                        "{} inputs given, the program takes {}",
                        inputs.len(),
                        self.signature.inputs.len()
                    ),
                ));
            }
            for (i, (buffer, info)) in inputs.iter().zip(&self.signature.inputs).enumerate() {
                let expected = ElementType::from(info.local.dtype);
                if buffer.dims() != info.local.dims.as_slice() || buffer.element_type() != expected
                {
                    return Err(CollectiveError::operand(
                        format!("run: device {d}, input #{i}"),
                        format!(
                            "got {:?} {:?}, the program takes the shard {} (global {}, sharded \
                             as {})",
                            buffer.element_type(),
                            buffer.dims(),
                            info.local,
                            info.global,
                            info.spec
                        ),
                    ));
                }
            }
        }
        Ok(self.exe.execute_host(per_device)?)
    }

    /// Runs on global inputs: shards each by its argument's sharding, runs, and assembles each
    /// result from the devices' shards (checking that replicas agree).
    pub fn run_global(&self, inputs: &[HostBuffer]) -> Result<Vec<HostBuffer>, CollectiveError> {
        let n = self.mesh.num_devices();
        if inputs.len() != self.signature.inputs.len() {
            return Err(CollectiveError::operand(
                "run_global",
                format!(
                    "{} inputs given, the program takes {}",
                    inputs.len(),
                    self.signature.inputs.len()
                ),
            ));
        }
        let mut per_device: Vec<Vec<HostBuffer>> = vec![Vec::new(); n];
        for (i, (input, info)) in inputs.iter().zip(&self.signature.inputs).enumerate() {
            if input.dims() != info.global.dims.as_slice() {
                return Err(CollectiveError::operand(
                    format!("run_global: input #{i}"),
                    format!(
                        "got dims {:?}, the program takes {}",
                        input.dims(),
                        info.global
                    ),
                ));
            }
            for (d, s) in host::shard(input, &info.spec, &self.mesh)?
                .into_iter()
                .enumerate()
            {
                per_device[d].push(s);
            }
        }
        let outputs = self.run(&per_device)?;
        (0..self.signature.outputs.len())
            .map(|o| {
                let shards: Vec<HostBuffer> = outputs.iter().map(|d| d[o].clone()).collect();
                host::unshard(&shards, &self.signature.outputs[o].spec, &self.mesh)
            })
            .collect()
    }
}

/// A program input or output held on the devices: device `d`'s shard on device `d`. Made by
/// [`Executable::upload`] or returned by [`Executable::run_on_devices`]; it stays on the
/// devices until [`Executable::download`] copies it (the shards, not the array, cross).
#[derive(Debug)]
pub struct DeviceArray {
    shards: Vec<Buffer>,
}

impl DeviceArray {
    /// The per-device buffers, in device order.
    pub fn shards(&self) -> &[Buffer] {
        &self.shards
    }
}

/// An input of [`Executable::run_on_devices`]: lent (it stays valid) or donated (its memory
/// may become an output's; it is gone afterwards, see [`Program::donate`]).
#[derive(Debug)]
pub enum MeshArgument<'a> {
    /// Lent for the run.
    Lent(&'a DeviceArray),
    /// Given to the run.
    Donated(DeviceArray),
}

impl MeshArgument<'_> {
    fn array(&self) -> &DeviceArray {
        match self {
            MeshArgument::Lent(a) => a,
            MeshArgument::Donated(a) => a,
        }
    }
}

impl<M: MeshShape> Executable<M> {
    /// Copies the global array of input `input` to the devices, each its shard.
    pub fn upload(
        &self,
        input: usize,
        global: &HostBuffer,
    ) -> Result<DeviceArray, CollectiveError> {
        let info = self.signature.inputs.get(input).ok_or_else(|| {
            CollectiveError::operand(
                "upload",
                format!(
                    "input #{input} does not exist (the program takes {})",
                    self.signature.inputs.len()
                ),
            )
        })?;
        if global.dims() != info.global.dims.as_slice()
            || global.element_type() != ElementType::from(info.global.dtype)
        {
            return Err(CollectiveError::operand(
                format!("upload: input #{input}"),
                format!(
                    "got {:?} {:?}, the program takes {}",
                    global.element_type(),
                    global.dims(),
                    info.global
                ),
            ));
        }
        let shards = host::shard(global, &info.spec, &self.mesh)?
            .iter()
            .zip(self.exe.device_indices())
            .map(|(s, &device)| self.client.buffer_from_host(s, device))
            .collect::<Result<_, _>>()?;
        Ok(DeviceArray { shards })
    }

    /// Copies output `output` (as returned by [`Executable::run_on_devices`]) to the host and
    /// assembles the global array (checking that replicas agree).
    pub fn download(
        &self,
        output: usize,
        array: &DeviceArray,
    ) -> Result<HostBuffer, CollectiveError> {
        let info = self.signature.outputs.get(output).ok_or_else(|| {
            CollectiveError::operand(
                "download",
                format!(
                    "output #{output} does not exist (the program returns {})",
                    self.signature.outputs.len()
                ),
            )
        })?;
        let shards = array
            .shards
            .iter()
            .map(Buffer::to_host)
            .collect::<Result<Vec<_>, _>>()?;
        host::unshard(&shards, &info.spec, &self.mesh)
    }

    /// Runs on arrays held on the devices and returns the outputs there, one [`DeviceArray`]
    /// per output: nothing crosses to the host. Feed outputs back as the next run's inputs,
    /// donated, to keep state on the devices without copies.
    pub fn run_on_devices(
        &self,
        inputs: Vec<MeshArgument<'_>>,
    ) -> Result<Vec<DeviceArray>, CollectiveError> {
        let n = self.mesh.num_devices();
        if inputs.len() != self.signature.inputs.len() {
            return Err(CollectiveError::operand(
                "run_on_devices",
                format!(
                    "{} inputs given, the program takes {}",
                    inputs.len(),
                    self.signature.inputs.len()
                ),
            ));
        }
        for (i, (a, info)) in inputs.iter().zip(&self.signature.inputs).enumerate() {
            let shards = &a.array().shards;
            let expected = ElementType::from(info.local.dtype);
            let fits = shards.len() == n
                && shards.iter().zip(self.exe.device_indices()).all(|(b, &d)| {
                    b.device_index() == d
                        && b.dims() == info.local.dims.as_slice()
                        && b.element_type() == expected
                });
            if !fits {
                return Err(CollectiveError::operand(
                    format!("run_on_devices: input #{i}"),
                    format!(
                        "it is not the program's shard {} on each of its {n} devices (global {}, \
                         sharded as {}); upload it with this executable",
                        info.local, info.global, info.spec
                    ),
                ));
            }
        }
        let mut lists: Vec<Vec<Argument<'_>>> = (0..n).map(|_| Vec::new()).collect();
        for a in inputs {
            match a {
                MeshArgument::Lent(array) => {
                    for (d, b) in array.shards.iter().enumerate() {
                        lists[d].push(Argument::Lent(b));
                    }
                }
                MeshArgument::Donated(array) => {
                    for (d, b) in array.shards.into_iter().enumerate() {
                        lists[d].push(Argument::Donated(b));
                    }
                }
            }
        }
        let per_device = self.exe.execute_donating(lists)?;
        let mut outputs: Vec<DeviceArray> = (0..self.signature.outputs.len())
            .map(|_| DeviceArray {
                shards: Vec::with_capacity(n),
            })
            .collect();
        for list in per_device {
            for (o, b) in list.into_iter().enumerate() {
                outputs[o].shards.push(b);
            }
        }
        Ok(outputs)
    }
}

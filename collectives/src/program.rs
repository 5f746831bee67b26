//! [`Program`]: a finished SPMD program (StableHLO, manual sharding), and running it on the
//! PJRT runtime's devices.

use std::fmt;

use tessera_hlo::Module;
use tessera_runtime::{Client, CompileOptions, ElementType, HostBuffer, LoadedExecutable};

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
            mesh: self.mesh.clone(),
            signature: self.signature.clone(),
        })
    }
}

/// A compiled [`Program`], loaded on a client's devices.
pub struct Executable<M> {
    exe: LoadedExecutable,
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

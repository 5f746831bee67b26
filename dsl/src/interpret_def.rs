//! Running a kernel definition on the interpreter: instantiate it for the arguments' shapes,
//! then interpret the kernel. Above both instantiation and the interpreter (instantiating runs
//! the interpreter's coverage check, which evaluates index maps); re-exported as
//! [`interpret::run`](crate::interpret::run) and
//! [`interpret::run_on_devices`](crate::interpret::run_on_devices).

use crate::array::HostArray;
use crate::error::KernelError;
use crate::instantiate::{ArgSpec, KernelDef};
use crate::interpret::{run_kernel, run_kernel_on_devices, InterpretOptions};
use crate::ir::DeviceAxis;

/// Instantiates `def` for `args` and runs it. `args` are the kernel's arguments in order
/// (scalar-prefetch arrays, then inputs); returns the outputs in order.
pub fn run(
    def: &KernelDef,
    args: &[HostArray],
    options: &InterpretOptions,
) -> Result<Vec<HostArray>, KernelError> {
    let specs: Vec<_> = args.iter().map(ArgSpec::of).collect();
    let kernel = def.instantiate(&specs, &options.rules)?;
    run_kernel(&kernel, args, options)
}

/// Instantiates `def` on a device mesh (`mesh`: its axes with their sizes) and runs it on
/// every device: `per_device[d]` are device `d`'s arguments. Returns each device's outputs.
pub fn run_on_devices(
    def: &KernelDef,
    mesh: &[DeviceAxis],
    per_device: &[Vec<HostArray>],
    options: &InterpretOptions,
) -> Result<Vec<Vec<HostArray>>, KernelError> {
    let first = per_device.first().map(Vec::as_slice).unwrap_or_default();
    let specs: Vec<_> = first.iter().map(ArgSpec::of).collect();
    let kernel = def.instantiate_on(&specs, mesh, &options.rules)?;
    run_kernel_on_devices(&kernel, per_device, options)
}

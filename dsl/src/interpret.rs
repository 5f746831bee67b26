//! The interpreter, the reference every backend is tested against: the core (`interpreter/`:
//! the machine that runs an instantiated kernel, its DMA and race model, the coverage check
//! instantiation runs) re-exported whole, and [`run`] / [`run_on_devices`], which instantiate
//! a definition for its arguments and then interpret it. This module sits above both
//! instantiation and the core (instantiating runs the core's coverage check, which evaluates
//! index maps on it), so neither imports the other back.

use crate::array::HostArray;
use crate::error::KernelError;
use crate::instantiate::{ArgSpec, KernelDef};
pub use crate::interpreter::*;
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

//! Helpers for a family's XLA programs: what a registered kernel computes, written with the
//! ordinary StableHLO ops an XLA user writes (no kernel), which `tessera bench kernels`
//! times beside the kernel on the same arguments ([`crate::Instance::xla_program`]).

use tessera_dsl::ArgSpec;
use tessera_hlo::{FuncBuilder, HloError, Module, Sharding, TensorType, Value};

/// A shape as StableHLO's dims.
pub fn dims(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&d| d as i64).collect()
}

/// The tensor type of an argument.
pub fn ty(spec: &ArgSpec) -> TensorType {
    TensorType::new(dims(&spec.shape), spec.dtype)
}

/// One replica group of every device, in order.
pub fn group(devices: usize) -> Vec<i64> {
    (0..devices as i64).collect()
}

/// A manually partitioned module of `devices` partitions whose `main` takes each device's
/// `args` and returns `body`'s one result.
pub fn spmd(
    args: &[ArgSpec],
    devices: usize,
    name: &str,
    body: impl FnOnce(&mut FuncBuilder<'_>, &[Value]) -> Result<Value, HloError>,
) -> Result<Module, HloError> {
    let mut module = Module::new(name);
    module.set_num_partitions(devices as u32)?;
    let mut f = module.func("main");
    let values: Vec<Value> = args
        .iter()
        .map(|a| f.arg_with_sharding(ty(a), Sharding::Manual))
        .collect::<Result<_, _>>()?;
    let out = body(&mut f, &values)?;
    f.finish_with_shardings(&[(out, Some(Sharding::Manual))])?;
    Ok(module)
}

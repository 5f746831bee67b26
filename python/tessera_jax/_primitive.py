"""One JAX primitive for every tessera kernel call: `tessera_kernel`, whose static parameter
is the instantiated kernel (`tessera_jax.Kernel`).

- Abstract evaluation: the kernel's output shapes and dtypes, from tessera.
- Lowering, one rule per platform:
  - `tpu`: a `stablehlo.custom_call @tpu_custom_call` with tessera's Mosaic module and
    backend config (the call `tessera compile` builds), operands and results row-major;
  - `cpu`, `cuda`, `rocm`: tessera's StableHLO lowering of the kernel, a module whose
    `@main` is merged into the caller's module (renamed, private; once per module) and
    called with `func.call`.
- A kernel on a device mesh (`kernel.devices > 1`) lowers only inside `shard_map` over
  every axis of a mesh of that many devices (each device's partition id is its device id on
  the kernel's mesh, row-major): on TPU its Mosaic call, whose barrier kernels get their
  `collective_id` numbered per program; elsewhere its SPMD StableHLO (remote copies as
  `collective_permute`s, their channels renumbered for the caller's module).
- Batching (`jax.vmap`) and differentiation are refused with a sentence saying what to do
  instead (`splash_attention` is differentiable through its own `custom_vjp`).

The lowering uses JAX-private APIs (`jax._src.interpreters.mlir.custom_call`, the module
context's symbol table and cache, `ShapedArray`'s manual-axis type for `shard_map`); the
package declares the JAX versions it is tested with (0.10.2 to 0.12.x: CI runs its tests on
jax 0.10.2 and on jax 0.12.0.1), and those tests exercise each of them.
"""

from __future__ import annotations

import functools
import json

import numpy as np

import jax
from jax._src import core as jax_core
from jax._src import sharding_impls
from jax._src.interpreters import mlir as jax_mlir
from jax.extend.core import Primitive
from jax.extend.mlir import ir
from jax.extend.mlir.dialects import func as func_dialect
from jax._src.lib.mlir.dialects import hlo
from jax.interpreters import ad, batching, mlir

from ._arrays import numpy_dtype, tessera_dtype, to_triple
from ._tessera import Kernel, TesseraError

tessera_kernel_p = Primitive("tessera_kernel")
tessera_kernel_p.multiple_results = True


def call(kernel: Kernel, *args, return_check_flags: bool = False):
    """Calls the tessera `kernel` on JAX arrays `args` (its scalar-prefetch and input arrays,
    in `kernel.args` order); returns its outputs as a list. Inside `jax.jit` the call lowers
    to the kernel itself (a Mosaic custom call on TPU, tessera's StableHLO elsewhere).

    A kernel that indexes with run-time data (a page table, a tile list) checks each index
    it cannot prove in range when it runs, on every platform: an out-of-range one is not
    used, and the failure is written to the kernel's check flags (`kernel.check_flags`).
    On concrete arrays `call` reads them and raises `TesseraError` naming the check, the
    kernel line, the value and the grid step instead of returning the outputs. Under
    `jax.jit` the flags are values of the traced program: where one records a failure, a
    `jax.debug.callback` raises the same `TesseraError` on the host, and the jitted call
    fails when its results are awaited (JAX's runtime error, whose message carries the
    sentence). The callback cannot be exported (`jax.export`); to check the flags
    yourself instead, pass `return_check_flags=True`, get `(outputs, flags)` and call
    `raise_on_check_flags(kernel, flags)` on the result (`flags` is `None` for a kernel
    without run-time checks).

    A registry kernel whose entry checks its run-time data (paged attention: every page
    index a sequence uses in the pool, each length within its table row) runs the check on
    the scalar-prefetch arrays (the tables; the data stays on its device) when they are
    concrete, raising `TesseraError` with the sentence naming the sequence, the entry and
    the bound. Under `jax.jit` they are tracers: nothing is checked on the host, and only
    the kernel's own checks remain (its check flags, above, on every platform)."""
    expected = kernel.args
    if len(args) != len(expected):
        names = ", ".join(a[0] for a in expected)
        raise TypeError(
            f"tessera kernel `{kernel.name}` takes {len(expected)} arrays ({names}), "
            f"got {len(args)}"
        )
    for i, (x, (name, _role, shape, dtype)) in enumerate(zip(args, expected)):
        got_shape, got_dtype = tuple(jax.numpy.shape(x)), jax.numpy.result_type(x)
        if got_shape != tuple(shape) or got_dtype != numpy_dtype(dtype):
            raise TypeError(
                f"tessera kernel `{kernel.name}` was instantiated for argument {i} (`{name}`) "
                f"{dtype}{list(shape)}, got {tessera_name(got_dtype)}{list(got_shape)}; "
                "instantiate the kernel for these arguments"
            )
    _check_values(kernel, args)
    outs = tessera_kernel_p.bind(*args, kernel=kernel)
    flags = None
    if kernel.check_flags is not None:
        outs, flags = outs[:-1], outs[-1]
        if return_check_flags:
            pass
        elif isinstance(flags, jax_core.Tracer):
            # Only a failed check calls back to the host: a passing call pays a reduction.
            jax.lax.cond(
                jax.numpy.any(flags[:, 0] != 0),
                lambda f: jax.debug.callback(functools.partial(_raise_on_host, kernel), f),
                lambda f: None,
                flags,
            )
        else:
            raise_on_check_flags(kernel, flags)
    return (outs, flags) if return_check_flags else outs


def raise_on_check_flags(kernel: Kernel, flags) -> None:
    """Raises `TesseraError` when `kernel`'s check flags (from `call(...,
    return_check_flags=True)`, concrete) report a failed run-time index check: the sentence
    names the check, the kernel line, the value and its bound, and the grid step. `None`
    (a kernel without run-time checks) passes."""
    if flags is None:
        return
    if isinstance(flags, jax_core.Tracer):
        raise TesseraError(
            f"tessera_jax.raise_on_check_flags: the check flags of `{kernel.name}` are a "
            "tracer (inside jax.jit, vmap or grad); return them from the traced function "
            "and check the concrete array"
        )
    kernel.raise_on_check_flags(to_triple(flags))


def _raise_on_host(kernel: Kernel, flags) -> None:
    """`raise_on_check_flags` on the flags a jitted `call` hands to the host."""
    raise_on_check_flags(kernel, np.asarray(flags))


def check_inputs(kernel: Kernel, *args) -> None:
    """Runs `kernel`'s run-time data check (its registry entry's: paged attention's page
    table and lengths) on `args`, as `call` takes them, and raises `TesseraError` with the
    sentence naming what is out of range; a kernel without one passes everything. `call`
    does this itself on concrete arrays; this is the check for tables that a jitted function
    will get (under `jax.jit` they are tracers, which no host check can read: a tracer among
    the tables is refused here)."""
    _check_values(kernel, args, tracers_refused=True)


def _check_values(kernel: Kernel, args, *, tracers_refused: bool = False) -> None:
    """The registry entry's run-time data check on the concrete scalar-prefetch arguments
    (the tables: the data arrays stay on their device; a tracer is passed as not at hand)."""
    if not kernel.checks_inputs:
        return
    values = []
    for x, (name, role, _shape, _dtype) in zip(args, kernel.args):
        if role != "scalar_prefetch":
            values.append(None)
        elif isinstance(x, jax_core.Tracer):
            if tracers_refused:
                raise TesseraError(
                    f"tessera_jax.check_inputs: argument `{name}` of `{kernel.name}` is a "
                    "tracer (inside jax.jit, vmap or grad), whose values no host check can "
                    "read; check the concrete arrays before the traced function"
                )
            values.append(None)
        else:
            values.append(to_triple(x))
    if any(v is not None for v in values):
        kernel.check_inputs(values)


def tessera_name(dtype) -> str:
    try:
        return tessera_dtype(dtype)
    except ValueError:
        return str(dtype)


@functools.partial(jax.jit, static_argnames="kernel")
def _compiled(*args, kernel):
    return tessera_kernel_p.bind(*args, kernel=kernel)


@tessera_kernel_p.def_impl
def _impl(*args, kernel):
    # An eager call runs the kernel's lowering, compiled once per kernel and argument types.
    return _compiled(*args, kernel=kernel)


@tessera_kernel_p.def_abstract_eval
def _abstract_eval(*avals, kernel):
    # Inside shard_map an output varies over the manual axes any input varies over (the
    # kernel runs on each device's local blocks).
    varying = frozenset().union(*(a.mat.varying for a in avals))
    outputs = [(shape, dtype) for _name, _role, shape, dtype in kernel.outputs]
    if kernel.check_flags is not None:
        outputs.append((kernel.check_flags, "i32"))
    if not varying:
        return [jax_core.ShapedArray(tuple(shape), numpy_dtype(dtype)) for shape, dtype in outputs]
    mat = jax_core.ManualAxisType(varying=varying)
    return [
        jax_core.ShapedArray(
            tuple(shape),
            numpy_dtype(dtype),
            sharding=jax_core.get_cur_mesh_sharding(),
            manual_axis_type=mat,
        )
        for shape, dtype in outputs
    ]


def _batching_rule(axis_data, args, dims, *, kernel):
    raise NotImplementedError(
        f"tessera kernel `{kernel.name}` cannot be vmapped: a tessera kernel is instantiated "
        "for fixed argument shapes. Put the batch into the kernel's own batch dim "
        "(splash_attention takes [B, H, S, D]), or loop with jax.lax.map"
    )


def _jvp_rule(primals, tangents, *, kernel):
    raise NotImplementedError(
        f"tessera kernel `{kernel.name}` has no derivative rule of its own; differentiate "
        "a function with one (tessera_jax.splash_attention has a custom_vjp over tessera's "
        "backward kernels), or wrap the call in jax.custom_vjp"
    )


batching.fancy_primitive_batchers[tessera_kernel_p] = _batching_rule
ad.primitive_jvps[tessera_kernel_p] = _jvp_rule


def merge_function(ctx: mlir.LoweringRuleContext, kernel: Kernel) -> str:
    """Merges tessera's StableHLO module for `kernel` into the module being lowered, once per
    module; returns the symbol its `@main` got. Every function of tessera's module is renamed
    to a name free in the caller's module (`tessera_<kernel>`, `tessera_<kernel>_<n>` for
    further ones), made private, its uses renamed, then moved into the caller's module."""
    module_ctx = ctx.module_context
    key = ("tessera_kernel", kernel)
    cached = module_ctx.cached_primitive_lowerings.get(key)
    if cached is not None:
        return cached
    source = ir.Module.parse(kernel.stablehlo(), context=module_ctx.context)
    funcs = list(source.body.operations)
    # A mesh kernel's collectives carry channel ids numbered within tessera's module: give
    # them fresh ones of the caller's, which its own collectives also draw from.
    def fresh_channel(op):
        if "channel_handle" in op.attributes:
            op.attributes["channel_handle"] = hlo.ChannelHandle.get(
                module_ctx.new_channel(), hlo.ChannelHandle(op.attributes["channel_handle"]).channel_type
            )
        return ir.WalkResult.ADVANCE

    for op in funcs:
        op.operation.walk(fresh_channel)
    for op in funcs:
        if op.operation.name != "func.func":
            raise TesseraError(
                f"tessera's StableHLO module for `{kernel.name}` holds a `{op.operation.name}`; "
                "only functions can be merged into a JAX program (a tessera bug; please report it)"
            )
    dst_symbols = module_ctx.symbol_table
    src_symbols = ir.SymbolTable(source.operation)
    names = [ir.StringAttr(op.attributes["sym_name"]).value for op in funcs]
    if "main" not in names:
        raise TesseraError(
            f"tessera's StableHLO module for `{kernel.name}` has no @main (a tessera bug; "
            "please report it)"
        )
    taken = set(names)
    renamed = {}
    for name in names:
        base = f"tessera_{kernel.name}" if name == "main" else f"tessera_{kernel.name}_{name}"
        fresh, n = base, 0
        while fresh in dst_symbols or fresh in taken:
            n += 1
            fresh = f"{base}_{n}"
        taken.add(fresh)
        renamed[name] = fresh
    private = ir.StringAttr.get("private")
    for op, name in zip(funcs, names):
        src_symbols.set_symbol_name(op, renamed[name])
        op.attributes["sym_visibility"] = private
    for old, new in renamed.items():
        for op in funcs:
            ir.SymbolTable.replace_all_symbol_uses(old, new, op)
    for op in funcs:
        module_ctx.module.body.append(op)
        dst_symbols.insert(op)
    module_ctx.cached_primitive_lowerings[key] = renamed["main"]
    return renamed["main"]


def _check_mesh(ctx: mlir.LoweringRuleContext, kernel: Kernel) -> None:
    """A kernel on a mesh lowers only inside shard_map over every axis of a mesh of its
    device count (each device's partition id is then its device id)."""
    if kernel.devices == 1:
        return
    axis_ctx = ctx.module_context.axis_context
    axes = ", ".join(f"{a}={n}" for a, n in kernel.mesh)
    manual = isinstance(axis_ctx, sharding_impls.SPMDAxisContext) and axis_ctx.manual_axes == frozenset(
        axis_ctx.mesh.axis_names
    )
    if not manual:
        raise NotImplementedError(
            f"tessera kernel `{kernel.name}` runs on a mesh of {kernel.devices} devices "
            f"({axes}), each on its own arguments; call it inside jax.shard_map over every "
            f"axis of a mesh of {kernel.devices} devices"
        )
    if axis_ctx.mesh.size != kernel.devices:
        raise NotImplementedError(
            f"tessera kernel `{kernel.name}` was instantiated for {kernel.devices} devices "
            f"({axes}), but the shard_map's mesh has {axis_ctx.mesh.size} "
            f"({dict(axis_ctx.mesh.shape)}); instantiate it with devices={axis_ctx.mesh.size}"
        )


def _inline_lowering(ctx: mlir.LoweringRuleContext, *args, kernel):
    _check_mesh(ctx, kernel)
    callee = merge_function(ctx, kernel)
    result_types = [mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out]
    call_op = func_dialect.CallOp(result_types, ir.FlatSymbolRefAttr.get(callee), list(args))
    return call_op.results


def _numbered_collective(ctx: mlir.LoweringRuleContext, backend_config: str) -> str:
    """`backend_config` with the kernel's `collective_id` (a kernel that meets at the
    barrier semaphore) numbered within the module being lowered: one id per distinct kernel,
    from 0, as tessera's own programs number them."""
    config = json.loads(backend_config)
    call = config["custom_call_config"]
    if "collective_id" not in call:
        return backend_config
    ids = ctx.module_context.cached_primitive_lowerings.setdefault(("tessera_collective_ids",), {})
    call["collective_id"] = ids.setdefault(call["body"], len(ids))
    return json.dumps(config)


def _row_major(aval) -> list[int]:
    return list(range(len(aval.shape) - 1, -1, -1))


def _tpu_lowering(ctx: mlir.LoweringRuleContext, *args, kernel):
    axis_ctx = ctx.module_context.axis_context
    automatic = (
        isinstance(axis_ctx, sharding_impls.ShardingContext) and axis_ctx.num_devices != 1
    ) or (
        isinstance(axis_ctx, sharding_impls.SPMDAxisContext)
        and axis_ctx.manual_axes != frozenset(axis_ctx.mesh.axis_names)
    )
    if automatic:
        raise NotImplementedError(
            f"tessera kernel `{kernel.name}` is a Mosaic custom call, which XLA cannot "
            "partition automatically; call it inside jax.shard_map over every mesh axis"
        )
    _check_mesh(ctx, kernel)
    config = kernel.mosaic()
    backend_config = _numbered_collective(ctx, config["backend_config"])
    order = config["operand_order"]
    # One past the arguments: the zeros the kernel's check flags start from.
    zeros = None
    if kernel.check_flags is not None:
        zeros = mlir.ir_constant(np.zeros(kernel.check_flags, np.int32))
        flags_aval = jax_core.ShapedArray(tuple(kernel.check_flags), np.int32)
    operands = [args[i] if i < len(args) else zeros for i in order]
    avals_in = [ctx.avals_in[i] if i < len(args) else flags_aval for i in order]
    call_op = jax_mlir.custom_call(
        "tpu_custom_call",
        result_types=[mlir.aval_to_ir_type(ctx.module_context, a) for a in ctx.avals_out],
        operands=operands,
        backend_config=backend_config,
        api_version=1,
        operand_layouts=[_row_major(a) for a in avals_in],
        result_layouts=[_row_major(a) for a in ctx.avals_out],
        extra_attributes={"kernel_name": ir.StringAttr.get(config["kernel_name"])},
        # An output that is an input's buffer (the kernel's `#[alias]`): XLA reuses it.
        operand_output_aliases={
            operand: output for output, operand in config["output_operand_aliases"]
        }
        or None,
    )
    return call_op.results


mlir.register_lowering(tessera_kernel_p, _tpu_lowering, platform="tpu")
for _platform in ("cpu", "cuda", "rocm"):
    mlir.register_lowering(tessera_kernel_p, _inline_lowering, platform=_platform)

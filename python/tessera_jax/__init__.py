"""tessera kernels as JAX functions.

tessera is a Pallas-like kernel DSL in Rust; this package puts its kernels into JAX programs
through the tessera library itself (a Rust extension, no subprocess):

- `kernels()` lists the registry's kernels and their parameters; `kernel(name, params,
  args)` instantiates one; `describe(k)` gives its Mosaic custom-call config, the StableHLO
  text of its portable lowering and its output shapes; `run_reference(k, *arrays)` runs it in
  tessera's interpreter.
- `call(k, *arrays)` calls a kernel from JAX: one `tessera_kernel` primitive, lowered to a
  Mosaic `tpu_custom_call` on TPU and to tessera's StableHLO elsewhere.
- `splash_attention(q, k, v, mask=..., block_sizes=BlockSizes(...))`: differentiable splash
  attention over tessera's forward and backward kernels (jit, grad, shard_map).
- `use_tessera_libtpu()` points JAX at the libtpu tessera pins, for compiling for a TPU
  topology on a machine without a TPU; `compiled_kernel_vmem(compiled)` reads the scoped
  VMEM the compiler gave each Mosaic kernel.

Errors from tessera are `TesseraError`s carrying tessera's sentence.
"""

from ._tessera import Kernel, TesseraError
from ._kernels import describe, kernel, kernels, run_reference
from ._primitive import call, tessera_kernel_p
from ._tpu import compiled_kernel_vmem, use_tessera_libtpu
from .splash import BlockSizes, splash_attention

__all__ = [
    "BlockSizes",
    "Kernel",
    "TesseraError",
    "call",
    "compiled_kernel_vmem",
    "describe",
    "kernel",
    "kernels",
    "run_reference",
    "splash_attention",
    "tessera_kernel_p",
    "use_tessera_libtpu",
]

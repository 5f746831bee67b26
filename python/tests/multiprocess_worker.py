"""One process of test_multiprocess.py's program: the Ulysses layer of examples/ulysses.py
(all_to_all, tessera splash attention, inverse all_to_all, under `jax.shard_map`), its output
and `jax.grad` (dq, dk, dv) of a scalar loss, on a mesh of 4 CPU devices spread over
`--processes` processes joined by JAX's distributed runtime (gloo doing the collectives across
processes). Writes each of its addressable shards as a .npy file into OUT_DIR, with a
manifest (`manifest.process<I>.json`) giving each file's index into the global array.

    python multiprocess_worker.py OUT_DIR --processes 2 --process-id I --port PORT
    python multiprocess_worker.py OUT_DIR --processes 1    # the reference: 4 devices, 1 process

Not a test module (pytest collects test_*.py only); test_multiprocess.py starts it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DEVICES = 4
B, H, KV_HEADS, S, D = 1, 8, 4, 512, 64  # GQA; both head counts divisible by 4 devices
BLOCK = 128


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--processes", type=int, choices=(1, 2), required=True)
    parser.add_argument("--process-id", type=int, default=0)
    parser.add_argument("--port", type=int)
    args = parser.parse_args()
    if args.processes > 1 and args.port is None:
        parser.error("--port is needed with more than one process")
    return args


def cpu_devices_per_process(processes: int) -> None:
    """Before JAX creates its CPU backend: this process's share of the 4 devices, replacing a
    device count inherited from the caller's environment (the test session's conftest sets 4)."""
    flags = [
        f
        for f in os.environ.get("XLA_FLAGS", "").split()
        if not f.startswith("--xla_force_host_platform_device_count")
    ]
    flags.append(f"--xla_force_host_platform_device_count={DEVICES // processes}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
    os.environ["JAX_PLATFORMS"] = "cpu"


def inputs():
    """q, k, v and the loss's cotangent weights, the same in every process."""
    import numpy as np

    rng = np.random.default_rng(0)
    return [
        rng.uniform(-1, 1, shape).astype(np.float32)
        for shape in [(B, H, S, D), (B, KV_HEADS, S, D), (B, KV_HEADS, S, D), (B, H, S, D)]
    ]


def main() -> None:
    args = parse_args()
    cpu_devices_per_process(args.processes)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    import tessera_jax as tj
    from ulysses import ulysses_attention

    if args.processes > 1:
        try:
            # gloo: the cross-process collectives of JAX's CPU client (the default in the JAX
            # versions tested; set for those where it is not).
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        except AttributeError:  # "Unrecognized config option": a JAX without the option
            pass
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{args.port}",
            num_processes=args.processes,
            process_id=args.process_id,
        )

    mesh = jax.make_mesh((DEVICES,), ("context",), devices=jax.devices())
    seq = NamedSharding(mesh, P(None, None, "context", None))
    q, k, v, dout = (
        jax.make_array_from_callback(x.shape, seq, lambda index, x=x: x[index])
        for x in inputs()
    )
    blocks = tj.BlockSizes(block_q=BLOCK, block_kv=BLOCK)

    def loss(q, k, v, dout):
        out = ulysses_attention(q, k, v, mesh=mesh, mask="causal", block_sizes=blocks)
        return jnp.sum(out * dout), out

    grads, out = jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v, dout)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    pid = jax.process_index()
    shards = []
    for name, array in zip(("out", "dq", "dk", "dv"), (out, *grads)):
        for shard in array.addressable_shards:
            file = f"{name}.process{pid}.device{shard.device.id}.npy"
            np.save(args.out_dir / file, np.asarray(shard.data))
            index = [list(s.indices(n)[:2]) for s, n in zip(shard.index, array.shape)]
            shards.append({"name": name, "file": file, "index": index, "shape": array.shape})
    manifest = {
        "process_index": pid,
        "process_count": jax.process_count(),
        "devices": jax.device_count(),
        "local_devices": jax.local_device_count(),
        "jax": jax.__version__,
        "shards": shards,
    }
    (args.out_dir / f"manifest.process{pid}.json").write_text(json.dumps(manifest, indent=1))
    if args.processes > 1:
        jax.distributed.shutdown()


if __name__ == "__main__":
    main()

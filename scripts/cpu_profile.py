"""Where a CPU step's time goes: self time per op class in the compiled program.

Runs a program on JAX's CPU client (jaxlib's XLA, the same XLA as tessera's default plugin,
`lammps-jax-pjrt-cpu` 0.11.2, to within a release) with XLA's per-thunk trace events on
(`--xla_cpu_enable_xprof_traceme`), under `jax.profiler`, and sums each event's self time
(its duration less that of the events nested in it on the same thread) by the class of the
HLO instruction it ran: matmul (dots and fusions holding one), collective (all-to-all,
all-reduce, ... including the time a device waits for the others), elementwise (other
fusions), reduce, data movement (copy, transpose, slice, concatenate, gather, scatter, ...),
loop (a while's own bookkeeping: its condition and the time between body thunks) and other.
Every device runs on its own threads, so a class's time is summed over the devices: divide by
the device count for a per-device step, and expect waiting in collectives to stand for
imbalance elsewhere.

Programs:
  `stablehlo FILE`: a StableHLO module as tessera dumps it (`train --dump-hlo FILE`,
  `tessera attention ... --dump-hlo`): its `sdy.mesh` and `mhlo.num_partitions` give the
  devices, its parameters' `sdy.sharding`s the arguments' layout (random normals * 0.02 for
  floats, zeros for integers).
  `twin MODEL`: the JAX twin's train step (`scripts/cpu_twin.py`, tiny or small), or
  `twin ulysses`: its Ulysses attention forward + backward (B=1 H=8 S=4096 D=64, causal; the
  program `tessera attention --strategy ulysses --dump-hlo FILE` writes as FILE's `.bwd`).

Needs a Python >= 3.12 venv with `jax==0.12.0.1` (as `scripts/cpu_twin.py`).
"""

import argparse
import collections
import os
import re
import sys
import tempfile
import time


def device_count_of(path):
    if not os.path.isfile(path):
        sys.exit(f"cpu_profile: {path} is not a file; dump a step with "
                 "`target/release/examples/train --steps 1 --dump-hlo FILE`")
    with open(path) as f:
        head = f.read(4096)
    m = re.search(r"mhlo\.num_partitions = (\d+)", head)
    return int(m.group(1)) if m else 1


def parse_args():
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--runs", type=int, default=10, help="traced runs (after 3 untraced)")
    common.add_argument("--top", type=int, default=12, help="instructions listed by self time")
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("stablehlo", parents=[common], help="a StableHLO file tessera dumped")
    s.add_argument("file")
    t = sub.add_parser("twin", parents=[common],
                       help="the JAX twin's train step, or its Ulysses forward + backward")
    t.add_argument("model", choices=["tiny", "small", "ulysses"],
                   help="ulysses: B=1 H=8 S=4096 D=64, causal (cpu_twin.py ulysses' defaults)")
    t.add_argument("--remat-policy", choices=["full", "save_attention"], default="full",
                   help="the train step's (cpu_twin.py's --remat-policy)")
    return ap.parse_args()


ARGS = parse_args()
DEVICES = device_count_of(ARGS.file) if ARGS.what == "stablehlo" else 4
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a venv with libtpu must not look for chips
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "")
    + f" --xla_force_host_platform_device_count={DEVICES}"
    + " --xla_cpu_enable_xprof_traceme=true"
)

import jax  # noqa: E402
import jax.extend  # noqa: E402
from jax._src.lib import xla_client  # noqa: E402  (CompileOptions, DeviceAssignment)
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

DTYPES = {"f32": np.float32, "f64": np.float64, "bf16": jax.numpy.bfloat16,
          "f16": np.float16, "i32": np.int32, "i64": np.int64, "ui32": np.uint32,
          "i8": np.int8, "ui8": np.uint8, "i1": np.bool_}

COLLECTIVES = ("all-to-all", "all-reduce", "all-gather", "collective-permute",
               "reduce-scatter", "collective-broadcast")
MOVEMENT = ("copy", "transpose", "slice", "dynamic-slice", "dynamic-update-slice",
            "concatenate", "gather", "scatter", "pad", "broadcast", "reshape", "bitcast",
            "iota", "reverse", "sort")


# ---------------------------------------------------------------- the programs


def main_signature(text):
    """`[(dims, dtype, per-dimension mesh axes)]` of `@main`'s parameters."""
    start = text.index("func.func public @main(")
    depth, i = 0, start + len("func.func public @main")
    while True:
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            break
        i += 1
    params = re.split(r"%arg\d+: ", text[start:i])[1:]
    sig = []
    for p in params:
        ty = re.match(r"tensor<([^>]*)>", p).group(1).split("x")
        dims, dtype = [int(d) for d in ty[:-1]], ty[-1]
        m = re.search(r"#sdy\.sharding<@\w+, \[(.*?)\]>", p)
        axes = []
        if m:
            for dim in re.findall(r"\{([^}]*)\}", m.group(1)):
                axes.append(tuple(re.findall(r'"(\w+)"', dim)))
        axes += [()] * (len(dims) - len(axes))
        sig.append((dims, dtype, axes))
    return sig


def stablehlo_program(path):
    """(run, compiled text): `run()` runs the module once on fresh arguments, waiting for it."""
    text = open(path).read()
    devices = jax.devices("cpu")[:DEVICES]
    m = re.search(r"#sdy\.mesh<\[(.*?)\]>", text)
    axes = re.findall(r'"(\w+)"=(\d+)', m.group(1)) if m else [("devices", str(DEVICES))]
    mesh = Mesh(np.array(devices).reshape([int(n) for _, n in axes]), [a for a, _ in axes])
    backend = jax.extend.backend.get_backend("cpu")
    options = xla_client.CompileOptions()
    options.num_replicas, options.num_partitions = 1, DEVICES
    build = options.executable_build_options
    build.use_spmd_partitioning = DEVICES > 1
    build.use_shardy_partitioner = True
    build.num_partitions = DEVICES
    build.device_assignment = xla_client.DeviceAssignment.create(
        np.arange(DEVICES).reshape(1, DEVICES))
    exe = backend.compile_and_load(text, xla_client.DeviceList(tuple(devices)),
                                   options)
    rng = np.random.default_rng(0)
    host, shardings = [], []
    for dims, dtype, dim_axes in main_signature(text):
        np_type = DTYPES[dtype]
        if np.issubdtype(np.dtype(np_type), np.floating) or dtype == "bf16":
            host.append((rng.standard_normal(dims) * 0.02).astype(np_type))
        else:
            host.append(np.zeros(dims, np_type))
        spec = P(*[None if not a else a[0] if len(a) == 1 else a for a in dim_axes])
        shardings.append(NamedSharding(mesh, spec))

    def run():
        # Donated parameters are consumed: every run gets fresh device arrays.
        args = [jax.device_put(x, s) for x, s in zip(host, shardings)]
        jax.block_until_ready(args)
        outs = exe.execute_sharded(args).disassemble_into_single_device_arrays()
        jax.block_until_ready(outs)

    return run, "\n".join(m.to_string() for m in exe.hlo_modules())


def twin_program(model):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import cpu_twin

    if model == "ulysses":
        shape = argparse.Namespace(batch=1, heads=8, seq=4096, head_dim=64)
        attention = cpu_twin.JaxUlysses(shape)
        inputs = [jax.device_put(x, attention.seq_sharding)
                  for x in (attention.q, attention.k, attention.v, attention.dout)]
        compiled = attention.forward_backward.lower(*inputs).compile()
        return attention.time_forward_backward, compiled.as_text()
    trainer = cpu_twin.JaxTrain(model, steps=1000, remat_policy=ARGS.remat_policy)

    def run():
        trainer.step()

    lowered = trainer.step_fn.lower(*trainer.state, jax.numpy.zeros(3, np.float32),
                                    trainer.positions, trainer.positions, trainer.positions)
    return run, lowered.compile().as_text()


# ---------------------------------------------------------------- classes


def instruction_classes(hlo_text):
    """(HLO instruction name -> op class, name -> what it computes: its result's type and,
    for a matmul, its dot's operands), from the compiled module's text."""
    dots_of, parsed, types = collections.defaultdict(list), {}, {}
    computation = None
    for line in hlo_text.splitlines():
        header = re.match(r"\s*(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if header and "=" not in line.split("{")[0]:
            computation = header.group(1)
            continue
        m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+) = (\S+?)(?:\{[^}]*\})? ([\w\-]+)\(", line)
        if not m:
            m = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+) = (.*?) ([\w\-]+)\(", line)
        if not m:
            continue
        name, result, opcode = m.groups()
        types[name] = result
        if opcode in ("dot", "convolution") and computation:
            # Operands print as names (their types where they are defined, earlier).
            operands = re.search(opcode + r"\((.*?)\)", line)
            names = re.findall(r"%?([\w.\-]+)", operands.group(1)) if operands else []
            shapes = [types.get(n, n) for n in names]
            dots_of[computation].append(" x ".join(shapes))
            dots_of[name].append(" x ".join(shapes))  # an unfused dot's own operands
        calls = re.search(r"calls=%?([\w.\-]+)", line)
        parsed[name] = (opcode, result, calls.group(1) if calls else None)
    classes, what = {}, {}
    for name, (opcode, result, called) in parsed.items():
        dots = dots_of.get(name if opcode in ("dot", "convolution") else called, [])
        if opcode in ("dot", "convolution") or (opcode == "fusion" and dots):
            cls = "matmul"
        elif any(opcode.startswith(c) for c in COLLECTIVES):  # and their -start / -done
            cls = "collective"
        elif opcode == "fusion":
            cls = "elementwise"
        elif opcode in ("reduce", "reduce-window"):
            cls = "reduce"
        elif opcode in MOVEMENT:
            cls = "data movement"
        elif opcode in ("while", "conditional", "call"):
            cls = "loop"
        else:
            cls = "other"
        classes[name] = cls
        what[name] = result + (f" = {'; '.join(dots)}" if dots else "")
    return classes, what


def classify(event_name, classes):
    if event_name in classes:
        return classes[event_name]
    base = event_name.split(":")[0].strip()
    if base in classes:
        return classes[base]
    lowered = event_name.lower()
    if "rendezvous" in lowered or any(c in lowered for c in COLLECTIVES):
        return "collective"
    if "matmul" in lowered:
        return "matmul"
    return None  # not an instruction (runtime bookkeeping): left out


def self_times(trace_dir):
    """(instruction or event name -> self ns, -> events), summed over threads, from the host
    plane."""
    from jax.profiler import ProfileData

    [path] = [os.path.join(d, f) for d, _, fs in os.walk(trace_dir) for f in fs
              if f.endswith(".xplane.pb")]
    data = ProfileData.from_file(path)
    totals, counts = collections.Counter(), collections.Counter()
    for plane in data.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            events = sorted(((e.start_ns, e.duration_ns, e.name) for e in line.events),
                            key=lambda e: (e[0], -e[1]))
            stack = []  # [end, name, duration, time of the events nested in it]

            def close(frame):
                end, name, dur, nested = frame
                totals[name] += dur - nested
                counts[name] += 1

            for start, dur, name in events:
                while stack and stack[-1][0] <= start:
                    close(stack.pop())
                if stack:
                    stack[-1][3] += dur
                stack.append([start + dur, name, dur, 0])
            while stack:
                close(stack.pop())
    return totals, counts


def main():
    run, hlo_text = (stablehlo_program(ARGS.file) if ARGS.what == "stablehlo"
                     else twin_program(ARGS.model))
    for _ in range(3):
        run()
    classes, computes = instruction_classes(hlo_text)
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        start = time.perf_counter()
        for _ in range(ARGS.runs):
            run()
        wall = (time.perf_counter() - start) / ARGS.runs
        jax.profiler.stop_trace()
        totals, counts = self_times(trace_dir)
    by_class, by_instruction = collections.Counter(), collections.Counter()
    events = collections.Counter()
    outside = collections.Counter()
    for name, ns in totals.items():
        cls = classify(name, classes)
        if cls is None:
            outside[name] += ns / ARGS.runs / 1e6
            continue
        by_class[cls] += ns / ARGS.runs / 1e6
        events[cls] += counts[name] / ARGS.runs
        by_instruction[(name, cls)] += ns / ARGS.runs / 1e6
    what = ARGS.file if ARGS.what == "stablehlo" else f"JAX twin {ARGS.model}"
    print(f"{what}: {wall * 1e3:.1f} ms a run (traced), {DEVICES} devices, jax {jax.__version__}")
    total = sum(by_class.values())
    print(f"self time summed over the devices' threads: {total:.1f} ms a run")
    for cls, ms in by_class.most_common():
        print(f"  {cls:<14} {ms:8.1f} ms  {100 * ms / total:5.1f}%  {events[cls]:7.0f} events")
    print(f"not an instruction (the runtime's own events, left out): "
          f"{sum(outside.values()):.1f} ms, most in "
          + ", ".join(f"{n} {ms:.1f}" for n, ms in outside.most_common(3)))
    print(f"top {ARGS.top} instructions:")
    for (name, cls), ms in by_instruction.most_common(ARGS.top):
        print(f"  {name:<24} {cls:<14} {ms:8.2f} ms  {computes.get(name, '')}")


if __name__ == "__main__":
    main()

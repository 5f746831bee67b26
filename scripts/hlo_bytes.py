#!/usr/bin/env python3
"""Which HLO ops of a compiled program move its bytes: a breakdown of the bytes accessed per op
of an XLA `*after_optimizations.txt` dump (e.g. libtpu's, from
`XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_text" tessera compile --target tpu:.. train ..`).

Per top-level instruction (the entry computation, while bodies and conditions, conditional
branches; fused computations, reducers and async wrappers are inside their caller), the bytes
accessed are counted as XLA's HloCostAnalysis counts them for most ops: every operand read
whole plus the output written, at the sizes of their layouts (TPU tiles, e.g. `T(8,128)`, pad
the two minor-most dims). Ops that move nothing (parameter, constant, tuple,
get-tuple-element, bitcast, while/call/conditional themselves, ...) count 0; an async pair
(`collective-permute-start`/`-done`, ...) counts at its start; a dynamic-update-slice (or a
fusion whose root is one) updates in place: it counts its other operands read and written,
not the buffer it updates. A fusion's operand that the fused computation only slices
(`slice`, `dynamic-slice`) counts the slices it reads, as XLA's analysis counts it. A while
body is counted once, as libtpu's cost analysis counts it, and again times its trip count (the
`known_trip_count` XLA records, else `--trips N`: tessera's layer loop runs `layers /
layers_per_iteration` times, which the dump does not say).

Prints the totals per opcode (fusions by kind and the op at their root), the largest ops, and
one JSON line. Usage: scripts/hlo_bytes.py DUMP_after_optimizations.txt [--trips N] [--top N]
"""

import json
import re
import sys
from collections import defaultdict

BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
         "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
         "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1, "token": 0}
FREE = {"collective-permute-done", "all-gather-done", "all-reduce-done", "copy-done",
        "parameter", "constant", "tuple", "get-tuple-element", "bitcast", "while", "call",
        "conditional", "after-all", "partition-id", "replica-id", "opt-barrier",
        "add-dependency", "iota"}
ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](\{[^}]*\})?")
HEAD = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")


def array_bytes(dtype, dims, layout):
    """Bytes of one array with its layout's first tile padding the minor-most dims."""
    size = BYTES.get(dtype)
    if size is None:
        return 0
    dims = [int(d) for d in dims.split(",") if d] if dims else []
    if layout and dims:
        inner = layout[1:-1]
        order, _, tiles = inner.partition(":")
        tile = re.search(r"T\(([0-9,]+)\)", tiles)
        try:
            minor_to_major = [int(x) for x in order.split(",") if x]
        except ValueError:
            minor_to_major = []
        if tile and len(minor_to_major) == len(dims):
            t = [int(x) for x in tile.group(1).split(",")]
            padded = list(dims)
            for k, tk in enumerate(reversed(t)):
                if k < len(minor_to_major):
                    d = minor_to_major[k]
                    padded[d] = -(-padded[d] // tk) * tk
            dims = padded
    n = 1
    for d in dims:
        n *= d
    return n * size


def shape_bytes(text):
    return sum(array_bytes(*m.groups()) for m in ARRAY.finditer(text))


def split_type(rest):
    """`TYPE opcode(operands), attrs` -> (TYPE text, opcode, operands text, attrs text)."""
    depth = 0
    i = 0
    if rest.startswith("("):
        for i, c in enumerate(rest):
            depth += c == "("
            depth -= c == ")"
            if depth == 0:
                break
        type_text, tail = rest[: i + 1], rest[i + 1:].lstrip()
    else:
        type_text, _, tail = rest.partition(" ")
    m = re.match(r"([\w\-]+)\(", tail)
    if not m:
        return type_text, tail.split("(")[0], "", ""
    opcode = m.group(1)
    depth = 0
    start = m.end() - 1
    for j in range(start, len(tail)):
        depth += tail[j] == "("
        depth -= tail[j] == ")"
        if depth == 0:
            break
    return type_text, opcode, tail[start + 1: j], tail[j + 1:]


def parse(path):
    comps = {}
    entry = None
    current = None
    with open(path) as f:
        for line in f:
            if current is None:
                m = COMP.match(line)
                if m and not line[0].isspace() and not line.startswith("HloModule"):
                    current = m.group(2)
                    comps[current] = []
                    if m.group(1):
                        entry = current
                continue
            if line.startswith("}"):
                current = None
                continue
            m = HEAD.match(line)
            if m:
                comps[current].append((m.group(2),) + split_type(m.group(3)))
    return comps, entry


def sliced_params(comps):
    """Per computation, `{parameter index: bytes read}` for each parameter whose every user is
    a `slice` or `dynamic-slice` of it (the bytes of those slices)."""
    out = {}
    for cname, insts in comps.items():
        params = {}
        for name, _, opcode, operands, _ in insts:
            if opcode == "parameter" and operands.strip().isdigit():
                params[name] = int(operands)
        reads = defaultdict(int)
        whole = set()
        for name, type_text, opcode, operands, _ in insts:
            used = re.findall(r"%([\w.\-]+)", operands)
            for k, o in enumerate(used):
                if o not in params:
                    continue
                if opcode in ("slice", "dynamic-slice") and k == 0:
                    reads[o] += shape_bytes(type_text)
                else:
                    whole.add(o)
        out[cname] = {params[p]: b for p, b in reads.items() if p not in whole}
    return out


def main():
    path = sys.argv[1]
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 25
    default_trips = int(sys.argv[sys.argv.index("--trips") + 1]) if "--trips" in sys.argv else 1
    comps, entry = parse(path)
    inside = set()  # computations whose bytes their caller's op counts
    loops = {}  # body -> trip count
    for insts in comps.values():
        for name, _, opcode, _, attrs in insts:
            for key in ("calls", "to_apply"):
                for c in re.findall(key + r"=%?([\w.\-]+)", attrs):
                    inside.add(c)
            for c in re.findall(r"called_computations=\{([^}]*)\}", attrs):
                inside.update(x.strip().lstrip("%") for x in c.split(","))
            if opcode == "while":
                body = re.search(r"body=%?([\w.\-]+)", attrs)
                trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', attrs)
                if body:
                    loops[body.group(1)] = int(trips.group(1)) if trips else default_trips
    # Trip multipliers of nested loops.
    parent = {}
    for cname, insts in comps.items():
        for _, _, opcode, _, attrs in insts:
            for key in ("body", "condition"):
                for c in re.findall(key + r"=%?([\w.\-]+)", attrs):
                    parent[c] = cname
            for c in re.findall(r"branch_computations=\{([^}]*)\}", attrs):
                for x in c.split(","):
                    parent[x.strip().lstrip("%")] = cname

    def multiplier(c):
        m = 1
        while c in parent:
            m *= loops.get(c, 1)
            c = parent[c]
        return m

    sliced = sliced_params(comps)
    fused_root = {}
    for cname, insts in comps.items():
        for _, _, opcode, _, _ in insts[-1:]:
            fused_root[cname] = opcode
    by_op = defaultdict(lambda: [0, 0, 0])  # once, times trips, count
    rows = []
    per_comp = defaultdict(lambda: [0, 1])
    total_once = total_trips = 0
    for cname, insts in comps.items():
        if cname in inside:
            continue
        shapes = {name: type_text for name, type_text, *_ in insts}
        mult = multiplier(cname)
        for name, type_text, opcode, operands, attrs in insts:
            if opcode in FREE:
                continue
            sizes = [shape_bytes(shapes.get(o, "")) for o in
                     re.findall(r"%([\w.\-]+)", operands)]
            if opcode == "fusion":
                callee = re.search(r"calls=%?([\w.\-]+)", attrs)
                for i, read in sliced.get(callee.group(1) if callee else "", {}).items():
                    if i < len(sizes):
                        sizes[i] = min(sizes[i], read)
            if sum(sizes) == 0 and operands:
                sizes = [shape_bytes(operands)]  # operands printed with their types
            written = shape_bytes(type_text)
            root = opcode
            if opcode == "fusion":
                callee = re.search(r"calls=%?([\w.\-]+)", attrs)
                root = fused_root.get(callee.group(1), "?") if callee else "?"
            if root == "dynamic-update-slice" and written in sizes:
                sizes.remove(written)  # the buffer updated in place
                written = sum(sizes)
            b = sum(sizes) + written
            label = opcode
            if opcode == "fusion":
                kind = re.search(r"kind=(\w+)", attrs)
                label = f"fusion {kind.group(1) if kind else '?'} -> {root}"
            elif opcode == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', attrs)
                label = f"custom-call {target.group(1) if target else '?'}"
            by_op[label][0] += b
            by_op[label][1] += b * mult
            by_op[label][2] += 1
            total_once += b
            total_trips += b * mult
            per_comp[cname][0] += b
            per_comp[cname][1] = mult
            rows.append((b * mult, b, mult, name, label, type_text[:80], cname))
    print(f"{path}: {total_once / 1e12:.3f} TB accessed with loop bodies counted once "
          f"(as libtpu's cost analysis), {total_trips / 1e12:.3f} TB with their trip counts "
          f"{sorted(set(loops.values()))}")
    print("per computation (GB once, trips):")
    for cname, (b, mult) in sorted(per_comp.items(), key=lambda kv: -kv[1][0] * kv[1][1])[:8]:
        print(f"  {cname:<46} {b / 1e9:10.2f} x{mult}")
    print(f"{'op':<48} {'GB once':>10} {'GB x trips':>11} {'share':>6} {'ops':>6}")
    for label, (once, trips, n) in sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]:
        print(f"{label:<48} {once / 1e9:>10.2f} {trips / 1e9:>11.2f} "
              f"{100 * trips / max(total_trips, 1):>5.1f}% {n:>6}")
    print(f"largest ops (GB x trips, GB once, trips, name, op, shape, computation):")
    for r in sorted(rows, reverse=True)[:top]:
        print(f"  {r[0] / 1e9:8.2f} {r[1] / 1e9:8.2f} x{r[2]:<3} {r[3]:<28} {r[4]:<34} {r[5]}  [{r[6]}]")
    print(json.dumps({
        "bytes_once": total_once, "bytes_with_trips": total_trips,
        "by_op": {k: {"bytes_once": v[0], "bytes_with_trips": v[1], "ops": v[2]}
                  for k, v in sorted(by_op.items(), key=lambda kv: -kv[1][1])},
    }))


if __name__ == "__main__":
    main()

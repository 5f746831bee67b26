#!/usr/bin/env python3
"""Reads memcheck's XML report of one test binary (runtime/valgrind.sh) and fails on every error
except uninitialised values that the PJRT plugin both created and used.

usage: valgrind_check.py REPORT.xml

The default CPU plugin (lammps-jax-pjrt-cpu) is stripped, so suppressions by symbol match
nothing, and a suppression cannot see where a value came from. This check can
(`--track-origins=yes`): an `UninitCondition` / `UninitValue` error is the plugin's own when
  - its innermost frame outside the C/C++ runtime (libc, libstdc++, libgcc, valgrind's
    preloaded malloc and string functions) is in the plugin: the plugin branches on the value;
  - and its origin's innermost frame outside that runtime is in the plugin too: the plugin
    allocated the memory (heap) or owns the stack frame it was left in.
An uninitialised value tessera hands the plugin has a tessera origin and fails. Everything else
(invalid reads, writes and frees, overlapping copies, definitely lost blocks, an unknown
origin) fails. The plugin is any object under a `pjrt-plugins/` cache directory (how
tessera-runtime provisions plugins) or the library $TESSERA_PJRT_PLUGIN names.
"""
import os
import sys
import xml.etree.ElementTree as ET

RUNTIME = ("vgpreload_", "libc.so", "libc-", "ld-linux", "libstdc++", "libgcc_s", "libm.so")
UNINIT = ("UninitCondition", "UninitValue")
override = os.environ.get("TESSERA_PJRT_PLUGIN")
override = os.path.realpath(override) if override else None


def obj(frame):
    return frame.findtext("obj") or ""


def in_plugin(frame):
    o = obj(frame)
    return "/pjrt-plugins/" in o or (override is not None and os.path.realpath(o) == override)


def first_outside_runtime(stack):
    for f in stack.findall("frame"):
        if not os.path.basename(obj(f)).startswith(RUNTIME):
            return f
    return None


def plugin_internal(error):
    if error.findtext("kind") not in UNINIT:
        return False
    stacks = error.findall("stack")
    if len(stacks) != 2 or not (error.findtext("auxwhat") or "").startswith(
        "Uninitialised value was created by"
    ):
        return False  # no origin: cannot tell whose value it is
    use, origin = (first_outside_runtime(s) for s in stacks)
    return use is not None and origin is not None and in_plugin(use) and in_plugin(origin)


def describe(error):
    lines = [f"{error.findtext('kind')}: {error.findtext('what') or error.findtext('xwhat/text')}"]
    for i, stack in enumerate(error.findall("stack")):
        if i == 1:
            lines.append(f"  {error.findtext('auxwhat')}")
        for f in stack.findall("frame")[:16]:
            where = f.findtext("fn") or "???"
            if f.findtext("file"):
                where += f" ({f.findtext('file')}:{f.findtext('line')})"
            lines.append(f"    {os.path.basename(obj(f))}: {where}")
    return "\n".join(lines)


def main():
    root = ET.parse(sys.argv[1]).getroot()
    counts = {
        p.findtext("unique"): int(p.findtext("count"))
        for p in root.findall("errorcounts/pair")
    }
    ours, bad = [0, 0], []
    for e in root.findall("error"):
        n = counts.get(e.findtext("unique"), 1)
        if plugin_internal(e):
            ours[0] += 1
            ours[1] += n
        else:
            bad.append((n, e))
    print(
        f"{ours[1]} uninitialised values created and used inside the plugin ({ours[0]} "
        f"contexts); {sum(n for n, _ in bad)} other errors ({len(bad)} contexts)"
    )
    for n, e in bad:
        print(f"-- {n} x " + describe(e))
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()

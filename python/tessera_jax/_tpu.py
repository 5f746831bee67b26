"""Compiling JAX programs with tessera kernels for a TPU topology on a machine without a TPU:
the libtpu the installed JAX requires, provisioned by tessera, and what the compiler gave
each Mosaic kernel."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import os
import re

from . import _tessera

# The libtpu wheel tessera provisions for the libtpu series each tested JAX's `jax[tpu]`
# requires (`libtpu==0.0.N.*`): JAX's Pallas kernels carry fields an older libtpu rejects
# (jax 0.12's `debug_locations` in libtpu 0.0.42.1), so JAX and libtpu go together.
_LIBTPU_FOR_SERIES = {"0.0.42": "0.0.42.1", "0.0.50": "0.0.50.1"}


def libtpu_series_jax_requires() -> str | None:
    """The libtpu series (`0.0.N`) the installed JAX's `tpu` extra requires, read from its
    metadata; None when it names none."""
    pattern = re.compile(r'\s*libtpu\s*==\s*([0-9.]+?)(?:\.\*)?\s*;.*extra\s*==\s*"tpu"')
    for requirement in importlib.metadata.requires("jax") or []:
        m = pattern.match(requirement)
        if m:
            return m.group(1)
    return None


def _choose_libtpu_wheel() -> None:
    """Asks tessera for the libtpu wheel the installed JAX requires, unless the user chose a
    library or wheel (`TESSERA_LIBTPU`, `TESSERA_LIBTPU_WHEEL`)."""
    if os.environ.get("TESSERA_LIBTPU") or os.environ.get("TESSERA_LIBTPU_WHEEL"):
        return
    series = libtpu_series_jax_requires()
    if series is None:
        return  # tessera's default
    known = _LIBTPU_FOR_SERIES.values()
    version = _LIBTPU_FOR_SERIES.get(series) or (series if series in known else None)
    if version is None:
        raise _tessera.TesseraError(
            f"jax {importlib.metadata.version('jax')} requires libtpu {series}.*, a series "
            f"tessera-jax has not been tested with (tested: "
            f"{', '.join(known)}); set TESSERA_LIBTPU_WHEEL="
            f"libtpu==<version> (or TESSERA_LIBTPU=/path/libtpu.so) to use it"
        )
    os.environ["TESSERA_LIBTPU_WHEEL"] = f"libtpu=={version}"


def use_tessera_libtpu() -> str:
    """Points JAX at the libtpu its `jax[tpu]` requires (0.0.50.1 for jax 0.12.0.1, 0.0.42.1
    for jax 0.10.2), provisioned by tessera (downloaded once into tessera's cache;
    `TESSERA_LIBTPU_WHEEL` or `TESSERA_LIBTPU` choose another), through `TPU_LIBRARY_PATH`
    unless that is set, and sets the environment libtpu needs for compile-only use (no cloud
    metadata queries, several processes at once) where unset. Call it before JAX first
    touches the TPU platform (e.g. `jax.experimental.topologies.get_topology_desc(...,
    platform="tpu")`). Returns the library's path."""
    for name, value in _tessera.libtpu_compile_only_env():
        os.environ.setdefault(name, value)
    # libtpu 0.0.50.1 otherwise writes a line about huge pages to stderr when it starts
    # (tessera_runtime::provision::LIBTPU_NO_HUGEPAGE_TEXT_FLAG says why).
    init_args = os.environ.get("LIBTPU_INIT_ARGS", "")
    if "hugepage_text" not in init_args:
        os.environ["LIBTPU_INIT_ARGS"] = f"{init_args} --hugepage_text=false".strip()
    path = os.environ.get("TPU_LIBRARY_PATH")
    if not path:
        _choose_libtpu_wheel()
        path = _tessera.libtpu_path()
        os.environ["TPU_LIBRARY_PATH"] = path
    return path


_TARGET = 'custom_call_target="tpu_custom_call"'
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+) = ", re.M)
_KERNEL_FUNC = re.compile(r"func\.func @([\w.\-]+)\(")


def compiled_kernel_vmem(compiled) -> list[tuple[str, int]]:
    """The scoped VMEM (bytes) the TPU compiler gave each Mosaic kernel of `compiled` (a
    `jax.stages.Compiled`), in program order, one entry per custom call: read from the
    compiled HLO text, where each `tpu_custom_call`'s backend config carries
    `used_scoped_memory_configs`. A kernel is named by its function in the call's body when
    the body is MLIR text (tessera's), else by its HLO instruction (JAX's Pallas kernels,
    whose bodies are bytecode)."""
    text = compiled.as_text()
    names = [(m.start(), m.group(1)) for m in _INSTRUCTION.finditer(text)]
    calls = [m.start() for m in re.finditer(re.escape(_TARGET), text)]
    decoder = json.JSONDecoder()
    found = []
    for i, at in enumerate(calls):
        end = calls[i + 1] if i + 1 < len(calls) else len(text)
        config_at = text.find("backend_config=", at, end)
        if config_at < 0:
            continue
        config, _ = decoder.raw_decode(text, config_at + len("backend_config="))
        body = config.get("custom_call_config", {}).get("body", "")
        source = base64.b64decode(body).decode("utf-8", errors="replace") if body else ""
        function = _KERNEL_FUNC.search(source)
        # The instruction's name without XLA's `.N` suffix.
        instruction = re.sub(r"\.\d+$", "", max((n for n in names if n[0] < at), default=(0, "?"))[1])
        used = [
            int(c["size"])
            for c in config.get("used_scoped_memory_configs", [])
            if str(c.get("memory_space")) == "1"
        ]
        found.append((function.group(1) if function else instruction, max(used, default=0)))
    return found

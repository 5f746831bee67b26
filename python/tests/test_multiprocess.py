"""A tessera kernel in a multi-process JAX program: the Ulysses layer of examples/ulysses.py
(tessera splash attention between all-to-alls, under `jax.shard_map`) on 2 processes x 2 CPU
devices joined by JAX's distributed runtime (`jax.distributed.initialize`, gloo collectives),
each process's shards of the output and of `jax.grad` (dq, dk, dv) against the same program
run by 1 process on 4 devices. Every run is a subprocess (multiprocess_worker.py): this
session's JAX already has its own 4 devices (conftest.py)."""

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("multiprocess_worker.py")
# For all three processes together; a run takes a few seconds. A hang (a process waiting on
# its peer in the coordinator or a collective) fails the test at this deadline.
TIMEOUT_S = 180
NAMES = ("out", "dq", "dk", "dv")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_all(runs: dict[str, list[str]], logs: Path) -> None:
    """Starts every run at once (`sys.executable WORKER *args`) and waits for all of them;
    fails, killing whatever is still running, when one exits non-zero or the deadline passes,
    showing each run's exit status and stderr."""
    logs.mkdir(parents=True, exist_ok=True)
    procs, killed = {}, set()
    try:
        for name, args in runs.items():
            with open(logs / f"{name}.out", "wb") as out, open(logs / f"{name}.err", "wb") as err:
                procs[name] = subprocess.Popen(
                    [sys.executable, str(WORKER), *args], stdout=out, stderr=err
                )
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            running = [p for p in procs.values() if p.poll() is None]
            # A process that failed may leave its peers waiting on it: stop at the first.
            failed = next(
                (f"{n} exited with status {p.returncode}" for n, p in procs.items()
                 if p.returncode),
                None,
            )
            if failed or not running:
                break
            if time.monotonic() >= deadline:
                failed = f"not finished within {TIMEOUT_S} s: " + ", ".join(
                    n for n, p in procs.items() if p in running
                )
                break
            try:
                running[0].communicate(timeout=0.5)
            except subprocess.TimeoutExpired:
                pass
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
                killed.add(proc)
    if failed:
        report = [failed]
        for name, proc in procs.items():
            err = (logs / f"{name}.err").read_text(errors="replace")
            status = "killed by the test" if proc in killed else f"exit status {proc.returncode}"
            report.append(f"--- {name} ({status}), stderr:\n{err[-6000:]}")
        pytest.fail("\n".join(report), pytrace=False)


def shards(out_dir: Path, process: int) -> tuple[dict, list]:
    """A process's manifest and its shards: (name, index as slices, data)."""
    manifest = json.loads((out_dir / f"manifest.process{process}.json").read_text())
    return manifest, [
        (s["name"], tuple(slice(a, b) for a, b in s["index"]), np.load(out_dir / s["file"]))
        for s in manifest["shards"]
    ]


def test_ulysses_on_2_processes_x_2_devices_equals_1_process_x_4_devices(tmp_path):
    port = str(free_port())
    multi, single = tmp_path / "2x2", tmp_path / "1x4"
    pair = [str(multi), "--processes", "2", "--port", port, "--process-id"]
    run_all(
        {
            "process 0 of 2": [*pair, "0"],
            "process 1 of 2": [*pair, "1"],
            "1 process": [str(single), "--processes", "1"],
        },
        tmp_path / "logs",
    )

    # The reference: 1 process holding all 4 shards of each array, assembled.
    manifest, held = shards(single, 0)
    assert (manifest["process_count"], manifest["devices"]) == (1, 4)
    want, covered = {}, {}
    for name, index, data in held:
        shape = next(s["shape"] for s in manifest["shards"] if s["name"] == name)
        want.setdefault(name, np.full(shape, np.nan, np.float32))[index] = data
        covered.setdefault(name, np.zeros(shape, bool))[index] = True
    assert set(want) == set(NAMES)
    assert all(c.all() for c in covered.values()), "the reference's shards do not cover its arrays"

    # Each process of the pair: its own 2 devices of 4, its shards equal to the reference's.
    covered = {name: np.zeros(want[name].shape, bool) for name in NAMES}
    for process in (0, 1):
        manifest, held = shards(multi, process)
        assert (
            manifest["process_index"],
            manifest["process_count"],
            manifest["devices"],
            manifest["local_devices"],
        ) == (process, 2, 4, 2)
        assert sorted(name for name, _, _ in held) == sorted(NAMES * 2), manifest["shards"]
        for name, index, data in held:
            np.testing.assert_allclose(
                data,
                want[name][index],
                rtol=0,
                atol=1e-6,
                err_msg=f"{name}, process {process}'s shard {index}",
            )
            covered[name][index] = True
    assert all(c.all() for c in covered.values()), "the 2 processes' shards do not cover the arrays"

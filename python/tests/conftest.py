"""The test session: 4 virtual CPU devices (the Ulysses tests), the package's examples
importable, and the `x64` fixture (f64 for the references; not for JAX's own Pallas splash,
which does not lower with x64 on)."""

import os
import sys

# Before JAX creates its CPU backend (on first use, not at import).
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
)
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

import jax  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture
def x64():
    with jax.enable_x64(True):
        yield

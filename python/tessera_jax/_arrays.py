"""Arrays between numpy/JAX and the Rust extension: tessera's dtype names and the
`(bytes, shape, dtype)` triples the extension takes and returns."""

from __future__ import annotations

import ml_dtypes
import numpy as np

#: tessera's dtype names and their numpy dtypes.
DTYPES: dict[str, np.dtype] = {
    "f32": np.dtype(np.float32),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "i32": np.dtype(np.int32),
    "i8": np.dtype(np.int8),
    "bool": np.dtype(np.bool_),
}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a tessera dtype name."""
    return DTYPES[name]


def tessera_dtype(dtype) -> str:
    """The tessera name of a numpy/JAX dtype; a ValueError names the dtypes tessera takes."""
    dtype = np.dtype(dtype)
    for name, d in DTYPES.items():
        if d == dtype:
            return name
    raise ValueError(
        f"tessera kernels take {', '.join(str(d) for d in DTYPES.values())}, not {dtype}"
    )


def to_triple(x) -> tuple[bytes, list[int], str]:
    """A numpy-convertible array as `(bytes, shape, dtype)` (row-major, little-endian)."""
    a = np.ascontiguousarray(np.asarray(x))
    return a.tobytes(), list(a.shape), tessera_dtype(a.dtype)


def from_triple(triple) -> np.ndarray:
    """`(bytes, shape, dtype)` from the extension as a numpy array."""
    data, shape, dtype = triple
    return np.frombuffer(data, dtype=numpy_dtype(dtype)).reshape(shape).copy()

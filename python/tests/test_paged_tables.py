"""Paged attention's page table and lengths from JAX: `call` on concrete arrays, tessera's
interpreter run (`run_reference`) and `check_inputs` refuse a page index outside the pool or
a length outside the table with `TesseraError`'s one sentence naming the sequence, the entry
and the bound; padding past a length and pages shared between sequences run to the f64
reference. Under `jax.jit` the tables are tracers: no host check can read them (documented;
`check_inputs` refuses a tracer and checks the arrays before the jitted call)."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tessera_jax as tj

pytestmark = pytest.mark.usefixtures("x64")

# The registry's defaults: B 4, H 8, KVH 2, D 128, a pool of 64 pages of 16 tokens, 8 entries
# per sequence (4 pages per copy block).
B, H, KVH, D, POOL, PAGE, PER_SEQ = 4, 8, 2, 128, 64, 16, 8
LENGTHS = np.array([128, 93, 64, 29], np.int32)  # entries used: 8, 6, 4, 2


def inputs():
    rng = np.random.default_rng(7)
    q = (0.2 * rng.uniform(-1, 1, (B, H, D))).astype(np.float32)
    k = rng.uniform(-1, 1, (KVH, POOL, PAGE, D)).astype(np.float32)
    v = rng.uniform(-1, 1, (KVH, POOL, PAGE, D)).astype(np.float32)
    # Sequence b's entry j: page (8 b + 7 j) % 64 (distinct, out of order).
    table = np.array(
        [[(8 * b + 7 * j) % POOL for j in range(PER_SEQ)] for b in range(B)], np.int32
    )
    return q, k, v, LENGTHS.copy(), table


def reference(q, k, v, lengths, table):
    """Paged attention in f64, reading only the entries each sequence uses."""
    out = np.zeros((B, H, D))
    for b in range(B):
        n = int(lengths[b])
        if n == 0:
            continue
        pages = table[b, : -(-n // PAGE)]
        for h in range(H):
            g = h // (H // KVH)
            keys = k[g, pages].reshape(-1, D)[:n].astype(np.float64)
            vals = v[g, pages].reshape(-1, D)[:n].astype(np.float64)
            s = keys @ q[b, h].astype(np.float64)
            w = np.exp(s - s.max())
            out[b, h] = (w / w.sum()) @ vals
    return out


def bad_tables():
    """Each bad case: (id, argument index, position, value, sentence)."""
    cases = []
    for page in [64, 100, -1, -(2**31), 2**31 - 1]:
        cases.append(
            pytest.param(
                4, (2, 3), page,
                f"paged attention: sequence 2 reads entry page_indices[2, 3] = {page}, which "
                "is no page of the pool's 64 (0 to 63); its 64 tokens use entries 0 to 3",
                id=f"page{page}",
            )
        )
    for length in [129, -1, -(2**31), 2**31 - 1]:
        cases.append(
            pytest.param(
                3, (1,), length,
                f"paged attention: sequence 1 has length lengths[1] = {length}, outside 0 to "
                "128 (its table row holds 8 pages of 16 tokens)",
                id=f"length{length}",
            )
        )
    return cases


@pytest.fixture(scope="module")
def kernel():
    return tj.kernel("paged_attention", {"dtype": "f32"})


@pytest.mark.parametrize("arg, at, value, sentence", bad_tables())
def test_a_bad_table_is_refused_with_one_sentence(kernel, arg, at, value, sentence):
    args = list(inputs())
    args[arg] = args[arg].copy()
    args[arg][at] = value
    exact = "^" + re.escape(sentence) + "$"
    # Numpy arrays and JAX arrays alike.
    for given in (args, [jnp.asarray(a) for a in args]):
        with pytest.raises(tj.TesseraError, match=exact):
            tj.call(kernel, *given)
        with pytest.raises(tj.TesseraError, match=exact):
            tj.check_inputs(kernel, *given)
    with pytest.raises(tj.TesseraError, match=exact):
        tj.run_reference(kernel, *args)


def test_padding_past_a_length_and_shared_pages_run(kernel):
    q, k, v, lengths, table = inputs()
    # Entries past a sequence's pages are never read: any value.
    table[1, 6:] = [-1, 2**31 - 1]
    table[2, 4:] = [64, 100, -(2**31), -1]
    table[3, 2:] = 1000
    # Sequence 3 reads sequence 0's first two pages.
    table[3, :2] = table[0, :2]
    want = reference(q, k, v, lengths, table)
    tj.check_inputs(kernel, q, k, v, lengths, table)
    eager = np.asarray(tj.call(kernel, q, k, v, lengths, table)[0])
    jitted = np.asarray(jax.jit(lambda *a: tj.call(kernel, *a))(q, k, v, lengths, table)[0])
    ours = tj.run_reference(kernel, q, k, v, lengths, table)[0]
    for label, got in (("eager", eager), ("jit", jitted), ("interpreter", ours)):
        err = np.abs(got.astype(np.float64) - want).max()
        assert err <= 1e-5, f"{label}: {err}"


def test_under_jit_the_tables_are_tracers_and_check_inputs_refuses_them(kernel):
    q, k, v, lengths, table = inputs()
    table[2, 3] = 64

    # What is not checked: inside jax.jit the call sees tracers, so no host check runs
    # (and the StableHLO path on CPU has no in-kernel check): check before the jitted call.
    @jax.jit
    def traced_check(*args):
        tj.check_inputs(kernel, *args)
        return args[0]

    with pytest.raises(tj.TesseraError, match="is a tracer"):
        traced_check(q, k, v, lengths, table)
    with pytest.raises(tj.TesseraError, match=r"page_indices\[2, 3\] = 64"):
        tj.check_inputs(kernel, q, k, v, lengths, table)

"""Every registry kernel called from JAX (on JAX's CPU backend, through tessera's StableHLO)
equals tessera's own run (its interpreter) and an f64 reference; what `describe` returns;
tessera's errors as `TesseraError`; vmap and grad of a raw kernel refused."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import reference
import tessera_jax as tj

pytestmark = pytest.mark.usefixtures("x64")


def random(shape, seed, dtype=np.float32):
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(dtype)


def call_from_jax(k, *arrays):
    return [np.asarray(x) for x in jax.jit(lambda *a: tj.call(k, *a))(*arrays)]


def check(k, arrays, want, tol):
    """`k` from JAX equals tessera's interpreter (to 1e-5 relative to the output's scale)
    and both equal the f64 reference `want` to `tol`; returns JAX's outputs."""
    got = call_from_jax(k, *arrays)
    ours = tj.run_reference(k, *arrays)
    assert len(got) == len(ours) == len(k.outputs)
    for (name, _, shape, _), g, o in zip(k.outputs, got, ours):
        assert g.shape == o.shape == tuple(shape), name
        scale = max(1.0, float(np.abs(o).max()))
        np.testing.assert_allclose(g, o, atol=1e-5 * scale, rtol=0, err_msg=f"{k.name}.{name}")
    for name, w in want.items():
        i = [o[0] for o in k.outputs].index(name)
        for label, x in (("jax", got[i]), ("tessera", ours[i])):
            err = np.abs(x.astype(np.float64) - w).max()
            assert err <= tol, f"{k.name}.{name} ({label}) differs from f64 by {err}"
    return got


def test_the_registry_lists_every_kernel_with_its_parameters():
    listed = {k["name"]: k for k in tj.kernels()}
    assert set(listed) >= {
        "matmul",
        "row_softmax",
        "flash_attention",
        "splash_fwd",
        "splash_bwd_prep",
        "splash_dq",
        "splash_dkv",
        "splash_bwd_fused",
        "splash_dq_reduce",
        "paged_attention",
        "gather_tiles",
        "ring_shift",
        "ring_all_gather",
        "all_gather",
        "all_to_all",
        "all_gather_matmul",
    }
    # The kernels on a device mesh are listed as such; instantiated, they say how many
    # devices they run on (test_mesh_kernels.py calls them under shard_map).
    on_mesh = {name for name, k in listed.items() if k["on_mesh"]}
    assert on_mesh == {
        "ring_shift",
        "ring_all_gather",
        "all_gather",
        "all_to_all",
        "all_gather_matmul",
        "ulysses_attention",
    }
    for name in on_mesh:
        assert tj.kernel(name, {"devices": 2}).devices == 2, name
    assert tj.kernel("matmul").devices == 1
    bm = next(p for p in listed["matmul"]["params"] if p["name"] == "BM")
    assert not bm["size"] and bm["default"] == "128"
    m = next(p for p in listed["matmul"]["params"] if p["name"] == "M")
    assert m["size"] and ("x", 0) in [tuple(s) for s in m["sets"]]


def test_cache_update_keeps_the_unlisted_blocks():
    # `out` is `cache`'s buffer (an aliased output): the blocks the grid does not visit keep
    # the cache's values, on JAX's CPU backend as in tessera's interpreter.
    k = tj.kernel("cache_update", {"dtype": "f32", "N": 3, "R": 64, "C": 128})
    slots = np.array([6, 1, 3], np.int32)
    cache, new = random((64, 128), 11), random((24, 128), 12)
    want = cache.astype(np.float64)
    for i, s in enumerate(slots):
        want[8 * s : 8 * s + 8] = new[8 * i : 8 * i + 8]
    check(k, [slots, cache, new], {"out": want}, 0.0)


def test_matmul():
    k = tj.kernel("matmul", {"BM": 128, "BN": 128, "BK": 128, "M": 256, "N": 128, "K": 256})
    x, y = random((256, 256), 0), random((256, 128), 1)
    check(k, [x, y], {"out": x.astype(np.float64) @ y}, 1e-4)


def test_row_softmax():
    k = tj.kernel("row_softmax", {"BR": 8, "R": 64, "C": 128})
    x = random((64, 128), 2) * 4
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    got = check(k, [x], {"out": e / e.sum(axis=1, keepdims=True)}, 1e-6)
    # An eager call (outside jit) runs the same lowering.
    np.testing.assert_array_equal(np.asarray(tj.call(k, x)[0]), got[0])


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention(causal):
    k = tj.kernel(
        "flash_attention", {"BQ": 64, "BKV": 64, "causal": causal, "S": 256, "D": 64}
    )
    q, kk, v = random((256, 64), 3), random((256, 64), 4), random((256, 64), 5)
    out, _ = reference.attention(
        q[None, None], kk[None, None], v[None, None], mask="causal" if causal else "full"
    )
    check(k, [q, kk, v], {"out": np.asarray(out)[0, 0]}, 1e-5)


# The splash kernels' registry parameters: the sizes here, every other one the default
# (mask causal, blocks 128, f32).
SPLASH = {"B": 1, "H": 4, "KVH": 2, "SQ": 256, "SKV": 256, "D": 64}


@pytest.mark.parametrize("fused", [False, True])
def test_splash_kernels(fused):
    """The registry's splash kernels, each called on the arrays the previous ones produced
    (the plan of one attention: forward, preprocessing, dq + dkv or fused + reduction),
    against the interpreter and the f64 forward, logsumexp and gradients."""
    b, h, kvh, s, d = (SPLASH[n] for n in ("B", "H", "KVH", "SQ", "D"))
    q, k, v, dout = random((b, h, s, d), 6), random((b, kvh, s, d), 7), random(
        (b, kvh, s, d), 8
    ), random((b, h, s, d), 9)
    out, lse = reference.attention(q, k, v, mask="causal")
    _, vjp = jax.vjp(lambda q, k, v: reference.attention(q, k, v, mask="causal")[0], q, k, v)
    dq, dk, dv = (np.asarray(g) for g in vjp(jnp.asarray(dout, jnp.float64)))
    out, lse = np.asarray(out), np.asarray(lse)
    want = {
        "splash_fwd": {"out": out, "lse": lse[:, :, None, :]},
        "splash_bwd_prep": {"di": (out * dout).sum(-1)[:, :, None, :]},
        "splash_dq": {"dq": dq},
        "splash_dkv": {"dk": dk, "dv": dv},
        "splash_bwd_fused": {"dk": dk, "dv": dv},
        "splash_dq_reduce": {"dq": dq},
    }
    plan = tj.splash._plan(
        (b, h, s, d), (b, kvh, s, d), (b, kvh, s, d), "f32", "causal",
        tj.BlockSizes(use_fused_bwd_kernel=fused), False, False, None, None,
    )
    env = {"q": q, "k": k, "v": v, "dout": dout}
    seen = []
    for stage in plan.forward + plan.backward:
        registered = tj.kernel(stage.kernel.name, SPLASH)
        assert registered.ir() == stage.kernel.ir(), f"{stage.kernel.name}: not the registry's"
        args = [np.asarray(a) for a in tj.splash.stage_args(stage, env)]
        got = check(stage.kernel, args, want[stage.kernel.name], 2e-5)
        env.update(zip(stage.outputs, got))
        seen.append(stage.kernel.name)
    if fused:
        assert seen == ["splash_fwd", "splash_bwd_prep", "splash_bwd_fused", "splash_dq_reduce"]
        np.testing.assert_allclose(env["dq_partial"].sum(0), dq, atol=2e-5)
    else:
        assert seen == ["splash_fwd", "splash_bwd_prep", "splash_dkv", "splash_dq"]


def test_describe_gives_the_mosaic_call_the_stablehlo_and_the_outputs():
    k = tj.kernel("matmul", {"BM": 128, "BN": 128, "BK": 128, "dtype": "bf16"})
    info = tj.describe(k)
    assert [a["name"] for a in info["args"]] == ["x", "y"]
    assert info["outputs"] == [jax.ShapeDtypeStruct((256, 256), jnp.float32)]
    assert "func.func public @main(" in info["stablehlo"]
    mosaic = info["mosaic"]
    assert mosaic["kernel_name"] == "matmul"
    assert "func.func @matmul(" in mosaic["body"]
    assert '"custom_call_config"' in mosaic["backend_config"]
    # The dots' flops, and the accumulator's adds.
    assert 2 * 256 * 256 * 512 <= mosaic["cost_estimate"]["flops"] < 1.01 * 2 * 256 * 256 * 512
    assert mosaic["vmem_limit_bytes"] >= 16 << 20
    assert mosaic["operand_order"] == [0, 1]


def test_tessera_errors_are_raised_with_tesseras_sentence():
    with pytest.raises(tj.TesseraError, match="unknown kernel `nope`; built-in kernels: matmul"):
        tj.kernel("nope")
    with pytest.raises(tj.TesseraError, match="kernel `matmul` has no parameter `BX`"):
        tj.kernel("matmul", {"BX": 8})
    # A block that does not tile: fine on the portable backend, refused by the TPU rules.
    k = tj.kernel("matmul", {"BM": 8, "BN": 8, "BK": 8, "M": 64, "N": 64, "K": 64})
    with pytest.raises(tj.TesseraError, match="128"):
        k.mosaic()
    # A VMEM overflow: splash blocks too big for the budget given.
    plan = tj.splash._plan(
        (1, 2, 1024, 128), (1, 2, 1024, 128), (1, 2, 1024, 128), "f32", "causal",
        tj.BlockSizes(block_q=1024, block_kv=1024), False, False, None, None,
    )
    with pytest.raises(tj.TesseraError, match="VMEM"):
        plan.forward[0].kernel.mosaic(vmem_limit_bytes=1 << 20)
    with pytest.raises(tj.TesseraError, match="block sizes"):
        tj.splash_attention(
            *(jnp.zeros((1, 2, 256, 64), jnp.float32),) * 3, mask="causal",
            block_sizes=tj.BlockSizes(block_q=96, block_kv=128),
        )
    with pytest.raises(tj.TesseraError, match="diagonal sub-tiles need square blocks"):
        tj.splash_attention(
            *(jnp.zeros((1, 2, 256, 64), jnp.float32),) * 3, mask="causal",
            block_sizes=tj.BlockSizes(block_q=128, block_kv=256, block_diagonal=64),
        )
    # Negative sizes are sentences too, not Python's OverflowError.
    with pytest.raises(tj.TesseraError, match=r"argument 0 of `matmul` has shape \(-64, 64\)"):
        tj.kernel("matmul", {}, [((-64, 64), "f32"), ((64, 64), "f32")])
    with pytest.raises(tj.TesseraError, match=r"BlockSizes.block_q = -128: a block size is"):
        tj.BlockSizes(block_q=-128)
    with pytest.raises(tj.TesseraError, match=r"BlockSizes.block_kv_dq = 0"):
        tj.BlockSizes(block_kv_dq=0)


def test_a_run_time_index_check_raises_with_the_kernel_line():
    # gather_tiles slices x (in HBM) with its tile list (scalar prefetch): an index the
    # kernel cannot prove in range is checked when it runs (here on JAX's CPU backend,
    # through tessera's StableHLO) and `call` raises instead of returning outputs.
    k = tj.kernel("gather_tiles", {"G": 4, "R": 128, "C": 256})
    assert k.check_flags == [4, 128]
    assert [o[0] for o in k.outputs] == ["out"]
    x = random((128, 256), 3)
    good = np.array([9, 0, 15, 4], np.int32)
    want = np.concatenate([x[8 * t : 8 * t + 8] for t in good])
    np.testing.assert_array_equal(np.asarray(tj.call(k, good, x)[0]), want)
    jitted = jax.jit(lambda t, a: tj.call(k, t, a, return_check_flags=True))
    outs, flags = jitted(good, x)
    np.testing.assert_array_equal(np.asarray(outs[0]), want)
    tj.raise_on_check_flags(k, flags)
    checked = jax.jit(lambda t, a: tj.call(k, t, a))
    np.testing.assert_array_equal(np.asarray(checked(good, x)[0]), want)
    window = (
        "the start of the copy's source `x`'s window along dim 0 is {} at grid step [1], "
        "outside 0 to 120; the access was not made"
    )
    for bad, message in [
        (16, window.format(128)),
        (-1, window.format(-8)),
        (2**29, "536870912 * 8 overflows i32 at grid step [1]"),
    ]:
        tiles = good.copy()
        tiles[2] = bad
        with pytest.raises(tj.TesseraError, match=re.escape(message)) as e:
            tj.call(k, tiles, x)
        assert "kernel `gather_tiles`: kernels/collective/src/memory.rs:" in str(e.value)
        # Under jit the flags come back with the outputs, for the caller to check.
        _, flags = jitted(tiles, x)
        with pytest.raises(tj.TesseraError, match=re.escape(message)):
            tj.raise_on_check_flags(k, flags)
        # Or, without return_check_flags, a host callback raises the same sentence, which
        # the jitted call's runtime error carries.
        with pytest.raises(Exception, match=re.escape(message)) as e:
            jax.block_until_ready(checked(tiles, x))
        assert "TesseraError" in str(e.value), e.value
    # Inside the traced function the flags are a tracer: refused with a sentence.
    with pytest.raises(tj.TesseraError, match="the check flags of `gather_tiles` are a tracer"):
        jax.jit(lambda t, a: tj.raise_on_check_flags(k, tj.call(k, t, a, return_check_flags=True)[1]))(good, x)
    # Flags of another shape are refused with a sentence.
    wrong_shape = r"the check flags given are i32\[2, 2\]; the kernel's are i32\[4, 128\]"
    with pytest.raises(tj.TesseraError, match=wrong_shape):
        tj.raise_on_check_flags(k, np.zeros((2, 2), np.int32))
    # A kernel that indexes only with what it can prove has no flags.
    assert tj.kernel("matmul").check_flags is None


def test_vmap_and_grad_of_a_raw_kernel_are_refused_with_a_sentence():
    k = tj.kernel("row_softmax", {"BR": 8, "R": 64, "C": 128})
    x = random((3, 64, 128), 10)
    with pytest.raises(NotImplementedError, match="cannot be vmapped"):
        jax.vmap(lambda a: tj.call(k, a)[0])(x)
    with pytest.raises(NotImplementedError, match="no derivative rule"):
        jax.grad(lambda a: tj.call(k, a)[0].sum())(x[0])
    with pytest.raises(TypeError, match=r"instantiated for argument 0 \(`x`\) f32\[64, 128\]"):
        tj.call(k, x)

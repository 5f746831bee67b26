"""The JAX twin of tessera's CPU train step and Ulysses attention, timed alternately with tessera.

`train`: the train example's Llama-style model (`tessera_train::ModelConfig`'s tiny and small
presets: RMSNorm, GQA attention with RoPE, SwiGLU MLP, residuals, final RMSNorm, LM head,
summed softmax cross-entropy) on the same 4 virtual CPU devices with Ulysses context
parallelism, written as a JAX user would: `shard_map` over a `context` axis, the decoder layers
as one `lax.scan` over stacked weights with each layer rematerialised in the backward
(`jax.checkpoint`, as tessera's layer loop re-runs each layer's forward), `all_to_all` of q, k,
v and the output, XLA's causal attention (`jax.nn.dot_product_attention`), the gradient through
`jax.grad` (replicated weights' gradients psum'ed by shard_map's transpose), global-norm
clipping and AdamW with decoupled weight decay on the matrices. A step uploads its hyper
parameters and batch from the host and reads back the loss and gradient norm, as
`Trainer::train_step` does. `--remat-policy save_attention` mirrors the train example's flag:
each layer's q, k, v after the all-to-all, the attention's output and the output after the
inverse all-to-all are named (`checkpoint_name`) and saved (`save_only_these_names`), so the
backward re-runs the rest of the layer; XLA's attention has no logsumexp to save, so its
backward recomputes the softmax from the saved q and k.

`ulysses`: `tessera bench context-parallel --strategies ulysses`'s programs (causal attention
over a sequence split on 4 devices: all_to_all, attention, inverse all_to_all), forward and
forward + backward.

Rounds alternate: JAX's steps in this process, then tessera's in a subprocess (its compile
is outside the timed steps); the two never run at once. Each round prints both times and
their ratio; the summary takes the median of the rounds.
"""

import argparse
import functools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

DEVICES = 4
os.environ.setdefault("JAX_PLATFORMS", "cpu")  # a venv with libtpu must not look for chips
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.ad_checkpoint import checkpoint_name  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # noqa: E402

# tessera_train::ModelConfig's presets and TrainConfig::new's defaults.
MODELS = {
    "tiny": dict(vocab=256, d=128, layers=2, heads=8, kv_heads=4, head_dim=16, mlp=384, seq=256),
    "small": dict(vocab=1024, d=512, layers=4, heads=8, kv_heads=4, head_dim=64, mlp=1536,
                  seq=1024),
}
ROPE_THETA, NORM_EPS = 10_000.0, 1e-6
LR, WARMUP, FINAL_LR, B1, B2, EPS, WD, CLIP = 3e-3, 10, 0.1, 0.9, 0.95, 1e-8, 0.1, 1.0
# The values each `--remat-policy` saves for the layer loop's backward (tessera_train's
# RematPolicy): none (`full`: the whole layer re-run), or the attention's.
SAVED = {"full": (), "save_attention": ("attention_q", "attention_k", "attention_v",
                                         "attention_out", "attention_context")}

try:
    from jax import shard_map as _shard_map

    def shard_map(f, mesh, in_specs, out_specs):
        return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
except ImportError:  # jax < 0.7
    from jax.experimental.shard_map import shard_map as _shard_map

    def shard_map(f, mesh, in_specs, out_specs):
        return _shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs,
                          check_rep=False)


def mesh():
    devices = jax.devices("cpu")
    if len(devices) != DEVICES:
        sys.exit(f"cpu_twin: JAX sees {len(devices)} CPU devices, needs {DEVICES} "
                 "(XLA_FLAGS was set too late?)")
    return Mesh(np.array(devices), ("context",))


# ---------------------------------------------------------------- the model


def init_params(m, key):
    """Every layer's matrices stacked `[L, ...]`, as tessera's; normal / sqrt(fan-in)."""
    d, hd, L = m["d"], m["head_dim"], m["layers"]
    shapes = {
        "wq": (L, d, m["heads"] * hd), "wk": (L, d, m["kv_heads"] * hd),
        "wv": (L, d, m["kv_heads"] * hd), "wo": (L, m["heads"] * hd, d),
        "w1": (L, d, m["mlp"]), "w3": (L, d, m["mlp"]), "w2": (L, m["mlp"], d),
    }
    keys = jax.random.split(key, len(shapes) + 2)
    p = {name: jax.random.normal(k, s, jnp.float32) / math.sqrt(s[1])
         for (name, s), k in zip(shapes.items(), keys)}
    p["attention_norm"] = jnp.ones((L, d), jnp.float32)
    p["mlp_norm"] = jnp.ones((L, d), jnp.float32)
    p["embed"] = jax.random.normal(keys[-2], (m["vocab"], d), jnp.float32)
    p["final_norm"] = jnp.ones((d,), jnp.float32)
    p["lm_head"] = jax.random.normal(keys[-1], (d, m["vocab"]), jnp.float32) / math.sqrt(d)
    return p


def rms_norm(x, g):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + NORM_EPS) * g


def rope(x, cos, sin):
    """`x` `[b, s, h, hd]`, tables `[b, s, hd / 2]`: the halves rotated (tessera's layout)."""
    x1, x2 = jnp.split(x, 2, axis=-1)
    c, s = cos[:, :, None, :], sin[:, :, None, :]
    return jnp.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1)


def ulysses_attention(q, k, v):
    """Each device's `[b, s, heads, hd]` blocks: heads exchanged for the whole sequence,
    causal attention, the output sent back. The values `SAVED["save_attention"]` lists are
    named (a name saves nothing unless the layer's `jax.checkpoint` policy lists it)."""
    a2a = lambda t: jax.lax.all_to_all(t, "context", split_axis=2, concat_axis=1, tiled=True)
    q, k, v = (checkpoint_name(a2a(t), f"attention_{n}") for t, n in ((q, "q"), (k, "k"),
                                                                        (v, "v")))
    out = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    out = checkpoint_name(out, "attention_out")
    out = jax.lax.all_to_all(out, "context", split_axis=1, concat_axis=2, tiled=True)
    return checkpoint_name(out, "attention_context")


def local_loss(m, p, tokens, targets, positions, remat_policy="full"):
    """This device's summed cross-entropy: `[b, s]` tokens of its sequence block."""
    b, s = tokens.shape
    hd = m["head_dim"]
    inv_freq = ROPE_THETA ** (-2.0 * jnp.arange(hd // 2, dtype=jnp.float32) / hd)
    angle = positions.astype(jnp.float32)[..., None] * inv_freq
    cos, sin = jnp.cos(angle), jnp.sin(angle)
    x = p["embed"][tokens]

    saved = SAVED[remat_policy]
    policy = jax.checkpoint_policies.save_only_these_names(*saved) if saved else None

    @functools.partial(jax.checkpoint, policy=policy)
    def layer(x, w):
        h = rms_norm(x, w["attention_norm"])
        q = rope((h @ w["wq"]).reshape(b, s, m["heads"], hd), cos, sin)
        k = rope((h @ w["wk"]).reshape(b, s, m["kv_heads"], hd), cos, sin)
        v = (h @ w["wv"]).reshape(b, s, m["kv_heads"], hd)
        x = x + ulysses_attention(q, k, v).reshape(b, s, -1) @ w["wo"]
        h = rms_norm(x, w["mlp_norm"])
        return x + (jax.nn.silu(h @ w["w1"]) * (h @ w["w3"])) @ w["w2"], None

    stacked = {n: p[n] for n in ("attention_norm", "mlp_norm", "wq", "wk", "wv", "wo", "w1",
                                 "w3", "w2")}
    x, _ = jax.lax.scan(layer, x, stacked)
    logits = rms_norm(x, p["final_norm"]) @ p["lm_head"]
    lse = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    return jax.lax.psum(jnp.sum(lse - picked), "context")


def train_step_fn(m, mesh_, remat_policy):
    tokens_spec = P(None, "context")
    loss_fn = shard_map(lambda p, t, y, pos: local_loss(m, p, t, y, pos, remat_policy), mesh_,
                        in_specs=(P(), tokens_spec, tokens_spec, tokens_spec), out_specs=P())

    def step(params, mu, nu, hyper, tokens, targets, positions):
        n_tokens = tokens.size
        loss, grads = jax.value_and_grad(
            lambda p: loss_fn(p, tokens, targets, positions) / n_tokens)(params)
        leaves = jax.tree.leaves(grads)
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in leaves))
        factor = CLIP / jnp.maximum(norm, CLIP)
        lr, bc1, bc2 = hyper[0], hyper[1], hyper[2]

        def update(name, p, m1, v1, g):
            g = g * factor
            m1 = B1 * m1 + (1 - B1) * g
            v1 = B2 * v1 + (1 - B2) * g * g
            u = (m1 * bc1) / (jnp.sqrt(v1 * bc2) + EPS)
            if "norm" not in name:
                u = u + WD * p
            return p - lr * u, m1, v1

        out = {k: update(k, params[k], mu[k], nu[k], grads[k]) for k in params}
        return ({k: o[0] for k, o in out.items()}, {k: o[1] for k, o in out.items()},
                {k: o[2] for k, o in out.items()}, loss, norm)

    return jax.jit(step, donate_argnums=(0, 1, 2))


def learning_rate(k, steps):
    if k < WARMUP:
        return LR * (k + 1) / WARMUP
    progress = min((k - WARMUP) / max(steps - WARMUP, 1), 1.0)
    return LR * (FINAL_LR + (1 - FINAL_LR) * 0.5 * (1 + math.cos(math.pi * progress)))


class JaxTrain:
    def __init__(self, model, steps, remat_policy="full"):
        self.m, self.steps = MODELS[model], steps
        self.mesh = mesh()
        replicated = NamedSharding(self.mesh, P())
        self.tokens_sharding = NamedSharding(self.mesh, P(None, "context"))
        params = jax.device_put(init_params(self.m, jax.random.key(0)), replicated)
        zeros = jax.tree.map(jnp.zeros_like, params)
        self.state = (params, zeros, jax.tree.map(jnp.zeros_like, params))
        self.step_fn = train_step_fn(self.m, self.mesh, remat_policy)
        self.rng = np.random.default_rng(0)
        self.k = 0
        b, s = DEVICES, self.m["seq"]  # per_device_batch_size 1 on 4 devices
        self.positions = jax.device_put(np.tile(np.arange(s, dtype=np.int32), (b, 1)),
                                        self.tokens_sharding)

    def step(self):
        """One step as `Trainer::train_step` times it: hyper and batch uploaded, loss and
        gradient norm read back."""
        start = time.perf_counter()
        t = self.k + 1
        hyper = jnp.asarray(np.array([learning_rate(self.k, self.steps), 1 / (1 - B1 ** t),
                                      1 / (1 - B2 ** t)], np.float32))
        b, s = DEVICES, self.m["seq"]
        row = self.rng.integers(0, self.m["vocab"], (b, s + 1), dtype=np.int32)
        tokens = jax.device_put(row[:, :-1], self.tokens_sharding)
        targets = jax.device_put(row[:, 1:], self.tokens_sharding)
        *self.state, loss, norm = self.step_fn(*self.state, hyper, tokens, targets,
                                               self.positions)
        loss, norm = float(loss), float(norm)
        self.k += 1
        if not (math.isfinite(loss) and math.isfinite(norm)):
            sys.exit(f"cpu_twin: JAX's step {self.k} gave loss {loss}, gradient norm {norm}")
        return time.perf_counter() - start

    def time_steps(self, n):
        return [self.step() for _ in range(n)]


def tessera_train(args, n):
    """`n` timed steps of the train example (one more, the first, is its warm-up)."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "steps.jsonl")
        cmd = [args.train_bin, "--model", args.model, "--steps", str(n + 1), "--log-json", log,
               "--plot", os.path.join(tmp, "loss.svg"), "--peak-tflops", "1",
               "--remat-policy", args.remat_policy]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"cpu_twin: {' '.join(cmd)} failed:\n{run.stdout}{run.stderr}")
        with open(log) as f:
            times = [json.loads(line)["step_time_s"] for line in f if line.strip()]
    return times[1:]


# ---------------------------------------------------------------- Ulysses alone


class JaxUlysses:
    def __init__(self, a):
        self.mesh = mesh()
        self.seq_sharding = NamedSharding(self.mesh, P(None, "context"))
        shape = (a.batch, a.seq, a.heads, a.head_dim)  # JAX's [b, s, heads, hd] layout
        rng = np.random.default_rng(0)
        # On the host, as tessera's bench holds them: each run shards them over the devices
        # and brings the results back (the bench's times include that, for every strategy).
        self.q, self.k, self.v, self.dout = (
            rng.standard_normal(shape, np.float32) for _ in range(4))
        spec = P(None, "context")
        attn = shard_map(ulysses_attention, self.mesh, in_specs=(spec,) * 3, out_specs=spec)
        self.forward = jax.jit(attn)

        def forward_backward(q, k, v, dout):
            out, vjp = jax.vjp(attn, q, k, v)
            return (out, *vjp(dout))

        self.forward_backward = jax.jit(forward_backward)
        for _ in range(2):  # compile and warm up
            self.time_forward()
            self.time_forward_backward()

    def run(self, program, host_inputs):
        start = time.perf_counter()
        inputs = [jax.device_put(x, self.seq_sharding) for x in host_inputs]
        [np.asarray(y) for y in jax.tree.leaves(program(*inputs))]
        return time.perf_counter() - start

    def time_forward(self):
        return self.run(self.forward, (self.q, self.k, self.v))

    def time_forward_backward(self):
        return self.run(self.forward_backward, (self.q, self.k, self.v, self.dout))


def tessera_ulysses(args):
    """(forward, forward + backward) seconds from `tessera bench context-parallel`."""
    cmd = [args.tessera_bin, "bench", "context-parallel", "--strategies", "ulysses",
           "--batch", str(args.batch), "--heads", str(args.heads), "--seq", str(args.seq),
           "--head-dim", str(args.head_dim), "--devices", str(DEVICES), "--block",
           str(args.block), "--reps", str(args.reps)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"cpu_twin: {' '.join(cmd)} failed:\n{run.stdout}{run.stderr}")
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)["ulysses"]
            return row["fwd_s"], row["fwdbwd_s"]
    sys.exit(f"cpu_twin: no JSON line in the output of {' '.join(cmd)}:\n{run.stdout}")


# ---------------------------------------------------------------- rounds


def report(rows, keys):
    print("median over rounds: " + ", ".join(
        f"{k} {statistics.median(r[k] for r in rows):.3f}" for k in keys))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["train", "ulysses"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", help="write the rounds here")
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--steps", type=int, default=10, help="timed steps per round (train)")
    ap.add_argument("--remat-policy", choices=sorted(SAVED), default="full",
                    help="what the layer loop's backward recomputes, both sides (train)")
    ap.add_argument("--train-bin", default="target/release/examples/train")
    ap.add_argument("--tessera-bin", default="target/release/tessera")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--block", type=int, default=512)
    ap.add_argument("--reps", type=int, default=3, help="runs per program per round, best kept")
    a = ap.parse_args()
    for path in (a.train_bin if a.what == "train" else a.tessera_bin,):
        if not os.access(path, os.X_OK):
            sys.exit(f"cpu_twin: {path} is not built; run `cargo build --release --example "
                     "train --bin tessera` first")
    print(f"jax {jax.__version__}, {DEVICES} CPU devices, {os.cpu_count()} cores")
    rows = []
    if a.what == "train":
        jx = JaxTrain(a.model, steps=1000, remat_policy=a.remat_policy)
        jx.time_steps(2)  # compile and warm up
        for r in range(a.rounds):
            j = statistics.median(jx.time_steps(a.steps))
            t = statistics.median(tessera_train(a, a.steps))
            rows.append(dict(jax_step_s=j, tessera_step_s=t, ratio=t / j))
            print(f"round {r}: {a.model} step, remat {a.remat_policy} (median of {a.steps}) "
                  f"jax {j * 1e3:.1f} ms, "
                  f"tessera {t * 1e3:.1f} ms: {t / j:.3f}x", flush=True)
        report(rows, ["ratio"])
    else:
        jx = JaxUlysses(a)
        for r in range(a.rounds):
            jf = min(jx.time_forward() for _ in range(a.reps))
            jfb = min(jx.time_forward_backward() for _ in range(a.reps))
            tf, tfb = tessera_ulysses(a)
            rows.append(dict(jax_forward_s=jf, jax_forward_backward_s=jfb, tessera_forward_s=tf,
                             tessera_forward_backward_s=tfb, forward_ratio=tf / jf,
                             forward_backward_ratio=tfb / jfb))
            print(f"round {r}: ulysses S {a.seq} forward jax {jf * 1e3:.1f} ms, tessera "
                  f"{tf * 1e3:.1f} ms ({tf / jf:.3f}x); forward+backward jax {jfb * 1e3:.1f} ms, "
                  f"tessera {tfb * 1e3:.1f} ms ({tfb / jfb:.3f}x)", flush=True)
        report(rows, ["forward_ratio", "forward_backward_ratio"])
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(what=a.what, jax=jax.__version__, args=vars(a), rounds=rows), f,
                      indent=1)


if __name__ == "__main__":
    main()

"""The JAX peer of d4pg_bench: the whole D4PG pixel update of
agents/d4pg_agent.cc (D4pgAgent::Update), step for step as torch_d4pg.py
describes it, as one `jax.jit` program (networks, targets, Adam states and
the augmentation's key donated), on a synthetic batch like
bench/synthetic.cc's uploaded every update, its readout (per-item losses, Q,
the actor loss) read back once per update.

Not part of troupe: the benchmark runs it (on the CPU from a virtual
environment under build/ that it makes with the jax/jaxlib CPU wheels; on a
GPU with the machine's python3 and its JAX).
Usage: jax_d4pg.py THREADS BATCH SIZE FRAMES SECONDS jit [cpu|cuda|pjrt] [KEY=VALUE...] (pjrt: on the
PJRT plugin $TROUPE_PJRT_PLUGIN names, the one troupe's side loads)
keys as torch_d4pg.py's; prints "updates_per_second X".
"""
import sys

import peer_timing
import torch_d4pg
from jax_drq import adam_init, adam_update, pixels_in, uniform_fan_in
from torch_d4pg import (AUGMENT_PAD, FEATURES, LEARNING_RATE, MAX_GRADIENT_NORM, PRE_TANH_BOUND, PRE_TANH_PENALTY,
                        TARGET_TAU, V_MAX, V_MIN)

USAGE = ("usage: jax_d4pg.py THREADS BATCH SIZE FRAMES SECONDS jit [cpu|cuda|pjrt] "
         "[channels=32] [hidden=256] [actions=1] [atoms=51] [prioritized=0|1] [precision=float32|bfloat16]")


def init_mlp(key, sizes):
    import jax
    keys = jax.random.split(key, 2 * len(sizes))
    return [{"w": uniform_fan_in(keys[2 * i], (a, b), a), "b": uniform_fan_in(keys[2 * i + 1], (b,), a)}
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))]


def init_networks(key, args):
    """The critic (encoder + C51 head, one set as troupe's) and the actor,
    initialised as PyTorch's defaults (troupe's Init::FanIn)."""
    import jax
    import jax.numpy as jnp
    keys = iter(jax.random.split(key, 16))
    channels, hidden, actions = args["channels"], args["hidden"], args["actions"]
    convs, c = [], 3 * args["frames"]
    for _ in range(4):
        convs.append({"w": uniform_fan_in(next(keys), (3, 3, c, channels), 9 * c),
                      "b": uniform_fan_in(next(keys), (channels,), 9 * c)})
        c = channels
    s = torch_d4pg.conv_output(args["size"])
    critic = {"convs": convs, "linear": init_mlp(next(keys), [channels * s * s, FEATURES])[0],
              "norm": {"gamma": jnp.ones((FEATURES,)), "beta": jnp.zeros((FEATURES,))},
              "head": init_mlp(next(keys), [FEATURES + actions, hidden, hidden, args["atoms"]])}
    actor = init_mlp(next(keys), [FEATURES, hidden, hidden, actions])
    return critic, actor


def make_update(args):
    """The jitted update: (state, batch) -> (state, readout), the state donated."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    compute = jnp.bfloat16 if args["precision"] == "bfloat16" else jnp.float32
    atoms = args["atoms"]
    support = jnp.linspace(V_MIN, V_MAX, atoms)
    dz = (V_MAX - V_MIN) / (atoms - 1)

    def dense(x, layer):
        # Inputs in the compute type, products accumulated and returned in float32.
        return jnp.dot(x.astype(compute), layer["w"].astype(compute), preferred_element_type=jnp.float32) + layer["b"]

    def mlp(layers, x):
        for i, layer in enumerate(layers):
            x = dense(x, layer)
            if i + 1 < len(layers):
                x = jax.nn.relu(x)
        return x

    def encode(critic, x):
        # NHWC images, HWIO kernels (XLA's native layout); convs, linear, layer norm, tanh.
        for i, conv in enumerate(critic["convs"]):
            stride = 2 if i == 0 else 1
            x = lax.conv_general_dilated(x.astype(compute), conv["w"].astype(compute), (stride, stride), "VALID",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         preferred_element_type=jnp.float32)
            x = jax.nn.relu(x + conv["b"])
        x = dense(x.reshape(x.shape[0], -1), critic["linear"])
        mean = x.mean(axis=1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
        x = (x - mean) * lax.rsqrt(var + 1e-5) * critic["norm"]["gamma"] + critic["norm"]["beta"]
        return jnp.tanh(x)

    def logits(critic, features, action):
        return mlp(critic["head"], jnp.concatenate([features, action], axis=1))

    def random_shift(x, key):
        # out[r, q] = in[clamp(r + dy), clamp(q + dx)], dy, dx in [-pad, pad] per image.
        n, h, w, _ = x.shape
        shifts = jax.random.randint(key, (n, 2), 0, 2 * AUGMENT_PAD + 1) - AUGMENT_PAD
        rows = jnp.clip(jnp.arange(h)[None, :] + shifts[:, :1], 0, h - 1)
        cols = jnp.clip(jnp.arange(w)[None, :] + shifts[:, 1:], 0, w - 1)
        x = jnp.take_along_axis(x, rows[:, :, None, None], axis=1)
        return jnp.take_along_axis(x, cols[:, None, :, None], axis=2)

    def project(probs, reward, discount):
        # Bellemare et al. 2017, Algorithm 1, as torch_d4pg.py's project.
        tz = jnp.clip(reward[:, None] + discount[:, None] * support[None, :], V_MIN, V_MAX)
        b = jnp.clip((tz - V_MIN) / dz, 0, atoms - 1)
        nearness = jnp.maximum(0.0, 1 - jnp.abs(b[:, :, None] - jnp.arange(atoms)[None, None, :]))
        return (probs[:, :, None] * nearness).sum(axis=1)

    def clip_by_global_norm(grads):
        norm = jnp.sqrt(sum(jnp.sum(g * g) for g in jax.tree.leaves(grads)))
        scale = jnp.where(norm > MAX_GRADIENT_NORM, MAX_GRADIENT_NORM / norm, 1.0)
        return jax.tree.map(lambda g: g * scale, grads)

    def polyak(online, target):
        return jax.tree.map(lambda o, t: t + TARGET_TAU * (o - t), online, target)

    def update(state, observation, action, reward, discount, next_observation, weights):
        key, shift_key, next_shift_key = jax.random.split(state["key"], 3)
        observation = random_shift(pixels_in(observation), shift_key)
        next_observation = random_shift(pixels_in(next_observation), next_shift_key)
        rows = observation.shape[0]

        # Target distribution: target critic at (s', target actor(s')), projected.
        next_features = encode(state["target_critic"], next_observation)
        next_action = jnp.tanh(mlp(state["target_actor"], next_features))
        next_probs = jax.nn.softmax(logits(state["target_critic"], next_features, next_action), axis=1)
        target = lax.stop_gradient(project(next_probs, reward, discount))
        weighted_target = target * weights[:, None] if args["prioritized"] else target

        # Critic: cross-entropy to the target; the encoder trained by this loss only.
        def critic_loss(critic):
            features = encode(critic, observation)
            log_probs = jax.nn.log_softmax(logits(critic, features, action), axis=1)
            return -(log_probs * weighted_target).sum() / rows, (features, log_probs)

        (_, (features, log_probs)), grads = jax.value_and_grad(critic_loss, has_aux=True)(state["critic"])
        item_loss = -(target * log_probs).sum(axis=1)
        item_q = jax.nn.softmax(log_probs, axis=1) @ support
        critic, critic_adam = adam_update(state["critic"], clip_by_global_norm(grads), state["critic_adam"],
                                          LEARNING_RATE)

        # Actor: -E[Q] of the updated critic (constants) on the detached features, plus the pre-tanh penalty.
        frozen_critic, actor_features = lax.stop_gradient(critic), lax.stop_gradient(features)

        def actor_loss(actor):
            pre_tanh = mlp(actor, actor_features)
            q = jax.nn.softmax(logits(frozen_critic, actor_features, jnp.tanh(pre_tanh)), axis=1) @ support
            above = jax.nn.relu(pre_tanh - PRE_TANH_BOUND)
            below = jax.nn.relu(-pre_tanh - PRE_TANH_BOUND)
            return -q.mean() + PRE_TANH_PENALTY * ((above * above).mean() + (below * below).mean())

        loss, grads = jax.value_and_grad(actor_loss)(state["actor"])
        actor, actor_adam = adam_update(state["actor"], clip_by_global_norm(grads), state["actor_adam"],
                                        LEARNING_RATE)

        # Targets by Polyak averaging.
        state = {"critic": critic, "actor": actor, "critic_adam": critic_adam, "actor_adam": actor_adam,
                 "target_critic": polyak(critic, state["target_critic"]),
                 "target_actor": polyak(actor, state["target_actor"]), "key": key}
        return state, jnp.concatenate([item_loss, item_q, loss[None]])

    return jax.jit(update, donate_argnums=(0,))


def synthetic_batch(args):
    """One random batch on the host (numpy), as torch_d4pg.py's."""
    import numpy as np
    rng = np.random.default_rng(1)
    b, frames, size = args["batch"], args["frames"], args["size"]
    pixels = (b, frames, size, size, 3)
    return [rng.integers(0, 256, pixels, dtype=np.uint8), rng.uniform(-1, 1, (b, args["actions"])).astype(np.float32),
            rng.uniform(-1, 1, b).astype(np.float32), rng.uniform(-1, 1, b).astype(np.float32),
            rng.integers(0, 256, pixels, dtype=np.uint8), (1 - rng.uniform(0, 1, b)).astype(np.float32)]


def main():
    args = torch_d4pg.parse(sys.argv, USAGE, ("jit",), ("cpu", "cuda", "pjrt"))
    peer_timing.jax_before_import(args["device"], args["threads"])
    import jax
    import numpy as np
    if (misplaced := peer_timing.jax_misplaced(args["device"])) is not None:
        sys.exit(f"jax_d4pg.py: {misplaced}")
    if args["precision"] == "float32":
        jax.config.update("jax_default_matmul_precision", "highest")  # no TF32 on a GPU
    init_key, augment_key = jax.random.split(jax.random.PRNGKey(1))
    critic, actor = init_networks(init_key, args)
    copy = lambda tree: jax.tree.map(lambda a: a.copy(), tree)
    state = [{"critic": critic, "actor": actor, "critic_adam": adam_init(critic), "actor_adam": adam_init(actor),
              "target_critic": copy(critic), "target_actor": copy(actor), "key": augment_key}]
    update = make_update(args)
    host = synthetic_batch(args)
    batch = args["batch"]

    def step():
        # The host batch goes in (uploaded), the readout comes back: one wait per update, as the learner's.
        state[0], readout = update(state[0], *host)
        readout = np.asarray(readout)
        return float(readout[:batch].mean()), float(readout[batch:2 * batch].mean()), float(readout[-1])

    print(f"updates_per_second {peer_timing.rate(step, lambda: jax.block_until_ready(state), args['seconds'])}")


if __name__ == "__main__":
    main()

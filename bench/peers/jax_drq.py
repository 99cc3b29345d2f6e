"""The JAX peer of `troupe bench learner`: the DrQ network of torch_drq.py
(bench/learner_bench.cc's DrqNetwork), forward + backward + Adam as one
`jax.jit` program with the parameters and Adam's moments donated, on the CPU
or a GPU (float32, or bfloat16 matmul/conv inputs with float32 accumulation
and float32 weights, as troupe's BFLOAT16 and torch_drq.py's autocast). Its
input is what troupe's side is handed: uint8 frames [B, 3, H, W, 3] as replay
holds them, made float NHWC / 255 inside the step.

Not part of troupe: the benchmark runs it (on the CPU from a virtual
environment under build/ that it makes with the jax/jaxlib CPU wheels; on a
GPU with the machine's python3 and its JAX).
Usage: jax_drq.py THREADS BATCH SIZE SECONDS jit [cpu|cuda|pjrt] [float32|bfloat16]
(pjrt: on the PJRT plugin $TROUPE_PJRT_PLUGIN names, the one troupe's side loads);
prints "samples_per_second X".
"""
import math
import sys

import peer_timing

USAGE = "usage: jax_drq.py THREADS BATCH SIZE SECONDS jit [cpu|cuda|pjrt] [float32|bfloat16]"


def parse(argv):
    """The arguments, or exits with the usage line naming what is wrong."""
    if not 6 <= len(argv) <= 8:
        sys.exit(USAGE)
    try:
        threads, batch, size, seconds = int(argv[1]), int(argv[2]), int(argv[3]), float(argv[4])
    except ValueError as e:
        sys.exit(f"{USAGE}\n{e}")
    mode = argv[5]
    device = argv[6] if len(argv) > 6 else "cpu"
    dtype = argv[7] if len(argv) > 7 else "float32"
    if mode != "jit" or device not in ("cpu", "cuda", "pjrt") or dtype not in ("float32", "bfloat16"):
        sys.exit(USAGE)
    if threads < 1 or batch < 1 or size < 15 or seconds <= 0:
        sys.exit(f"{USAGE}\nTHREADS, BATCH >= 1, SIZE >= 15, SECONDS > 0")
    return threads, batch, size, seconds, device, dtype


def uniform_fan_in(key, shape, fan_in):
    """PyTorch's default init of Conv2d and Linear (weights and biases):
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as troupe's Init::FanIn."""
    import jax
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, minval=-bound, maxval=bound)


def init_params(key, size):
    """The network's parameters: four 3x3 convs of 32 channels (HWIO, the
    first stride 2), linear to 50, layer norm, then 50 -> 1024 -> 1024 -> 1."""
    import jax
    import jax.numpy as jnp
    keys = iter(jax.random.split(key, 16))
    params = {"convs": []}
    channels = 9
    for _ in range(4):
        fan_in = channels * 9
        params["convs"].append({"w": uniform_fan_in(next(keys), (3, 3, channels, 32), fan_in),
                                "b": uniform_fan_in(next(keys), (32,), fan_in)})
        channels = 32
    spatial = (size - 3) // 2 + 1 - 6
    sizes = [32 * spatial * spatial, 50]
    params["fc"] = {"w": uniform_fan_in(next(keys), (sizes[0], 50), sizes[0]),
                    "b": uniform_fan_in(next(keys), (50,), sizes[0])}
    params["ln"] = {"gamma": jnp.ones((50,)), "beta": jnp.zeros((50,))}
    params["head"] = []
    for fan_in, out in ((50, 1024), (1024, 1024), (1024, 1)):
        params["head"].append({"w": uniform_fan_in(next(keys), (fan_in, out), fan_in),
                               "b": uniform_fan_in(next(keys), (out,), fan_in)})
    return params


def pixels_in(frames):
    """uint8 frames [B, k, H, W, 3] as replay holds them -> float NHWC [B, H, W, 3k] / 255
    (channel f*3 + c: frame f's colour c)."""
    import jax.numpy as jnp
    b, k, h, w, c = frames.shape
    return frames.transpose(0, 2, 3, 1, 4).reshape(b, h, w, k * c).astype(jnp.float32) * (1.0 / 255.0)


def make_step(bfloat16):
    """The jitted step: (params, adam, x, y) -> (params, adam), the first two donated."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    compute = jnp.bfloat16 if bfloat16 else jnp.float32

    def dense(x, layer):
        # Inputs in the compute type, products accumulated and returned in float32.
        y = jnp.dot(x.astype(compute), layer["w"].astype(compute), preferred_element_type=jnp.float32)
        return y + layer["b"]

    def forward(params, frames):
        # The frames as NHWC floats, HWIO kernels: XLA's and Flax's native convolution layout.
        x = pixels_in(frames)
        for i, conv in enumerate(params["convs"]):
            stride = 2 if i == 0 else 1
            x = lax.conv_general_dilated(x.astype(compute), conv["w"].astype(compute), (stride, stride), "VALID",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                         preferred_element_type=jnp.float32)
            x = jax.nn.relu(x + conv["b"])
        x = dense(x.reshape(x.shape[0], -1), params["fc"])
        mean = x.mean(axis=1, keepdims=True)
        var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
        x = (x - mean) * lax.rsqrt(var + 1e-5) * params["ln"]["gamma"] + params["ln"]["beta"]
        x = jnp.tanh(x)
        for i, layer in enumerate(params["head"]):
            x = dense(x, layer)
            if i + 1 < len(params["head"]):
                x = jax.nn.relu(x)
        return x

    def loss_fn(params, x, y):
        return jnp.mean((forward(params, x) - y) ** 2)

    def step(params, adam, x, y):
        return adam_update(params, jax.grad(loss_fn)(params, x, y), adam, 1e-4)

    return jax.jit(step, donate_argnums=(0, 1))


def adam_init(params):
    """Adam's state for `params`: zero moments, no steps taken."""
    import jax
    import jax.numpy as jnp
    return {"m": jax.tree.map(jnp.zeros_like, params), "v": jax.tree.map(jnp.zeros_like, params),
            "count": jnp.zeros((), jnp.int32)}


def adam_update(params, grads, adam, learning_rate):
    """One Adam step (Kingma & Ba 2015) in PyTorch's and troupe's form: betas
    (0.9, 0.999), eps 1e-8 added to the bias-corrected sqrt(v)."""
    import jax
    import jax.numpy as jnp
    count = adam["count"] + 1
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, adam["m"], grads)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, adam["v"], grads)
    c1 = 1 - 0.9 ** count
    c2 = 1 - 0.999 ** count
    params = jax.tree.map(lambda p, m, v: p - learning_rate / c1 * m / (jnp.sqrt(v / c2) + 1e-8), params, m, v)
    return params, {"m": m, "v": v, "count": count}


def main():
    threads, batch, size, seconds, device, dtype = parse(sys.argv)
    peer_timing.jax_before_import(device, threads)
    import jax
    if (misplaced := peer_timing.jax_misplaced(device)) is not None:
        sys.exit(f"jax_drq.py: {misplaced}")
    # Float32 as float32 on a GPU: JAX multiplies float32 in TF32 there by
    # default; troupe's FLOAT32 does not (as peer_timing.float32_without_tf32).
    if dtype == "float32":
        jax.config.update("jax_default_matmul_precision", "highest")
    key_params, key_x, key_y = jax.random.split(jax.random.PRNGKey(1), 3)
    params = init_params(key_params, size)
    adam = adam_init(params)
    x = jax.random.randint(key_x, (batch, 3, size, size, 3), 0, 256).astype(jax.numpy.uint8)
    y = jax.random.uniform(key_y, (batch, 1))
    step = make_step(dtype == "bfloat16")
    state = [params, adam]

    def run():
        state[0], state[1] = step(state[0], state[1], x, y)

    def sync():
        jax.block_until_ready(state)

    print(f"samples_per_second {batch * peer_timing.rate(run, sync, seconds)}")


if __name__ == "__main__":
    main()

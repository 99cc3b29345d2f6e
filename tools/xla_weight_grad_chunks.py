"""Times a convolution's weight gradient on jaxlib's CPU runtime as one
convolution over the batch (the form JAX derives) and as sums over chunks of
2^k samples (the form troupe hands XLA's CPU plugin,
engine/pjrt/pjrt_kernels.cc ConvWeightGradSamples), for the layers of
troupe's benchmarks: the DrQ step's four at batch 128 and 64x64 frames, the
D4PG update's first two at batch 256 and 84x84, and the GAN discriminator's
4x4 layer at 512 images.

Run with the JAX peers' Python (build/release/jax-peers-venv/bin/python,
made by `troupe bench learner`):
    python tools/xla_weight_grad_chunks.py [--rounds N] [--executions N]
Prints, per layer, each form's median [min-max] milliseconds per execution
over rounds alternated between the forms, and the chunk the rule picks. Not
part of troupe's build or tests: a measuring aid for
docs/benchmarks/learner.md.
"""
import argparse
import time

import numpy as np

# (name, samples, channels in, size in, channels out, kernel, stride, pad)
LAYERS = [
    ("DrQ conv1", 128, 9, 64, 32, 3, 2, 0),
    ("DrQ conv2", 128, 32, 31, 32, 3, 1, 0),
    ("DrQ conv3", 128, 32, 29, 32, 3, 1, 0),
    ("DrQ conv4", 128, 32, 27, 32, 3, 1, 0),
    ("D4PG conv1", 256, 9, 84, 32, 3, 2, 0),
    ("D4PG conv2", 256, 32, 41, 32, 3, 1, 0),
    ("GAN D conv2", 512, 64, 14, 128, 4, 2, 1),
]


def rule(n, c, out, oc, k):
    """ConvWeightGradSamples: the chunk troupe takes (n: no split)."""
    positions, patch = out * out, c * k * k
    most = max(1, min(8192 // positions, (1 << 21) // (positions * patch)))
    samples = 1 << (most.bit_length() - 1)
    flops = 2.0 * samples * positions * c * oc * k * k
    return n if samples >= n or flops < 16e6 else samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--executions", type=int, default=3, help="executions per round")
    a = parser.parse_args()
    import jax
    from jax import lax

    def weight_gradient(s, p):
        def one(x, dy, w):
            forward = lambda w: lax.conv_general_dilated(x, w, (s, s), [(p, p), (p, p)],
                                                         dimension_numbers=("NCHW", "OIHW", "NCHW"))
            return jax.vjp(forward, w)[1](dy)[0]
        return one

    rng = np.random.default_rng(0)
    for name, n, c, h, oc, k, s, p in LAYERS:
        out = (h + 2 * p - k) // s + 1
        x = jax.device_put(rng.standard_normal((n, c, h, h), dtype=np.float32))
        dy = jax.device_put(rng.standard_normal((n, oc, out, out), dtype=np.float32))
        w = jax.device_put(np.zeros((oc, c, k, k), np.float32))
        grad = weight_gradient(s, p)
        forms = {"one": jax.jit(grad)}
        for samples in (32, 16, 8, 4, 2):
            if samples < n:
                forms[f"chunks of {samples}"] = jax.jit(
                    lambda x, dy, w, m=samples: sum(grad(x[i:i + m], dy[i:i + m], w) for i in range(0, n, m)))
        for f in forms.values():
            f(x, dy, w).block_until_ready()
        times = {form: [] for form in forms}
        for _ in range(a.rounds):
            for form, f in forms.items():
                start = time.perf_counter()
                for _ in range(a.executions):
                    r = f(x, dy, w)
                r.block_until_ready()
                times[form].append(1000 * (time.perf_counter() - start) / a.executions)
        picked = rule(n, c, out, oc, k)
        print(f"{name}: {n} x {c}x{h}x{h} -> {oc}x{out}x{out}, kernel {k}, stride {s}; the rule: "
              + ("one" if picked >= n else f"chunks of {picked}"))
        for form, t in times.items():
            print(f"  {form:14s} {np.median(t):8.1f} ms [{min(t):.1f}-{max(t):.1f}]")


if __name__ == "__main__":
    main()

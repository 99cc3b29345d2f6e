"""The timing loop the Python peers share: warm-up steps (compilation, when
compiling), then whole steps until `seconds` have passed, the device
synchronised before each clock reading. PyTorch is imported only by the
functions that need it, so the JAX peers share the loop without it."""
import time


# Each round times at least this many steps, as troupe's side does
# (bench/protocol.h kMinStepsPerRound); the clock is read every so many.
MIN_STEPS = 4


def rate(step, sync, seconds, warm_up=3):
    """Calls of `step()` per second over at least `seconds` and MIN_STEPS
    calls; `sync()` waits for the queued work (a GPU's kernels, JAX's
    asynchronous dispatch) before each clock reading."""
    for _ in range(warm_up):
        step()
    sync()
    n, start = 0, time.perf_counter()
    while True:
        step()
        n += 1
        if n % MIN_STEPS == 0:
            sync()
            elapsed = time.perf_counter() - start
            if elapsed >= seconds:
                return n / elapsed


def steps_per_second(step, device, seconds, warm_up=3):
    """`rate` for a PyTorch step on `device` ("cpu" or "cuda")."""
    import torch
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    return rate(step, sync, seconds, warm_up)


def float32_without_tf32():
    """Float32 as float32 on a GPU: PyTorch runs cuDNN convolutions in TF32
    (10-bit mantissa inputs) by default; troupe's FLOAT32 keeps float32
    inputs (its TF32 is off), so the float32 rows compare like with like."""
    import torch
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False


def cudnn_algorithms_measured():
    """cuDNN's convolution algorithms measured once per shape
    (cudnn.benchmark, the usual setting for fixed-shape training), as
    troupe's CUDA backend picks its own (cudnnFind*)."""
    import torch
    torch.backends.cudnn.benchmark = True


def jax_before_import(device, threads):
    """Settles where JAX runs, called before jax is imported. On the CPU
    (device cpu, or pjrt: the PJRT plugin troupe's side loads, which imports
    jax to register it): `threads` CPUs. XLA's CPU client sizes its thread pools from the CPUs this
    process may run on (sched_getaffinity) and has no thread-count option that
    holds across releases, so the process is confined to the first `threads`
    of them. On a GPU: memory taken as needed (as PyTorch's caching allocator
    does) rather than 75% of it at start, since the bench's own GPU backend
    holds memory on the same GPU while its peers run."""
    import os
    if device == "cuda":
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        return
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[:threads])
    if device == "pjrt":
        # The PJRT plugin troupe's compiled steps run on ($TROUPE_PJRT_PLUGIN),
        # as JAX's only platform: the same compiler and the same runtime as
        # troupe's side, so a comparison measures the programs alone.
        import sys
        plugin = os.environ.get("TROUPE_PJRT_PLUGIN", "")
        if not os.path.isfile(plugin):
            sys.exit(f"device pjrt: TROUPE_PJRT_PLUGIN={plugin!r} is no file (the plugin troupe's side loads)")
        os.environ["JAX_PLATFORMS"] = PJRT_PLATFORM
        from jax._src import xla_bridge
        xla_bridge.register_plugin(PJRT_PLATFORM, library_path=plugin)
        return
    os.environ["JAX_PLATFORMS"] = "cpu"


# The name JAX knows troupe's PJRT plugin by (device pjrt).
PJRT_PLATFORM = "troupe_pjrt"


def jax_misplaced(device):
    """Why JAX, imported after jax_before_import(device, ...), does not run
    where `device` asked; None where it does."""
    import jax
    from jax._src import xla_bridge
    if device == "cuda" and jax.default_backend() != "gpu":
        return f"cuda asked for, but JAX {jax.__version__} runs on {jax.default_backend()}"
    # The plugin's devices call their platform "cpu": the backend JAX made is what tells.
    if device == "pjrt" and list(xla_bridge.backends()) != [PJRT_PLATFORM]:
        return f"pjrt asked for, but JAX {jax.__version__} made the backends {list(xla_bridge.backends())}"
    return None

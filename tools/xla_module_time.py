"""Times XLA modules on jaxlib's CPU runtime and on a PJRT plugin, in one
process, rounds alternated: the same program on two runtimes, or two
programs (troupe's and a JAX peer's) on one, apart from everything else
their benchmarks do.

Dump the modules first, each process with its own directory:
    XLA_FLAGS="--xla_dump_to=DIR --xla_dump_hlo_as_proto --xla_dump_hlo_as_text" COMMAND
and pass each module's DIR/module_*.before_optimizations.hlo.pb (the largest
file is the step's; its .txt beside it gives the parameters and aliasing).
Run with the JAX peers' Python (build/release/jax-peers-venv/bin/python,
made by `troupe bench learner`):
    python tools/xla_module_time.py [--plugin PATH] [--rounds N] MODULE.hlo.pb...
Prints each module's median [min-max] milliseconds per execution on each
runtime. Inputs are uniform [0, 0.01) floats, zero integers and random
bytes; an output aliased to a parameter is fed back as that parameter, as a
training loop does. Not part of troupe's build or tests: a measuring aid
for docs/benchmarks/learner.md.
"""
import argparse
import re
import time

import numpy as np


def module_proto(path):
    """The HloModuleProto inside the HloProto that XLA dumps (its field 1)."""
    data = open(path, "rb").read()
    if not data or data[0] != 0x0A:
        raise SystemExit(f"{path}: not an HloProto with a module (dump with --xla_dump_hlo_as_proto)")
    i, n, shift = 1, 0, 0
    while True:
        b = data[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return data[i:i + n]


def load(path, device):
    """The module compiled for `device`, its arguments, and its aliasing (output, parameter)."""
    import jax
    from jax._src.lib import xla_client as xc
    text = open(path.replace(".hlo.pb", ".txt")).read()
    mlir = xc._xla.mlir.hlo_to_stablehlo(module_proto(path))
    exe = device.client.compile_and_load(mlir, xc.DeviceList((device,)), xc.CompileOptions())
    signature = re.search(r"^ENTRY [^(]*\((.*?)\) ->", text, re.M).group(1)
    rng = np.random.default_rng(0)
    args = []
    for kind, dims in re.findall(r": ([a-z]+[0-9]*)\[([0-9,]*)\]", signature):
        shape = tuple(int(d) for d in dims.split(",") if d)
        if kind == "f32":
            a = rng.uniform(0, 0.01, shape).astype(np.float32)
        elif kind == "u8":
            a = rng.integers(0, 256, shape).astype(np.uint8)
        else:
            a = np.zeros(shape, {"s32": np.int32, "u32": np.uint32, "s64": np.int64, "pred": bool}[kind])
        args.append(jax.device_put(a, device))
    alias = [(int(o), int(p)) for o, p in re.findall(r"\{(\d+)\}: \((\d+), \{\}, may-alias\)", text.split("\n")[0])]
    return exe, args, alias


def seconds_per_execution(exe, args, alias, n):
    start = time.perf_counter()
    for _ in range(n):
        out = exe.execute(args)
        for o, p in alias:
            args[p] = out[o]
    for o in out:
        o.block_until_ready()
    return (time.perf_counter() - start) / n


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--plugin", help="a PJRT plugin to time each module on too")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--executions", type=int, default=5, help="executions per round")
    a = parser.parse_args()
    import jax
    if a.plugin:
        from jax._src import xla_bridge
        xla_bridge.register_plugin("timed_plugin", library_path=a.plugin)
        jax.config.update("jax_platforms", "cpu,timed_plugin")
    devices = [("jaxlib cpu", jax.devices("cpu")[0])]
    if a.plugin:
        devices.append(("plugin", jax.devices("timed_plugin")[0]))
    runs = [(path, name, load(path, device)) for path in a.modules for name, device in devices]
    for _, _, (exe, args, alias) in runs:
        seconds_per_execution(exe, args, alias, 2)  # warm up
    times = [[] for _ in runs]
    for _ in range(a.rounds):
        for i, (_, _, (exe, args, alias)) in enumerate(runs):
            times[i].append(1000 * seconds_per_execution(exe, args, alias, a.executions))
    for (path, name, _), t in zip(runs, times):
        print(f"{np.median(t):9.1f} ms [{min(t):.1f}-{max(t):.1f}]  {name:10s}  {path}")


if __name__ == "__main__":
    main()

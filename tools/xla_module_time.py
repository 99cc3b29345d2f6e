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
    python tools/xla_module_time.py [--plugin PATH] [--rounds N] [--thunks N] MODULE.hlo.pb...
Prints each module's median [min-max] milliseconds per execution on each
runtime; with --thunks N, then each module's N costliest kinds of thunk
(an XLA CPU program runs as a sequence of thunks: a fusion, a convolution,
a dot; a kind is the thunks of one name but for its number and one
shape, such as a weight gradient's chunks), their milliseconds per
execution on jaxlib's runtime from a profiler trace of 5 executions, how
many thunks, and the first one's shape and operands. Inputs are uniform
[0, 0.01) floats, zero integers and random bytes; an output aliased to a
parameter is fed back as that parameter, as a training loop does. Not part
of troupe's build or tests: a measuring aid for docs/benchmarks/learner.md.
"""
import argparse
import collections
import glob
import re
import tempfile
import time

import numpy as np


def protobuf_fields(data):
    """(field number, value) of a serialized protobuf message: ints for
    varints, bytes for the rest."""
    def varint(i):
        n = shift = 0
        while True:
            b = data[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return n, i
    i, out = 0, []
    while i < len(data):
        key, i = varint(i)
        kind = key & 7
        if kind == 0:
            value, i = varint(i)
        elif kind == 2:
            n, i = varint(i)
            value, i = data[i:i + n], i + n
        elif kind in (1, 5):
            n = 8 if kind == 1 else 4
            value, i = data[i:i + n], i + n
        else:
            raise SystemExit(f"unexpected protobuf wire type {kind}")
        out.append((key >> 3, value))
    return out


def module_proto(path):
    """The HloModuleProto inside the HloProto that XLA dumps (its field 1)."""
    data = open(path, "rb").read()
    if data[:1] == b"\x0a":  # field 1, length-delimited
        for field, value in protobuf_fields(data):
            if field == 1:
                return value
    raise SystemExit(f"{path}: not an HloProto with a module (dump with --xla_dump_hlo_as_proto)")


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


def event_picoseconds(xspace):
    """Total picoseconds per event name of a profiler trace (an XSpace: its
    planes (1), each plane's lines (3) of events (4: metadata id 1, duration
    3) and its event metadata (4: id 1 -> XEventMetadata, whose name is 2))."""
    total = collections.Counter()
    for field, plane in protobuf_fields(xspace):
        if field != 1:
            continue
        plane = protobuf_fields(plane)
        names = {}
        for field, entry in plane:
            if field == 4:
                entry = dict(protobuf_fields(entry))
                names[entry.get(1, 0)] = dict(protobuf_fields(entry.get(2, b""))).get(2, b"").decode(errors="replace")
        for field, line in plane:
            if field == 3:
                for field, event in protobuf_fields(line):
                    if field == 4:
                        event = dict(protobuf_fields(event))
                        total[names.get(event.get(1, 0), "?")] += event.get(3, 0)
    return total


def costliest_thunks(exe, args, alias, top, executions=5):
    """The `top` costliest kinds of thunk of a compiled module: (ms per
    execution, thunks of the kind, the first one's name, its instruction's
    shape and operands in the optimized module)."""
    import jax
    with tempfile.TemporaryDirectory() as trace:
        jax.profiler.start_trace(trace)
        seconds_per_execution(exe, args, alias, executions)
        jax.profiler.stop_trace()
        files = glob.glob(trace + "/**/*.xplane.pb", recursive=True)
        if not files:
            raise SystemExit("the profiler wrote no trace")
        total = event_picoseconds(open(files[0], "rb").read())
    text = exe.hlo_modules()[0].to_string()
    described = {}
    for line in text[text.index("ENTRY"):].splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w-]+)\((.*?)\)", line)
        if m:
            operands = ", ".join(x.split()[-1] for x in m.group(4).split(", ") if x.split())
            described[m.group(1)] = (m.group(2), f"{m.group(2)} {m.group(3)}({operands})")
    kinds = {}
    for name, ps in sorted(total.items()):
        if name not in described:
            continue
        key = (re.sub(r"\.\d+$", "", name), described[name][0])
        ms, count, first = kinds.get(key, (0.0, 0, name))
        kinds[key] = (ms + ps / executions / 1e9, count + 1, first)
    rows = sorted(kinds.values(), reverse=True)[:top]
    return [(ms, count, first, described[first][1]) for ms, count, first in rows]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="+")
    parser.add_argument("--plugin", help="a PJRT plugin to time each module on too")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--executions", type=int, default=5, help="executions per round")
    parser.add_argument("--thunks", type=int, default=0,
                        help="then each module's N costliest kinds of thunk (jaxlib's runtime)")
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
    for path, name, (exe, args, alias) in runs:
        if a.thunks and name == "jaxlib cpu":
            print(f"\n{path}: its {a.thunks} costliest kinds of thunk on jaxlib's runtime, ms per execution")
            for ms, count, first, what in costliest_thunks(exe, args, alias, a.thunks):
                print(f"{ms:9.2f}  x{count:<3d} {first:30s} {what[:110]}")


if __name__ == "__main__":
    main()

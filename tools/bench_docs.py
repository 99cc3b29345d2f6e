#!/usr/bin/env python3
"""The benchmark tables of the README and docs/, generated from what tools/bench_all.py wrote.

    tools/bench_docs.py [ROOT] --write | --check

A table of figures lives between two comments in a page:

    <!-- bench: TAG -->             every figure of docs/benchmarks/data/TAG.json
    <!-- bench: TAG REGEX -->       those whose name matches REGEX (Python re.search)
    <!-- bench: readme -->          the README's rows, README_ROWS below
    ...generated, never edited by hand...
    <!-- /bench -->

--write regenerates every block from the JSON; --check prints FILE:LINE: what
is wrong and exits 1 when a block is not what the JSON says (a figure typed
by hand, a JSON measured again without --write), names a JSON or a figure
that is not there, or when a table with a ratio column in the README or
under docs/benchmarks/ stands outside a block without a `<!-- kept: WHY -->`
line just above it (figures from elsewhere, e.g. a GPU lease at a named
commit). tools/check_docs.py runs the check.
"""
import argparse
import json
import os
import re
import sys

DATA = os.path.join("docs", "benchmarks", "data")
BEGIN = re.compile(r"^<!-- bench: (\S+)(?: (.*?))? -->\s*$")
END = "<!-- /bench -->"
KEPT = re.compile(r"^<!-- kept: .+ -->\s*$")

# The README's speed table: (figure as the README names it, JSON tag, regex
# on the figure's name, regex on its reference[, the peer's name in the README
# where the reference's own is long]). Each must match exactly one figure.
README_ROWS = [
    ("[env steps/s](docs/benchmarks/envs.md), `cartpole.swingup` state, 64 envs, 2 threads",
     "envs", r"^cartpole\.swingup state pool, 2 threads, 64 envs, against EnvPool", r"^EnvPool",
     "EnvPool 1.2.5 as shipped"),
    ("[env steps/s](docs/benchmarks/envs.md), `cheetah.run` state, 64 envs, 2 threads",
     "envs", r"^cheetah\.run state pool, 2 threads, 64 envs, against EnvPool", r"^EnvPool",
     "EnvPool 1.2.5 as shipped"),
    ("[env steps/s](docs/benchmarks/envs.md), `cheetah.run` 84x84 pixels, 16 envs, 1 thread",
     "envs", r"^cheetah\.run pixels 84x84 pool, 1 thread, 16 envs, against EnvPool", r"EnvPool",
     "EnvPool 1.2.5 as shipped, which does not render here"),
    ("[env steps/s from Python](docs/benchmarks/python.md), `walker.walk` pixels, 8 envs, 1 thread",
     "python", r"^walker\.walk pixels .*against dm_control", r"^dm_control",
     "dm_control 1.0.50's suite, rendering as troupe does"),
    ("[DrQ-style encoder+MLP step (not DrQ's update), CPU](docs/benchmarks/learner.md#on-the-cpu), batch 256, "
     "samples/s", "learner", r"^DrQ 9x84x84 .*batch 256", r"^PyTorch 2\.5 eager"),
    ("the same", "learner", r"^DrQ 9x84x84 .*batch 256", r"^PyTorch 2\.5 torch\.compile"),
    ("[D4PG pixel update, CPU](docs/benchmarks/learner.md#the-d4pg-update), batch 256, updates/s",
     "d4pg", r"^D4PG pixel update", r"^PyTorch 2\.5, eager"),
    ("the same", "d4pg", r"^D4PG pixel update", r"^PyTorch 2\.5, compile"),
    ("the same", "d4pg", r"^D4PG pixel update", r"^JAX"),
    ("[DrQ-style step as one compiled program, XLA CPU plugin](docs/benchmarks/learner.md#on-pjrt), 64x64, "
     "batch 128, samples/s", "learner-pjrt", r"one program per step", r"^JAX .*its CPU backend"),
    ("the same, JAX on the same plugin (the programs alone)", "learner-pjrt", r"one program per step",
     r"^JAX .*same PJRT plugin"),
    ("[D4PG pixel update as one compiled program, XLA CPU plugin](docs/benchmarks/learner.md#on-pjrt), batch 256, "
     "updates/s", "d4pg-pjrt", r"^D4PG pixel update", r"^JAX 0\.11\.2 jax\.jit,"),
    ("the same, JAX on the same plugin (the programs alone)", "d4pg-pjrt", r"^D4PG pixel update",
     r"^JAX .*same PJRT plugin"),
    ("[replay insert over gRPC](docs/benchmarks/replay.md), pixel transitions as actors make them, wire MB/s",
     "replay", r"^gRPC insert, pixel transitions as actors make them .*\(wire bytes", r"^raw loopback gRPC",
     "raw loopback gRPC, the same wire bytes"),
    ("[learner input](docs/benchmarks/learner-input.md), bytes uploaded per D4PG pixel update, the device "
     "table holding replay (set by the bench's 8 inserts per update; a design figure: troupe's two paths)",
     "learner-input", r"^table holds replay: bytes uploaded", r"design figure",
     "troupe's host-assembled batch"),
    ("the same, replay 7.9x the device table (the regime the table exists for)",
     "learner-input", r"^replay .*the table: bytes uploaded", r"design figure",
     "troupe's host-assembled batch"),
]


def number(v):
    if v is None:
        return "missing"
    a = abs(v)
    if a >= 1000:
        return f"{v:,.0f}"
    if a >= 100:
        return f"{v:.1f}"
    if a >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def with_range(v, low, high, rounds):
    if v is None:
        return "missing"
    return f"{number(v)} [{number(low)}-{number(high)}]" if rounds else number(v)


def short_reference(reference):
    """The peer's name without the protocol's words."""
    return re.sub(r", \d+ alternated rounds? .*$", "", reference)


def protocol_words(figures):
    for f in figures:
        m = re.search(r"(\d+ alternated rounds? .*?median \[min-max\])", f.get("reference", ""))
        if m:
            return m.group(1)
    return None


def heading(report):
    run = report.get("run", {})
    m = run.get("machine", {})
    line = (f"`{run.get('command', '?')}` at `{run.get('commit', '?')}`, {run.get('started', '?')[:10]}, on "
            f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores), load {run.get('load_before', '?')} before and "
            f"{run.get('load_after', '?')} after")
    words = protocol_words(report["figures"])
    if words:
        line += f"; each comparison: {words}, both sides on the threads its row names"
    return line + ":"


def figure_row(label, f, peer_name=None):
    rounds = f.get("rounds", 0)
    troupe = f"{with_range(f['value'], f.get('value_min'), f.get('value_max'), rounds)} {f['unit']}"
    reference = peer_name or short_reference(f["reference"])
    if f.get("reference_value") is None:
        reference = reference[:-len(" (missing)")] if reference.endswith(" (missing)") else reference
        peer = f"{reference}: missing" if reference not in ("-", "(no reference)") else "-"
    else:
        peer = f"{reference}: {with_range(f['reference_value'], f.get('reference_min'), f.get('reference_max'), rounds)}"
    ratio = "-" if f.get("ratio") is None else f"{f['ratio']:.2f}"
    return f"| {label} | {troupe} | {peer} | {ratio} |"


HEADER = ["| figure | troupe [min-max] | peer or reference, same run [min-max] | ratio |", "| --- | --- | --- | --- |"]


class Docs:
    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.faults = []
        self._reports = {}

    def fault(self, path, line, message):
        self.faults.append(f"{os.path.relpath(path, self.root)}:{line}: {message}")

    def report(self, tag):
        if tag not in self._reports:
            path = os.path.join(self.root, DATA, tag + ".json")
            try:
                with open(path) as f:
                    self._reports[tag] = json.load(f)
            except (OSError, ValueError) as e:
                self._reports[tag] = e
        return self._reports[tag]

    def render(self, path, line, tag, pattern):
        """The block's lines, or None after a fault."""
        if tag == "readme":
            return self.render_readme(path, line)
        report = self.report(tag)
        if isinstance(report, Exception):
            self.fault(path, line, f"bench block '{tag}': no {DATA}/{tag}.json ({report}); measure it with "
                                   f"tools/bench_all.py --only {tag}")
            return None
        figures = [f for f in report["figures"] if not pattern or re.search(pattern, f["name"])]
        if not figures:
            self.fault(path, line, f"bench block '{tag} {pattern}': no figure of {DATA}/{tag}.json matches")
            return None
        return [heading(report), ""] + HEADER + [figure_row(f["name"], f) for f in figures]

    def render_readme(self, path, line):
        rows, sources = [], {}
        for label, tag, name, reference, *peer_name in README_ROWS:
            report = self.report(tag)
            if isinstance(report, Exception):
                self.fault(path, line, f"README row '{label}': no {DATA}/{tag}.json; tools/bench_all.py --only {tag}")
                return None
            found = [f for f in report["figures"] if re.search(name, f["name"]) and re.search(reference, f["reference"])]
            if len(found) != 1:
                self.fault(path, line, f"README row '{label}': {len(found)} figures of {tag}.json match "
                                       f"name /{name}/ and reference /{reference}/ (want exactly one)")
                return None
            rows.append(figure_row(label, found[0], *peer_name))
            run = report.get("run", {})
            sources[tag] = (run.get("commit", "?"), run.get("started", "?")[:10])
        commits = sorted({c for c, _ in sources.values()})
        # Every machine the rows were measured on (figures of two machines
        # side by side are said to be).
        machines = sorted({f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores)"
                           for m in (self._reports[t].get("run", {}).get("machine", {}) for t in sources)})
        note = (f"Measured by `tools/bench_all.py` at `{', '.join(commits)}` on {' and '.join(machines)}"
                f"; each ratio a ratio of medians of alternated rounds "
                f"(the same threads, the same time per round), the ranges each side's min-max:")
        return [note, ""] + ["| figure | troupe [min-max] | peer, same run [min-max] | ratio |",
                             "| --- | --- | --- | --- |"] + rows

    def pages(self):
        found = [os.path.join(self.root, "README.md")]
        for folder, _, files in os.walk(os.path.join(self.root, "docs")):
            found += [os.path.join(folder, f) for f in sorted(files) if f.endswith(".md")]
        return found

    def process(self, path, write):
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
        out, i, changed = [], 0, False
        figures_page = os.path.basename(path) == "README.md" or os.sep + os.path.join("docs", "benchmarks") in path
        while i < len(lines):
            m = BEGIN.match(lines[i])
            if not m:
                if figures_page and re.match(r"^\|.*\bratio\b.*\|\s*$", lines[i]) and (i == 0 or not lines[i - 1].startswith("|")):
                    above = i - 1
                    while above >= 0 and not lines[above].strip():
                        above -= 1
                    if above < 0 or not KEPT.match(lines[above]):
                        self.fault(path, i + 1, "a table of figures outside a bench block: generate it "
                                                "(<!-- bench: TAG --> ... <!-- /bench -->, tools/bench_docs.py) "
                                                "or say where its figures come from (<!-- kept: WHY --> above it)")
                out.append(lines[i])
                i += 1
                continue
            start = i
            end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == END), None)
            if end is None:
                self.fault(path, start + 1, f"bench block '{m.group(1)}' has no {END}")
                return
            rendered = self.render(path, start + 1, m.group(1), m.group(2))
            current = lines[start + 1:end]
            if rendered is not None and current != rendered:
                if write:
                    changed = True
                else:
                    self.fault(path, start + 1, f"bench block '{m.group(1)}' is not what {DATA}/{m.group(1)}.json "
                                                "says (a figure typed by hand, or measured again): "
                                                "tools/bench_docs.py --write")
            out += [lines[start]] + (rendered if rendered is not None else current) + [lines[end]]
            i = end + 1
        if write and changed:
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join(out))
            print(f"wrote {os.path.relpath(path, self.root)}")

    def run(self, write):
        for page in self.pages():
            self.process(page, write)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    a = parser.parse_args()
    docs = Docs(a.root)
    docs.run(a.write)
    for fault in docs.faults:
        print(fault)
    return 1 if docs.faults else 0


if __name__ == "__main__":
    sys.exit(main())

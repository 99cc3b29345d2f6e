#!/usr/bin/env python3
"""tools/bench_compare.py on two runs the test writes: a ratio within 10%
reproduces, one that moved 20% fails the run naming it, a figure without a
peer is listed and not judged (unless --values), one in one run only is
named, and a peer whose protocol was worded differently is still the same
peer."""
import json
import os
import subprocess
import sys
import tempfile

TOP = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOL = os.path.join(TOP, "tools", "bench_compare.py")


def figure(name, value, reference=None, ratio=None):
    f = {"name": name, "value": value, "unit": "x/s"}
    if reference is not None:
        f.update(reference=reference, reference_value=value / ratio, ratio=ratio)
    return f


def write(directory, figures):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "demo.json"), "w") as f:
        json.dump({"benchmark": "demo", "figures": figures}, f)


def run(*args):
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        old, new = os.path.join(tmp, "old"), os.path.join(tmp, "new")
        write(old, [figure("steady", 100, "peer A", 2.0), figure("drifting", 100, "peer B", 1.0),
                    figure("host ms", 1.0), figure("gone", 5, "peer C", 1.0),
                    figure("sized (3209 B an item)", 10, "raw (51337 B)", 0.5),
                    figure("worded", 10, "peer D, 5 alternated rounds of 2 s after 1 warm-up, median [min-max], "
                                         "both 2 threads unpinned", 1.0)])
        write(new, [figure("steady", 104, "peer A", 2.1), figure("drifting", 100, "peer B", 1.2),
                    figure("host ms", 3.0), figure("sized (3324 B an item)", 10, "raw (53186 B)", 0.52),
                    figure("worded", 10, "peer D, 5 alternated rounds of at least 2 s and 4 steps after 1 warm-up, "
                                         "median [min-max], both 2 threads unpinned", 1.05)])
        out = run(old, new)
        assert out.returncode == 1, out
        lines = out.stdout.splitlines()
        steady = next(l for l in lines if "steady" in l)
        drifting = next(l for l in lines if "drifting" in l)
        host = next(l for l in lines if "host ms" in l)
        assert steady.endswith("reproduced") and "+5.0%" in steady, steady
        assert drifting.endswith("MOVED") and "+20.0%" in drifting, drifting
        assert host.endswith("-") and "+200.0%" in host, host
        assert any("only in the old run: demo: gone (peer C)" in l for l in lines), lines
        sized = next(l for l in lines if "sized" in l)
        assert sized.endswith("reproduced"), "a name's measured size kept it from its match: " + sized
        worded = next(l for l in lines if "worded" in l)
        assert worded.endswith("reproduced"), "the protocol's wording kept a peer from its match: " + worded
        assert "4 figures judged, 3 within 10%, 1 moved more" in lines[-1], lines[-1]
        # A wider bound passes; --values judges the peerless figure too.
        assert run(old, new, "--within", "0.25").returncode == 0
        out = run(old, new, "--within", "0.25", "--values")
        assert out.returncode == 1 and any("host ms" in l and l.endswith("MOVED") for l in out.stdout.splitlines())
        md = run(old, new, "--markdown").stdout.splitlines()
        assert md[0].startswith("| benchmark | figure | peer |") and md[2].startswith("| demo | drifting | peer B |"), md
    print("bench_compare: ratios judged within the bound, drift named, peerless figures listed")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""tools/check_docs.py must pass a tree whose README and docs/ hold together,
and fail, naming file and line, on each way they can come apart: a README
too long, a page not linked, a link or anchor to nothing, an unlabelled
block, an unknown verb, flag or benchmark, a missing script or script flag,
a set-up section changed, a layer table that differs from
tools/check_layers.sh, a table of figures typed by hand or with no
measurement behind it (tools/bench_docs.py). ctest runs it as
Docs.CheckRefusesBrokenDocs."""
import os
import shutil
import subprocess
import sys
import tempfile

CHECK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "check_docs.py")
BENCH_DOCS = os.path.join(os.path.dirname(CHECK), "bench_docs.py")

README = """# x

## Set-up (a fresh Debian 12 machine, as root)

```sh
./troupe run configs/cartpole_swingup_state.textproto
```

```sh
./tools/test.sh
```

## Use

```sh
troupe run configs/a.textproto --set a.b=1 --slurm --partition=cpu   # sbatch's options pass
mpirun -np 2 troupe learner --config configs/a.textproto --certs certs
troupe bench envs --seconds 2
python3 tools/table.py docs/results --machine "2-core VM"
build/release/bench/d4pg_bench --peers pixels
```

```text
anything
```

See [running](docs/running.md#a-run), [design](docs/design.md) and [speed](docs/benchmarks/demo.md).
"""
# A page of figures: one block generated from its JSON (by tools/bench_docs.py
# --write when the clean tree is made), one table kept from elsewhere.
SPEED = """# Speed

<!-- bench: demo -->
<!-- /bench -->

<!-- kept: from a GPU lease at commit 0123abc, not re-measured -->
| figure | troupe | peer | ratio |
| --- | --- | --- | --- |
| step | 5 | 4 | 1.25 |
"""
DEMO_JSON = """{"benchmark": "demo", "figures": [
  {"name": "steps/s", "value": 300.0, "unit": "steps/s", "reference": "Peer 1.0, 5 alternated rounds of at least 2 s and 4 steps after 1 warm-up, median [min-max], both 2 threads unpinned", "reference_value": 200.0, "ratio": 1.5, "rounds": 5, "value_min": 290.0, "value_max": 310.0, "reference_min": 150.0, "reference_max": 210.0}],
 "run": {"command": "troupe bench demo", "commit": "0123abcdef01", "machine": {"cpu": "x", "cores": 2}, "started": "2026-11-29T00:00:00Z", "load_before": 0.5, "load_after": 0.7}}
"""
RUNNING = """# Running

## A run

![picture](images/p.png) and [back](../README.md#use).
"""
DESIGN = """# Design

## Layers

| folder | holds | may include |
| --- | --- | --- |
| `proto/` | schemas | nothing |
| `common/` | shared pieces | proto |
"""
CHECK_LAYERS = """# the layer table of docs/design.md
declare -A allowed=(
  [proto]=""
  [common]="proto"
)
"""
RUN_COMMAND = """
  CLI::App* cmd = app.add_subcommand("run", "Run");
  cmd->add_option("--set", args->overrides, "Override");
  cmd->add_flag("--slurm", args->slurm, "Slurm");
"""
LEARNER_COMMAND = """
  CLI::App* cmd = app.add_subcommand("learner", "Learner");
  cmd->add_option("--config", args->config, "Config");
  args->security.AddTo(cmd);
"""
SECURITY = """  cmd->add_option("--certs", certs_dir, "TLS");"""
BENCH_COMMAND = """
  CLI::App* cmd = app.add_subcommand("bench", "Bench");
  cmd->add_option("--seconds", args->seconds, "Seconds");
"""
REGISTRY = """      {"envs", "env steps/s", RunEnvsBenchmark},\n"""
TABLE = """parser.add_argument("--machine")\n"""
BENCH_CMAKE = """add_executable(d4pg_bench d4pg_bench_main.cc)\n"""
D4PG_BENCH = """if (std::strcmp(argv[i], "--peers") == 0) {}\n"""


def write(root, path, text):
    path = os.path.join(root, path)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def clean_tree(root):
    for path, text in {
        "README.md": README, "docs/running.md": RUNNING, "docs/design.md": DESIGN, "docs/images/p.png": "",
        "docs/results/.keep": "", "tools/check_layers.sh": CHECK_LAYERS, "tools/test.sh": "", "tools/table.py": TABLE,
        "configs/a.textproto": "", "configs/cartpole_swingup_state.textproto": "", "cli/run_command.cc": RUN_COMMAND, "cli/learner_command.cc": LEARNER_COMMAND,
        "cli/bench_command.cc": BENCH_COMMAND, "cli/security_flags.h": SECURITY, "bench/registry.cc": REGISTRY,
        "bench/CMakeLists.txt": BENCH_CMAKE, "bench/d4pg_bench_main.cc": D4PG_BENCH,
        "docs/benchmarks/demo.md": SPEED, "docs/benchmarks/data/demo.json": DEMO_JSON,
    }.items():
        write(root, path, text)
    subprocess.run([sys.executable, BENCH_DOCS, root, "--write"], check=True, capture_output=True, timeout=60)


def replace(root, path, old, new):
    full = os.path.join(root, path)
    with open(full, encoding="utf-8") as f:
        text = f.read()
    assert old in text, (path, old)
    with open(full, "w", encoding="utf-8") as f:
        f.write(text.replace(old, new))


# name: (mutation of the clean tree, what the report must say)
CASES = {
    "a README too long": (lambda r: replace(r, "README.md", "# x\n", "# x\n" + "line\n" * 230),
                          "lines; at most 220"),
    "a page not linked": (lambda r: write(r, "docs/extra.md", "# Extra\n"), "no link to docs/extra.md"),
    "a link to nothing": (lambda r: replace(r, "README.md", "docs/design.md)", "docs/desing.md)"),
                          "README.md:27: link to docs/desing.md: no such file"),
    "an anchor to nothing": (lambda r: replace(r, "README.md", "#a-run", "#a-walk"), "no heading #a-walk"),
    "a picture that is not there": (lambda r: os.remove(os.path.join(r, "docs/images/p.png")),
                                    "docs/running.md:5: link to images/p.png"),
    "an unlabelled block": (lambda r: replace(r, "README.md", "```text\n", "```\n"), "README.md:23: fenced block labelled ''"),
    "an unknown verb": (lambda r: replace(r, "README.md", "troupe bench envs", "troupe benchmark envs"),
                        "`troupe benchmark`: no such verb"),
    "an unknown flag": (lambda r: replace(r, "README.md", "--set a.b=1", "--sett a.b=1"),
                        "README.md:16: `troupe run`: --sett is not one of its options"),
    "a flag of another verb": (lambda r: replace(r, "README.md", "--certs certs", "--certs certs --set x=1"),
                               "`troupe learner`: --set is not one of its options"),
    "an unknown benchmark": (lambda r: replace(r, "README.md", "bench envs", "bench env"), "no such benchmark"),
    "a missing script": (lambda r: os.remove(os.path.join(r, "tools/table.py")), "no tools/table.py"),
    "a script flag it does not take": (lambda r: replace(r, "README.md", "--machine", "--machines"),
                                       "`tools/table.py`: --machines is not one of its options"),
    "a program that is not built": (lambda r: replace(r, "README.md", "bench/d4pg_bench", "bench/d4pg_bnch"),
                                    "no program d4pg_bnch"),
    "a set-up command changed": (lambda r: replace(r, "README.md", "./tools/test.sh\n", "./tools/test.sh asan\n"),
                                 "the set-up section's commands"),
    "a layer table that differs": (lambda r: replace(r, "docs/design.md", "| shared pieces | proto |",
                                                     "| shared pieces | nothing |"),
                                   "docs/design.md:8: common/ may include nothing here, but proto"),
    "a design page not cited": (lambda r: replace(r, "tools/check_layers.sh", "docs/design.md", "DESIGN.md"),
                                "does not cite docs/design.md"),
    "a figure typed by hand": (lambda r: replace(r, "docs/benchmarks/demo.md", "| 300.0 [", "| 330.0 ["),
                               "docs/benchmarks/demo.md:3: bench block 'demo' is not what docs/benchmarks/data/demo.json says"),
    "a figure measured again, the page not regenerated": (
        lambda r: replace(r, "docs/benchmarks/data/demo.json", '"value": 300.0', '"value": 280.0'),
        "bench block 'demo' is not what"),
    "a table of figures with no measurement behind it": (
        lambda r: replace(r, "docs/benchmarks/demo.md", "<!-- kept: from a GPU lease at commit 0123abc, not re-measured -->\n", ""),
        "a table of figures outside a bench block"),
    "a block whose JSON is not there": (lambda r: os.remove(os.path.join(r, "docs/benchmarks/data/demo.json")),
                                        "bench block 'demo': no docs/benchmarks/data/demo.json"),
}


def check(root):
    done = subprocess.run([sys.executable, CHECK, root], capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout + done.stderr


def main():
    failures = 0
    with tempfile.TemporaryDirectory() as top:
        clean = os.path.join(top, "clean")
        clean_tree(clean)
        code, out = check(clean)
        if code != 0:
            print(f"FAIL: a clean tree was refused:\n{out}")
            failures += 1
        for name, (mutate, expected) in CASES.items():
            root = os.path.join(top, name.replace(" ", "_"))
            shutil.copytree(clean, root)
            mutate(root)
            code, out = check(root)
            if code == 0 or expected not in out:
                print(f"FAIL: {name}: exit {code}, expected a report with {expected!r}:\n{out}")
                failures += 1
    if failures:
        return 1
    print(f"PASS: a clean tree passes, and {len(CASES)} broken ones fail naming the fault")
    return 0


if __name__ == "__main__":
    sys.exit(main())

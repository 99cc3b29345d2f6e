#!/usr/bin/env python3
"""The results tables of docs/results.md from sweeps of the task configs.

    tools/results_table.py runs/results_state [--pixels runs/results_pixels] [--machine TEXT] [--check PAGE]

Each DIR holds one sweep directory per task (tools/results.sh makes
them: DIR/<task>/seed-N/ run directories). Per task: the final evaluation
return of each seed (its last eval.csv row, counted only once the run has
reached its budget: the sweep's `done` file), mean and standard deviation over the finished seeds, and
the env frames and wall time at which each seed first reached 90% of its own
final return (median over seeds); next to the published numbers at 500k
steps as the DrQ paper's Table 1 reports them (Kostrikov, Yarats & Fergus
2020: SAC from state; DrQ and CURL from pixels). Prints Markdown; --csv
writes the per-seed rows too. Standard library only.

A run that finished but whose files were not kept (tools/results_keep.sh
copies what this reads into the repository) is listed in DIR/not_kept.txt,
one TASK/seed-N a line; its per-seed cell is "not kept", the task's mean
counts only the runs there are ("(2; 1 not kept)"), and a run both kept and
listed is an error. A seed below a known one that is neither is "no run".

--check PAGE compares the tables of PAGE (docs/results.md) headed as these
are with what the runs give, cell by cell, and exits 1 on a difference: a
value of a kept run must be shown as it is computed here, unmarked; a run
not kept only as a value marked with a dagger (u+2020), and a mean, frames
or wall time over a row with such a run only marked (or as printed here);
a seed or task neither kept nor listed must not be shown; the published
numbers must match; the machine column is not compared. PAGE must explain
the mark in a line that starts with it.
"""
import argparse
import csv
import math
import os
import re
import statistics
import sys

from troupe_layout import layout

# DrQ paper, Table 1, "500K step scores" (mean +- std over seeds).
PUBLISHED_STATE = {  # SAC from state
    "finger_spin": (923, 21), "cartpole_swingup": (848, 15), "reacher_easy": (923, 37),
    "cheetah_run": (795, 30), "walker_walk": (948, 54), "ball_in_cup_catch": (974, 33),
}
PUBLISHED_PIXELS = {  # DrQ, CURL
    "finger_spin": ((938, 103), (926, 45)), "cartpole_swingup": ((868, 10), (841, 45)),
    "reacher_easy": ((942, 71), (929, 44)), "cheetah_run": ((660, 96), (518, 28)),
    "walker_walk": ((921, 45), (902, 43)), "ball_in_cup_catch": ((963, 9), (959, 27)),
}
NOT_KEPT_FILE = "not_kept.txt"
NOT_KEPT = "not kept"  # a run that finished, listed in DIR/not_kept.txt
NO_RUN = "no run"  # a seed below a known one, neither kept nor listed
MARK = "\u2020"  # the page's mark of a value not reproducible from the repository
TASKS = ["cartpole_balance", "cartpole_swingup", "pendulum_swingup", "reacher_easy", "finger_spin", "cheetah_run",
         "walker_walk", "ball_in_cup_catch"]


def read_csv(path):
    with open(path, newline="") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


def whole_run_seconds(metrics):
    """Rows with `seconds` counted over all of a run's pieces. Runs resumed
    before troupe carried the clock over (common/run_layout.h LastRunSeconds)
    started it again at 0: each such drop adds the piece before it."""
    offset, previous = 0.0, None
    for row in metrics:
        if previous is not None and row["seconds"] < previous:
            offset += previous
        previous = row["seconds"]
        row["seconds"] += offset
    return metrics


def seconds_at(metrics, frames):
    """Wall seconds of the run when it had stepped `frames` env frames (linear between metrics rows)."""
    previous = None
    for row in metrics:
        if row["frames"] >= frames:
            if previous is None or row["frames"] == previous["frames"]:
                return row["seconds"]
            t = (frames - previous["frames"]) / (row["frames"] - previous["frames"])
            return previous["seconds"] + t * (row["seconds"] - previous["seconds"])
        previous = row
    return math.nan


def seed_result(run_dir):
    """(final return, frames to 90%, seconds to 90%, done) of one run, or None before its first evaluation."""
    eval_path = layout.path(run_dir, "eval_csv")
    if not os.path.exists(eval_path):
        return None
    evals = read_csv(eval_path)
    if not evals:
        return None
    final = evals[-1]["eval_return"]
    # Done: the sweep marked it so (it reached its budget); its last
    # evaluation is the final policy's, at its end.
    done = os.path.exists(os.path.join(run_dir, "done"))
    first = next((e for e in evals if e["eval_return"] >= 0.9 * final), evals[-1])
    metrics_path = layout.path(run_dir, "metrics_csv")
    metrics = whole_run_seconds(read_csv(metrics_path)) if os.path.exists(metrics_path) else []
    return final, first["frames"], seconds_at(metrics, first["frames"]), done, evals[-1]["frames"]


def mean_std(values):
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{statistics.mean(values):.0f} ± {statistics.stdev(values):.0f}"


def published(task, table, index=None):
    value = table.get(task)
    if value is None:
        return "-"
    if index is not None:
        value = value[index]
    return f"{value[0]} ± {value[1]}"


def not_kept_runs(directory):
    """{task: {seed}} of DIR/not_kept.txt (TASK/seed-N a line, # comments)."""
    path = os.path.join(directory, NOT_KEPT_FILE)
    listed = {}
    if not os.path.exists(path):
        return listed
    with open(path) as f:
        for number, line in enumerate(f, 1):
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            m = re.fullmatch(r"([a-z_]+)/seed-([0-9]+)", words[0])
            if not m:
                sys.exit(f"results_table: {path}:{number}: not TASK/seed-N: {line.strip()}")
            listed.setdefault(m.group(1), set()).add(int(m.group(2)))
    return listed


def header(pixels):
    return ["task", "troupe D4PG (seeds done)", "per seed", "frames to 90%", "wall time to 90%"] + (
        ["DrQ", "CURL"] if pixels else ["SAC state"]) + ["machine"]


def table_rows(directory, machine, pixels, per_seed):
    """[(task as the page names it, cells, per-seed cells, runs not there)] of one table."""
    listed = not_kept_runs(directory)
    unknown = sorted(set(listed) - set(TASKS))
    if unknown:
        sys.exit(f"results_table: {os.path.join(directory, NOT_KEPT_FILE)} lists {', '.join(unknown)}: not a task")
    rows = []
    for task in TASKS:
        sweep = os.path.join(directory, task)
        finals, frames90, seconds90, seeds = [], [], [], {}
        names = os.listdir(sweep) if os.path.isdir(sweep) else []
        for name in sorted(names, key=lambda n: (len(n), n)):
            run = os.path.join(sweep, name)
            if not (re.fullmatch(r"seed-[0-9]+", name) and os.path.isdir(run)):
                continue
            result = seed_result(run)
            if result is None:
                continue
            seed = int(name.split("-")[1])
            if seed in listed.get(task, ()):
                sys.exit(f"results_table: {run} is kept and listed in {os.path.join(directory, NOT_KEPT_FILE)}: "
                         f"take {task}/{name} off the list")
            final, f90, s90, done, at = result
            per_seed.append([task, name, done, at, final, f90, s90])
            if done:
                finals.append(final)
                frames90.append(f90)
                seconds90.append(s90)
                seeds[seed] = f"{final:.0f}"
            else:
                seeds[seed] = f"({final:.0f} at {at / 1000:.0f}k)"
        for seed in listed.get(task, ()):
            seeds[seed] = NOT_KEPT
        if not seeds:
            continue
        cells = [seeds.get(seed, NO_RUN) for seed in range(max(seeds) + 1)]
        missing = sum(cell in (NOT_KEPT, NO_RUN) for cell in cells)
        reference = ([published(task, PUBLISHED_PIXELS, 0), published(task, PUBLISHED_PIXELS, 1)]
                     if pixels else [published(task, PUBLISHED_STATE)])
        to90 = f"{statistics.median(frames90) / 1000:.0f}k" if frames90 else "-"
        wall = f"{statistics.median(seconds90) / 60:.1f} min" if seconds90 else "-"
        count = "; ".join([f"{len(finals)}"] + [f"{cells.count(kind)} {kind}" for kind in (NOT_KEPT, NO_RUN)
                                                 if kind in cells])
        name = ".".join(task.rsplit("_", 1))
        rows.append((name, [name, f"{mean_std(finals)} ({count})", ", ".join(cells), to90, wall] + reference
                     + [machine], cells, missing))
    return rows


def markdown(cells):
    return "| " + " | ".join(cells) + " |"


def table(directory, machine, pixels, per_seed):
    head = header(pixels)
    lines = [markdown(head), "|" + " --- |" * len(head)]
    lines += [markdown(cells) for _, cells, _, _ in table_rows(directory, machine, pixels, per_seed)]
    return "\n".join(lines)


def check(page, tables):
    """Faults of PAGE's tables against [(directory, pixels, rows)] (see the module's doc)."""
    with open(page, encoding="utf-8") as f:
        lines = f.read().split("\n")
    faults, marked = [], False

    def split(line):
        return [c.strip() for c in line.strip().strip("|").split("|")]

    for directory, pixels, rows in tables:
        head = header(pixels)
        start = next((i for i, line in enumerate(lines) if line.startswith("|") and split(line) == head), None)
        if start is None:
            faults.append(f"{page}: no table headed {markdown(head)}")
            continue
        shown, i = {}, start + 2
        while i < len(lines) and lines[i].startswith("|"):
            cells = split(lines[i])
            shown[cells[0]] = (i + 1, cells)
            i += 1
        listed = os.path.join(directory, NOT_KEPT_FILE)
        given = {name: (cells, seeds, missing) for name, cells, seeds, missing in rows}
        for name, (number, cells) in shown.items():
            where = f"{page}:{number}: {name}"
            marked = marked or any(MARK in c for c in cells)
            if name not in given:
                faults.append(f"{where}: no run of it kept in {directory} nor listed in {listed}")
                continue
            want, seeds, missing = given[name]
            if len(cells) != len(want):
                faults.append(f"{where}: {len(cells)} columns, not {len(want)}")
                continue
            page_seeds = cells[2].split(", ")
            for seed, value in enumerate(page_seeds):
                run = os.path.join(directory, name.replace(".", "_"), f"seed-{seed}")
                computed = seeds[seed] if seed < len(seeds) else NO_RUN
                if computed == NO_RUN:
                    faults.append(f"{where} seed {seed}: {value}, but {run} is not kept nor listed in {listed}")
                elif computed == NOT_KEPT:
                    if not (value.endswith(MARK) and len(value) > len(MARK)):
                        faults.append(f"{where} seed {seed}: {value} unmarked, but its run is not kept (listed in "
                                      f"{listed}): mark it {MARK}")
                elif value == computed + MARK:
                    faults.append(f"{where} seed {seed}: {value} marked, but {run} is kept and gives it: unmark it")
                elif value != computed:
                    faults.append(f"{where} seed {seed}: {value}, but {run} gives {computed}")
            for seed in range(len(page_seeds), len(seeds)):
                faults.append(f"{where} seed {seed}: not shown, but {directory} has {seeds[seed]}")
            for column in (1, 3, 4):
                if cells[column] != want[column] and not (missing and MARK in cells[column]):
                    faults.append(f"{where} {head[column]}: {cells[column]}, but the kept runs give {want[column]}"
                                  + (f" (over a run not kept: mark it {MARK})" if missing else ""))
            for column in range(5, len(head) - 1):
                if cells[column] != want[column]:
                    faults.append(f"{where} {head[column]}: {cells[column]}, not {want[column]}")
        for name in given:
            if name not in shown:
                faults.append(f"{page}:{start + 1}: no row for {name}, which {directory} has")
    if marked and not any(line.startswith(MARK) for line in lines):
        faults.append(f"{page}: {MARK} marks values, but no line starting with {MARK} says what it means")
    return faults


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("state", help="directory of per-task state sweeps")
    parser.add_argument("--pixels", help="directory of per-task pixel sweeps")
    parser.add_argument("--machine", default=f"{os.cpu_count()} cores, CPU", help="the machine, named in every row")
    parser.add_argument("--frames", type=int, default=500000, help="the runs' budget in env frames (for the titles)")
    parser.add_argument("--csv", help="write every seed's row here")
    parser.add_argument("--check", metavar="PAGE", help="compare PAGE's tables with these runs; exit 1 if they differ")
    args = parser.parse_args()
    if not os.path.isdir(args.state):
        sys.exit(f"results_table: {args.state} is not a directory")
    if args.pixels and not os.path.isdir(args.pixels):
        sys.exit(f"results_table: {args.pixels} is not a directory")
    per_seed = []
    print(f"From state, {args.frames:,} env frames (final eval return; in brackets: runs still going; "
          f"\"{NOT_KEPT}\": runs listed in {NOT_KEPT_FILE}):\n")
    print(table(args.state, args.machine, False, per_seed))
    if args.pixels:
        print(f"\nFrom pixels, {args.frames:,} env frames:\n")
        print(table(args.pixels, args.machine, True, per_seed))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["task", "seed", "done", "frames", "final_return", "frames_to_90", "seconds_to_90"])
            writer.writerows(per_seed)
    if args.check:
        tables = [(args.state, False, table_rows(args.state, args.machine, False, []))]
        if args.pixels:
            tables.append((args.pixels, True, table_rows(args.pixels, args.machine, True, [])))
        faults = check(args.check, tables)
        for fault in faults:
            print(fault, file=sys.stderr)
        if faults:
            sys.exit(f"results_table: {args.check} differs from the runs in {len(faults)} place(s)")
        print(f"\nresults_table: the tables of {args.check} agree with these runs")


if __name__ == "__main__":
    main()

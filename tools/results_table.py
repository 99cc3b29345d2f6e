#!/usr/bin/env python3
"""The results tables of docs/results.md from sweeps of the task configs.

    tools/results_table.py runs/results_state [--pixels runs/results_pixels] [--machine TEXT]

Each DIR holds one sweep directory per task (tools/results.sh makes
them: DIR/<task>/seed-N/ run directories). Per task: the final evaluation
return of each seed (its last eval.csv row, counted only once the run has
reached its budget: the sweep's `done` file), mean and standard deviation over the finished seeds, and
the env frames and wall time at which each seed first reached 90% of its own
final return (median over seeds); next to the published numbers at 500k
steps as the DrQ paper's Table 1 reports them (Kostrikov, Yarats & Fergus
2020: SAC from state; DrQ and CURL from pixels). Prints Markdown; --csv
writes the per-seed rows too. Standard library only.
"""
import argparse
import csv
import math
import os
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


def table(directory, machine, pixels, per_seed):
    rows = []
    head = ("| task | troupe D4PG (seeds done) | per seed | frames to 90% | wall time to 90% | "
            + ("DrQ | CURL |" if pixels else "SAC state |") + " machine |")
    rows.append(head)
    rows.append("|" + " --- |" * (head.count("|") - 1))
    for task in TASKS:
        sweep = os.path.join(directory, task)
        if not os.path.isdir(sweep):
            continue
        finals, frames90, seconds90, cells = [], [], [], []
        for name in sorted(os.listdir(sweep)):
            run = os.path.join(sweep, name)
            if not (name.startswith("seed-") and os.path.isdir(run)):
                continue
            result = seed_result(run)
            if result is None:
                continue
            final, f90, s90, done, at = result
            per_seed.append([task, name, done, at, final, f90, s90])
            if done:
                finals.append(final)
                frames90.append(f90)
                seconds90.append(s90)
                cells.append(f"{final:.0f}")
            else:
                cells.append(f"({final:.0f} at {at / 1000:.0f}k)")
        if not cells:
            continue
        reference = (published(task, PUBLISHED_PIXELS, 0) + " | " + published(task, PUBLISHED_PIXELS, 1)
                     if pixels else published(task, PUBLISHED_STATE))
        to90 = f"{statistics.median(frames90) / 1000:.0f}k" if frames90 else "-"
        wall = f"{statistics.median(seconds90) / 60:.1f} min" if seconds90 else "-"
        rows.append(f"| {'.'.join(task.rsplit('_', 1))} | "
                    f"{mean_std(finals)} ({len(finals)}) | {', '.join(cells)} | {to90} | {wall} | {reference} | "
                    f"{machine} |")
    return "\n".join(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("state", help="directory of per-task state sweeps")
    parser.add_argument("--pixels", help="directory of per-task pixel sweeps")
    parser.add_argument("--machine", default=f"{os.cpu_count()} cores, CPU", help="the machine, named in every row")
    parser.add_argument("--frames", type=int, default=500000, help="the runs' budget in env frames (for the titles)")
    parser.add_argument("--csv", help="write every seed's row here")
    args = parser.parse_args()
    if not os.path.isdir(args.state):
        sys.exit(f"results_table: {args.state} is not a directory")
    per_seed = []
    print(f"From state, {args.frames:,} env frames (final eval return; in brackets: runs still going):\n")
    print(table(args.state, args.machine, False, per_seed))
    if args.pixels:
        print(f"\nFrom pixels, {args.frames:,} env frames:\n")
        print(table(args.pixels, args.machine, True, per_seed))
    if args.csv:
        with open(args.csv, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["task", "seed", "done", "frames", "final_return", "frames_to_90", "seconds_to_90"])
            writer.writerows(per_seed)


if __name__ == "__main__":
    main()

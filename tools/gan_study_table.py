#!/usr/bin/env python3
"""The GAN batch-study table of docs/gan.md from the study's sweeps.

    tools/gan_study_table.py runs/batch_study [--machine TEXT]

STUDY_DIR holds one sweep directory per part of the study
(tools/gan_batch_study.sh makes equal_images/, replicas_2/, equal_steps/),
each with one run directory per grid point. Per run: the batch size, the
learning-rate scaling and the replicas (from its config.textproto), the
images and steps of its last evaluation, the classifier-FID there and the
best over the run, and the median images/s of its metrics rows (a figure of
the machine as it was shared, not a benchmark: `troupe bench gan` is).
Runs not done (no `done` file from the sweep) are shown with where they
stand, in brackets. Prints Markdown. Standard library only.
"""
import argparse
import csv
import os
import re
import statistics
import sys

from troupe_layout import layout


def config_value(text, field, default):
    match = re.search(r"^\s*" + field + r":\s*(\S+)", text, re.M)
    return match.group(1) if match else default


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def run_row(part, run_dir):
    """The table's cells for one run directory, or None before its first evaluation past 0 images."""
    with open(layout.path(run_dir, "config")) as f:
        config = f.read()
    config = config[config.find("gan {"):] if "gan {" in config else config  # the GAN section's fields
    evals = [e for e in read_rows(layout.path(run_dir, "eval_csv")) if int(e["images"]) > 0]
    if not evals:
        return None
    last = evals[-1]
    fids = [float(e["classifier_fid"]) for e in evals]
    rates = [float(m["images_per_s"]) for m in read_rows(layout.path(run_dir, "metrics_csv"))]
    done = os.path.exists(os.path.join(run_dir, "done"))
    final = f"{fids[-1]:.1f}" if done else f"({fids[-1]:.1f} at {int(last['images']) / 1000:.0f}k images)"
    return {
        "part": part,
        "batch": int(config_value(config, "batch_size", "64")),
        "scaling": config_value(config, "lr_scaling", "LINEAR"),
        "replicas": int(config_value(config, "replicas", "1")),
        "images": int(last["images"]),
        "steps": int(last["steps"]),
        "final": final,
        "best": f"{min(fids):.1f}",
        "rate": f"{statistics.median(rates):.0f}" if rates else "-",
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study_dir")
    parser.add_argument("--machine", default="")
    args = parser.parse_args()
    if not os.path.isdir(args.study_dir):
        print(f"{args.study_dir} is not a directory", file=sys.stderr)
        return 2
    rows = []
    for part in sorted(os.listdir(args.study_dir)):
        sweep = os.path.join(args.study_dir, part)
        if not os.path.isdir(sweep):
            continue
        for run in sorted(os.listdir(sweep)):
            run_dir = os.path.join(sweep, run)
            if os.path.exists(layout.path(run_dir, "config")):
                row = run_row(part, run_dir)
                if row is not None:
                    rows.append(row)
    rows.sort(key=lambda r: (r["part"], r["batch"], r["scaling"], r["replicas"]))
    machine = f" | {args.machine}" if args.machine else ""
    print("| part | batch | lr scaling | replicas | images | steps | classifier-FID, last | best | images/s (median)"
          + (" | machine |" if args.machine else " |"))
    print("| --- " * (9 + bool(args.machine)) + "|")
    for r in rows:
        print(f"| {r['part']} | {r['batch']} | {r['scaling']} | {r['replicas']} | {r['images']:,} | {r['steps']:,} | "
              f"{r['final']} | {r['best']} | {r['rate']}{machine} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

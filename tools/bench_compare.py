#!/usr/bin/env python3
"""Two runs of tools/bench_all.py side by side: does each figure reproduce?

    tools/bench_compare.py OLD_DIR NEW_DIR [--within 0.10] [--markdown]

For every figure (benchmark TAG, figure name, and its reference where it has
one, their numbers aside: a name may carry a measured size) in both
directories' TAG.json: troupe's value in each run, the peer's,
and the ratio, and how far the new one is from the old (new / old - 1). A
ratio (troupe against its peer, measured in the same run) is what a reader is
shown, so it is what must reproduce: a row fails when its ratio moved by more
than --within (10%). Figures without a peer (counts, bytes, milliseconds of
host time) are listed with their own change but judged only with --values.
Figures in one run only are named. Exit 1 when a judged row failed.
"""

import argparse
import json
import os
import re
import sys


# The protocol's words in a reference ("5 alternated rounds of at least 2 s
# and 4 steps after 1 warm-up, median [min-max], both 2 threads unpinned",
# bench/protocol.h): how the pair was measured, not which peer it is, and
# worded differently as the protocol grew; left out of the key.
PROTOCOL = re.compile(r",? ?# alternated rounds of .*?(?:unpinned|pinned)")


def shape(text):
    """A figure's name or reference with its numbers as '#' and without the
    protocol's words: names that carry a measured size ("wire bytes: 3209 B
    an item") match across runs, and references across protocol wordings."""
    return PROTOCOL.sub("", re.sub(r"\d[\d,.]*", "#", text))


def load(directory):
    """{(tag, name, reference, n): figure} of every TAG.json in `directory`,
    names and references by shape()."""
    figures = {}
    for file in sorted(os.listdir(directory)):
        if not file.endswith(".json"):
            continue
        tag = file[: -len(".json")]
        with open(os.path.join(directory, file)) as f:
            data = json.load(f)
        seen = {}
        for figure in data.get("figures", []):
            key = (tag, shape(figure["name"]), shape(figure.get("reference", "")))
            # The same name and reference twice in one benchmark: numbered.
            seen[key] = seen.get(key, 0) + 1
            figures[key + (seen[key],)] = figure
    return figures


def change(old, new):
    if old in (None, 0) or new is None:
        return None
    return new / old - 1


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--within", type=float, default=0.10, help="largest change of a ratio that reproduces")
    parser.add_argument("--values", action="store_true", help="judge figures without a peer by their value too")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = parser.parse_args(argv)
    old, new = load(args.old), load(args.new)
    rows, failed = [], 0
    for key in sorted(old.keys() & new.keys()):
        a, b = old[key], new[key]
        ratio_a, ratio_b = a.get("ratio"), b.get("ratio")
        judged = ratio_a is not None and ratio_b is not None
        moved = change(ratio_a, ratio_b) if judged else change(a.get("value"), b.get("value"))
        if not judged and not args.values:
            verdict = "-"
        elif moved is None:
            verdict = "no value"
        elif abs(moved) <= args.within:
            verdict = "reproduced"
        else:
            verdict = "MOVED"
            failed += 1
        rows.append((key[0], b["name"], b.get("reference", ""), a.get("value"), b.get("value"), ratio_a, ratio_b, moved,
                     verdict))
    only = sorted((old.keys() ^ new.keys()))

    def number(x):
        return "-" if x is None else f"{x:.4g}"

    if args.markdown:
        print("| benchmark | figure | peer | troupe then | troupe now | ratio then | ratio now | change | verdict |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for tag, name, reference, va, vb, ra, rb, moved, verdict in rows:
        peer = reference.split(",")[0] if reference else ""
        cells = [tag, name, peer, number(va), number(vb), number(ra), number(rb),
                 "-" if moved is None else f"{100 * moved:+.1f}%", verdict]
        print("| " + " | ".join(cells) + " |" if args.markdown else "  ".join(cells))
    for key in only:
        print(f"only in {'the old' if key in old else 'the new'} run: {key[0]}: {key[1]}"
              + (f" ({key[2]})" if key[2] else ""))
    judged_rows = sum(1 for r in rows if r[8] != "-")
    print(f"{judged_rows} figures judged, {judged_rows - failed} within {100 * args.within:.0f}%, {failed} moved more"
          f"; {len(rows) - judged_rows} without a peer listed; {len(only)} in one run only")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

#!/usr/bin/env python3
"""The soak's verdict and chart (tools/soak.sh runs it at the end).

    tools/soak_summary.py OUT WINDOW_OPENS_S ENDS_S [LEAK_FILE ...]

OUT/memory.csv (t_s,pid,role,rss_mib: each process's resident memory,
sampled every 10 s) -> OUT/summary.txt, per process (role): its memory in
the first minute (mean), the least in the window's first third and in its
last third, their growth, and the window's peak; OUT/memory.svg, the
samples as a chart with the window shaded. The verdict is the least
memory's growth: memory kept raises the troughs, while an evaluation's
env, renderer and episodes come and go as a peak (a third of the window
must outlast an evaluation and the time between two). Exit 1, saying why
in summary.txt's last line, when any process's least memory grew by 5% or
more in the window or a LEAK_FILE is named (the logs where LeakSanitizer
reported leaks), or OUT/run.log says an actor had to be killed at the stop
(it never ended on its own: with AddressSanitizer, its leak check never
ran).
"""
import csv
import sys


def main():
    out, opens, ends, leaks = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
    rows = list(csv.DictReader(open(f"{out}/memory.csv")))
    roles = sorted({r["role"] for r in rows}, key=lambda r: (r != "learner", r))
    def samples(role, lo, hi):
        return [float(r["rss_mib"]) for r in rows if r["role"] == role and lo <= int(r["t_s"]) < hi]
    third = (ends - opens) // 3
    lines = [f"soak: {ends // 60} min, window from minute {opens // 60} (resident memory, MiB: the first minute's mean; "
             "the least in the window's first and last third, and its peak)",
             f"{'process':<10} {'at start':>9} {'window opens':>13} {'end':>9} {'growth in window':>17} {'peak':>9}"]
    bad = []
    for role in roles:
        start, window = samples(role, 0, 60), samples(role, opens, ends)
        opening, closing = samples(role, opens, opens + third), samples(role, ends - third, ends)
        if not (start and opening and closing):
            bad.append(f"{role}: no samples in the first minute or a third of the window")
            continue
        first, at_open, last = sum(start) / len(start), min(opening), min(closing)
        growth = (last - at_open) / at_open * 100
        lines.append(f"{role:<10} {first:>9.0f} {at_open:>13.0f} {last:>9.0f} {growth:>16.1f}% {max(window):>9.0f}")
        if not growth < 5:
            bad.append(f"{role} grew {growth:.1f}% in the window")
    bad += [f"LeakSanitizer reported leaks in {path}" for path in leaks]
    with open(f"{out}/run.log", errors="replace") as log:
        bad += [line.strip() for line in log if "s after its stop signal; killed" in line]
    lines.append("growth under 5% for every process, no leak reported" if not bad else "FAILED: " + "; ".join(bad))
    open(f"{out}/summary.txt", "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))

    # memory.svg: each process's resident memory over the run, the window shaded
    # (a chart without plotting libraries: Debian's python3 has none).
    W, H, left, right, top, bottom = 720, 360, 60, 110, 20, 40
    tmax = max(ends, max(int(r["t_s"]) for r in rows))
    ymax = max(float(r["rss_mib"]) for r in rows) * 1.1
    x = lambda t: left + (W - left - right) * t / tmax
    y = lambda m: H - bottom - (H - top - bottom) * m / ymax
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
           f'<rect x="{x(opens):.1f}" y="{top}" width="{x(ends) - x(opens):.1f}" height="{H - top - bottom}" fill="#eef3fb"/>',
           f'<text x="{x(opens) + 4:.1f}" y="{top + 12}" fill="#456">window</text>',
           f'<line x1="{left}" y1="{H - bottom}" x2="{W - right}" y2="{H - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{H - bottom}" stroke="black"/>']
    for minute in range(0, tmax // 60 + 1, 5):
        svg.append(f'<text x="{x(60 * minute):.1f}" y="{H - bottom + 15}" text-anchor="middle">{minute}</text>')
    step = 10 ** max(len(str(int(ymax))) - 1, 1) // 2 or 1
    for mib in range(0, int(ymax) + 1, step):
        svg.append(f'<text x="{left - 5}" y="{y(mib) + 4:.1f}" text-anchor="end">{mib}</text>')
    svg.append(f'<text x="{(left + W - right) / 2:.0f}" y="{H - 5}" text-anchor="middle">minutes</text>')
    svg.append(f'<text x="12" y="{(top + H - bottom) / 2:.0f}" transform="rotate(-90 12 {(top + H - bottom) / 2:.0f})" '
               'text-anchor="middle">resident memory, MiB</text>')
    colors = ["#c0392b", "#2471a3", "#229954", "#7d3c98", "#b9770e", "#566573"]
    for i, role in enumerate(roles):
        points = " ".join(f"{x(int(r['t_s'])):.1f},{y(float(r['rss_mib'])):.1f}" for r in rows if r["role"] == role)
        svg.append(f'<polyline fill="none" stroke="{colors[i % len(colors)]}" stroke-width="1.5" points="{points}"/>')
        svg.append(f'<text x="{W - right + 8}" y="{top + 14 * (i + 1)}" fill="{colors[i % len(colors)]}">{role}</text>')
    svg.append("</svg>")
    open(f"{out}/memory.svg", "w").write("\n".join(svg) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

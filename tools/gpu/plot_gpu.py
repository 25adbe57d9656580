# SPDX-License-Identifier: Apache-2.0
"""plot_gpu: docs/perf/gpu_<collective>.png from one run of tools/gpu-check's speed stage.

Reads DIR/<lib>-<collective>-n<ranks>.log: nccl-tests output of ncclshim and of the genuine
NCCL (libs "ncclshim" and "genuine"; the genuine one at 2 ranks or more with a host per rank,
the only way it runs several ranks on one GPU), and tools/compare/gloo_perf.py's rows (lib
"gloo", PyTorch's Gloo on host memory). Plots, per collective, the bandwidth against size, a
panel per rank count, a line per library (tools/compare/plot.py): busbw, and at 1 rank algbw
(busbw is 0 there for most collectives). Runs where the logs were fetched to: it needs
matplotlib (`tools/deps.sh compare`), which the GPU machine may lack.

The other mode draws one picture, one line per series, from logs named on the command line
(as the H200's run of 2026-11-28 kept them, docs/performance.md): SERIES is LABEL=LOG, an
nccl-tests log, whose busbw is drawn (algbw where the log has one rank), or LABEL=SIZE:GBS,...
for figures that only a table kept; LIMIT is LABEL=GBS, a dotted level (a memory limit).

Usage: python3 tools/gpu/plot_gpu.py DIR [OUT]     (OUT: docs/perf)
       python3 tools/gpu/plot_gpu.py --lines PNG TITLE SERIES... [--limit LIMIT...]
"""

import glob
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compare"))
import matplotlib.pyplot as plt  # noqa: E402  (plot.py chose the Agg backend)
from plot import human, plot_all  # noqa: E402

LOG_NAME = re.compile(r"^(genuine|ncclshim|gloo)-([a-z_]+)-n(\d+)\.log$")
LABELS = {"ncclshim": "ncclshim", "genuine": "genuine NCCL", "gloo": "Gloo (host memory)"}


def read(folder):
    """{(coll, nranks, label, size): GB/s} from every log in folder."""
    points = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.log"))):
        match = LOG_NAME.match(os.path.basename(path))
        if not match:
            continue
        lib, coll, nranks = match.group(1), match.group(2), int(match.group(3))
        with open(path, errors="replace") as log:
            for line in log:
                fields = line.split()
                # size count type redop root time algbw busbw #wrong ... (out of place)
                if len(fields) < 9 or line.lstrip().startswith("#") or not fields[0].isdigit():
                    continue
                bandwidth = float(fields[6] if nranks == 1 else fields[7])
                points[(coll, nranks, LABELS[lib], int(fields[0]))] = bandwidth
    return points


def read_series(spec):
    """(label, [(size, GB/s)]) from LABEL=LOG or LABEL=SIZE:GBS,SIZE:GBS,..."""
    label, _, source = spec.rpartition("=")
    if not os.path.exists(source):
        return label, sorted((int(size), float(gbs)) for size, gbs in
                             (point.split(":") for point in source.split(",")))
    with open(source, errors="replace") as log:
        text = log.read()
    ranks = len(re.findall(r"^#\s+Rank\s+\d+ ", text, re.M))
    rows = []
    for line in text.splitlines():
        fields = line.split()
        # size count type redop root time algbw busbw #wrong ... (out of place)
        if len(fields) < 9 or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        rows.append((int(fields[0]), float(fields[5]), float(fields[6]), float(fields[7])))
    # From the time, as the log's two decimals leave small sizes at 0.00: algbw is size /
    # time, busbw that times the collective's factor, read off the log's largest row.
    top = max(rows, key=lambda row: row[2])
    factor = 1.0 if ranks == 1 or top[2] == 0 else top[3] / top[2]
    return label, sorted((size, size / time_us / 1e3 * factor)
                         for size, time_us, _, _ in rows if time_us > 0)


def plot_lines(path, title, series, limits):
    """One panel: a line per series, a dotted level per limit, both axes logarithmic."""
    fig, ax = plt.subplots(figsize=(12, 5.5))
    sizes = set()
    for label, points in series:
        points = [(size, gbs) for size, gbs in points if gbs > 0]
        sizes.update(size for size, _ in points)
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label,
                linewidth=2.2 if label.startswith("ncclshim") else 1.2,
                linestyle="-" if label.startswith("ncclshim") else "--")
    for (label, gbs), style in zip(limits, [":", "-.", (0, (1, 4)), (0, (5, 5))] * 4):
        ax.axhline(gbs, color="black", linestyle=style, linewidth=0.9,
                   label=f"{label}: {gbs:g} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(sorted(sizes))
    ax.set_xticklabels([human(size) for size in sorted(sizes)])
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s; 1 rank: algbw)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main_lines(args):
    limits = []
    if "--limit" in args:
        at = args.index("--limit")
        args, limits = args[:at], [(label, float(gbs)) for label, _, gbs in
                                   (spec.rpartition("=") for spec in args[at + 1:])]
    if len(args) < 3:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    path, title = args[0], args[1]
    plot_lines(path, title, [read_series(spec) for spec in args[2:]], limits)
    print(path)
    return 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--lines":
        return main_lines(sys.argv[2:])
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-2], file=sys.stderr)
        return 2
    folder = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) == 3 else "docs/perf"
    points = read(folder)
    if not points:
        print(f"plot_gpu: no nccl-tests or gloo_perf rows under {folder}", file=sys.stderr)
        return 1
    colls = sorted({k[0] for k in points})
    ranks = sorted({k[1] for k in points})
    libs = [LABELS[lib] for lib in ("ncclshim", "genuine", "gloo")]
    os.makedirs(out, exist_ok=True)
    for path in plot_all(points, colls, ranks, libs, out, prefix="gpu_",
                         ylabel="busbw (GB/s; 1 rank: algbw)"):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())

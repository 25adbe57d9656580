# SPDX-License-Identifier: Apache-2.0
"""plot_gpu: docs/perf/gpu_<collective>.png from one run of tools/gpu-check's speed stage.

Reads DIR/<lib>-<collective>-n<ranks>.log: nccl-tests output of ncclshim and of the genuine
NCCL (libs "ncclshim" and "genuine"; the genuine one at 2 ranks or more with a host per rank,
the only way it runs several ranks on one GPU), and tools/compare/gloo_perf.py's rows (lib
"gloo", PyTorch's Gloo on host memory). Plots, per collective, the bandwidth against size, a
panel per rank count, a line per library (tools/compare/plot.py): busbw, and at 1 rank algbw
(busbw is 0 there for most collectives). Runs where the logs were fetched to: it needs
matplotlib (`tools/deps.sh compare`), which the GPU machine may lack.

Usage: python3 tools/gpu/plot_gpu.py DIR [OUT]     (OUT: docs/perf)
"""

import glob
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "compare"))
from plot import plot_all  # noqa: E402

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


def main():
    if len(sys.argv) not in (2, 3):
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
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

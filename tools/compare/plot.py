# SPDX-License-Identifier: Apache-2.0
"""plot.py: the PNGs of `make compare`, one per collective: busbw against size, one panel
per rank count (or layout of hosts and ranks), one line per library. Called by compare.py
with its medians."""

import os

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402


def human(size):
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if size >= scale:
            return f"{size / scale:g}{unit}"
    return str(size)


def plot_all(med, colls, ranks, libs, out, prefix="", ylabel="busbw (GB/s)"):
    """med: {(coll, nranks, lib, size): busbw}, nranks a rank count or anything else that
    names a panel (compare.Layout); writes out/<prefix><coll>.png and returns the paths."""
    paths = []
    for coll in colls:
        fig, axes = plt.subplots(1, len(ranks), figsize=(6 * len(ranks), 4.5), squeeze=False)
        for ax, nranks in zip(axes[0], ranks):
            for lib in libs:
                points = sorted((k[3], v) for k, v in med.items()
                                if k[:3] == (coll, nranks, lib) and k[3] > 0 and v > 0)
                if points:
                    ax.plot([p[0] for p in points], [p[1] for p in points], marker="o",
                            label=lib, linewidth=2.5 if lib == "ncclshim" else 1.2)
            sizes = sorted({k[3] for k in med if k[:2] == (coll, nranks) and k[3] > 0})
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            if sizes:
                ax.set_xticks(sizes)
                ax.set_xticklabels([human(s) for s in sizes], rotation=60, fontsize=7)
            ax.set_title(f"{coll}, {nranks} ranks" if isinstance(nranks, int) else
                         f"{coll}, {nranks}")
            ax.set_xlabel("size (bytes)")
            ax.set_ylabel(ylabel)
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out, f"{prefix}{coll}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths

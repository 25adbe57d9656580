#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""compare.py: `make compare`, ncclshim's bus bandwidth beside Open MPI, MPICH and Gloo.

Runs, on 2 and 4 local ranks, all-reduce, all-gather, reduce-scatter, broadcast and
all-to-all (float32, sum) through four programs that print nccl-tests' rows: our benchmark
(build/bin/<coll>_perf under ncclshim-launch, -c 1, -a 3 so the time is the slowest rank's),
tools/compare/mpi_perf.c built against each MPI, and tools/compare/gloo_perf.py on Debian's
python3-torch when it is installed. Every program gets the same sizes, warm-up and
iteration counts (full mode: 8 B-64 KiB in one run of 10 warm-up and 100 timed calls a size,
128 KiB-256 MiB in another of 2 and 10). Machine drift must hit every library alike, so runs alternate: each pass
goes over every (collective, ranks) and runs all libraries there back to back, in an order
that rotates from pass to pass; a size's figure is the median over passes.

Prints, per collective and rank count, the out-of-place busbw (GB/s) of each library and
ncclshim's ratio to the best other library; writes build/compare/results.csv (every pass),
table.txt, summary.md (the table of docs/performance.md) and one PNG per collective (plot.py).
--from-csv reports on the results.csv of an earlier run without measuring. Exits non-zero if any run failed or any
result was wrong, after printing what it measured.

Usage: tools/compare/compare.py [--build DIR] [--quick] [--from-csv CSV]
"""

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time

import plot

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall"]
RANKS = [2, 4]
LIBS = ["ncclshim", "openmpi", "mpich", "gloo"]
# Each range is one run per library: small sizes take microseconds, so they get enough
# iterations to rise above the noise of a shared machine; large sizes take milliseconds.
FULL = {"ranges": [(["-b", "8", "-e", "64K", "-f", "2"], 10, 100),
                   (["-b", "128K", "-e", "256M", "-f", "2"], 2, 10)], "passes": 3}
QUICK = {"ranges": [(["-b", "8", "-e", "8M", "-f", "1024"], 1, 5)], "passes": 2}
SKIPPED = 77  # exit status of a program that does not offer the collective
TIMEOUT = 900  # seconds one run may take before it is killed and counted as failed
HERE = os.path.dirname(os.path.abspath(__file__))


def command(lib, coll, nranks, build, size_range):
    """The command line of one run over one range of sizes."""
    sizes, warmup, iters = size_range
    counts = sizes + ["-w", str(warmup), "-n", str(iters)]
    launch = [os.path.join(build, "bin", "ncclshim-launch"), "-n", str(nranks),
              "-t", str(TIMEOUT)]
    if lib == "ncclshim":
        return launch + [os.path.join(build, "bin", coll + "_perf"), "-c", "1", "-a", "3"] + counts
    if lib == "openmpi":
        return ["mpirun.openmpi", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
                "-n", str(nranks), os.path.join(build, "compare", "mpi_perf.openmpi"),
                coll] + counts
    if lib == "mpich":
        return ["mpirun.mpich", "-n", str(nranks),
                os.path.join(build, "compare", "mpi_perf.mpich"), coll] + counts
    return launch + [sys.executable, os.path.join(HERE, "gloo_perf.py"), coll] + counts


def bus_bw(coll, nranks, count, usec):
    """busbw in GB/s from a row's count and time, with nccl-tests' formulas: algbw counts
    one buffer (all-reduce, broadcast) or n blocks of count; bus factor 2(n-1)/n for
    all-reduce, 1 for broadcast, (n-1)/n otherwise. Recomputed rather than read because
    the rows round bandwidth to 0.01 GB/s, which erases every small size."""
    if usec <= 0:
        return 0.0
    one_buffer = coll in ("all_reduce", "broadcast")
    algbw = count * 4 * (1 if one_buffer else nranks) / 1e3 / usec
    factor = {"all_reduce": 2 * (nranks - 1) / nranks, "broadcast": 1.0}
    return algbw * factor.get(coll, (nranks - 1) / nranks)


def parse_rows(text, coll, nranks):
    """{size: (busbw, wrong)} from nccl-tests style rows, out-of-place columns: size count
    type redop root time algbw busbw #wrong."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 9 or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        wrong = 0 if fields[8] == "N/A" else int(float(fields[8]))
        rows[int(fields[0])] = (bus_bw(coll, nranks, int(fields[1]), float(fields[5])), wrong)
    return rows


def gloo_available():
    probe = [sys.executable, "-c",
             "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()"]
    return subprocess.run(probe, capture_output=True).returncode == 0


def run_one(cmd, coll, nranks):
    """(rows, None), (rows, SKIPPED) or (rows, what went wrong)."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT + 30)
    except subprocess.TimeoutExpired:
        return {}, "timed out"
    rows = parse_rows(done.stdout, coll, nranks)
    if done.returncode == SKIPPED:
        return rows, SKIPPED
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return rows, f"exit {done.returncode}: {tail}"
    if not rows:
        return rows, "no result rows"
    return rows, None


def measure(libs, build, mode):
    """[(coll, nranks, lib, pass, size, busbw)] over every pass; and the failures seen."""
    results, failures, broken = [], [], set()
    for p in range(mode["passes"]):
        started = time.monotonic()
        for coll in COLLS:
            for nranks in RANKS:
                for k in range(len(libs)):
                    lib = libs[(k + p) % len(libs)]  # rotate who runs first
                    if (coll, nranks, lib) in broken:
                        continue
                    for size_range in mode["ranges"]:
                        rows, error = run_one(command(lib, coll, nranks, build, size_range),
                                              coll, nranks)
                        for size, (busbw, wrong) in rows.items():
                            results.append((coll, nranks, lib, p, size, busbw))
                            if wrong:
                                error = error or f"{wrong} wrong elements at {size} B"
                        if error:
                            break
                    if error == SKIPPED:
                        broken.add((coll, nranks, lib))
                        print(f"{lib}: {coll} skipped (not supported)", file=sys.stderr)
                    elif error:
                        broken.add((coll, nranks, lib))
                        failures.append(f"{lib} {coll} {nranks} ranks: {error}")
                        print(f"compare: {failures[-1]}", file=sys.stderr)
        print(f"compare: pass {p + 1}/{mode['passes']} took {time.monotonic() - started:.0f} s",
              file=sys.stderr)
    return results, failures


def medians(results):
    """{(coll, nranks, lib, size): median busbw over passes}."""
    by_key = {}
    for coll, nranks, lib, _, size, busbw in results:
        by_key.setdefault((coll, nranks, lib, size), []).append(busbw)
    return {key: statistics.median(v) for key, v in by_key.items()}


def table(med, libs):
    """The text table: one block per (collective, ranks), one row per size."""
    peers = [lib for lib in libs if lib != "ncclshim"]
    lines = ["busbw in GB/s (out of place, median over passes); ratio = ncclshim / best other"]
    for coll in COLLS:
        for nranks in RANKS:
            sizes = sorted({k[3] for k in med if k[0] == coll and k[1] == nranks})
            if not sizes:
                continue
            lines.append("")
            lines.append(f"{coll}, {nranks} ranks")
            lines.append("%12s" % "size (B)" + "".join("%10s" % lib for lib in libs) +
                         "%8s  %s" % ("ratio", "best other"))
            for size in sizes:
                row = [med.get((coll, nranks, lib, size)) for lib in libs]
                cells = "".join("%10s" % ("-" if v is None else "%.4f" % v) for v in row)
                ours = med.get((coll, nranks, "ncclshim", size))
                best = max(((med[(coll, nranks, p, size)], p) for p in peers
                            if (coll, nranks, p, size) in med), default=None)
                ratio = "-"
                if ours is not None and best is not None and best[0] > 0:
                    ratio = "%.2f" % (ours / best[0])
                best_name = best[1] if best and best[0] > 0 else "-"
                lines.append("%12d%s%8s  %s" % (size, cells, ratio, best_name))
    return "\n".join(lines)


def ratio_to_best(med, peers, coll, nranks, size):
    """(ncclshim's busbw, its ratio to the best peer), either None when unknown."""
    ours = med.get((coll, nranks, "ncclshim", size))
    best = max((med.get((coll, nranks, p, size), 0.0) for p in peers), default=0.0)
    if ours is None or best <= 0:
        return ours, None
    return ours, ours / best


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


SUMMARY_SIZES = [8, 64 << 10, 1 << 20, 64 << 20, 256 << 20]


def summary(med, libs):
    """docs/performance.md's table, in Markdown: ncclshim's busbw and ratio at a few sizes, and every
    size at which a peer was faster."""
    peers = [lib for lib in libs if lib != "ncclshim"]
    head = ["collective, ranks"] + [human(s) for s in SUMMARY_SIZES] + \
        ["sizes slower than the best peer"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for coll in COLLS:
        for nranks in RANKS:
            sizes = sorted({k[3] for k in med if k[:3] == (coll, nranks, "ncclshim")})
            if not sizes:
                continue
            cells = []
            for size in SUMMARY_SIZES:
                ours, ratio = ratio_to_best(med, peers, coll, nranks, size)
                cells.append("-" if ratio is None else "%.3g (%.2fx)" % (ours, ratio))
            slower = [f"{human(size)} ({ratio:.2f})" for size in sizes
                      for ratio in [ratio_to_best(med, peers, coll, nranks, size)[1]]
                      if ratio is not None and ratio < 1]
            lines.append(f"| {coll}, {nranks} ranks | " + " | ".join(cells) + " | " +
                         (", ".join(slower) or "none") + " |")
    return "\n".join(lines)


def read_csv(path):
    """The rows of a results.csv, typed as measure() returns them; and the libraries seen."""
    results, libs = [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            results.append((row["collective"], int(row["ranks"]), row["library"],
                            int(row["pass"]), int(row["size"]), float(row["busbw"])))
            if row["library"] not in libs:
                libs.append(row["library"])
    return results, [lib for lib in LIBS if lib in libs]


def report(results, libs, out):
    """Prints the table and writes table.txt, summary.md and the PNGs under out."""
    med = medians(results)
    text = table(med, libs)
    print(text)
    with open(os.path.join(out, "table.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary(med, libs) + "\n")
    for path in plot.plot_all(med, COLLS, RANKS, libs, out):
        print(f"compare: wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--quick", action="store_true", help="fewer sizes and iterations")
    parser.add_argument("--from-csv", metavar="CSV",
                        help="measure nothing: report on a results.csv of an earlier run")
    args = parser.parse_args()
    mode = QUICK if args.quick else FULL
    out = os.path.join(args.build, "compare")
    os.makedirs(out, exist_ok=True)
    if args.from_csv:
        results, libs = read_csv(args.from_csv)
        report(results, libs, out)
        return 0

    libs = [lib for lib in LIBS if lib != "gloo"]
    if gloo_available():
        libs.append("gloo")
    else:
        print("gloo: skipped (python3-torch not available)")
    for tool in ("mpirun.openmpi", "mpirun.mpich"):
        if shutil.which(tool) is None:
            sys.exit(f"compare: {tool} not found: run tools/deps.sh compare")
    ranges = "; ".join(f"{' '.join(sizes)} -w {warmup} -n {iters}"
                       for sizes, warmup, iters in mode["ranges"])
    print(f"compare: {', '.join(libs)}; {ranges}; {mode['passes']} passes; ranks {RANKS}",
          flush=True)

    started = time.monotonic()
    results, failures = measure(libs, args.build, mode)
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["collective", "ranks", "library", "pass", "size", "busbw"])
        writer.writerows(results)
    report(results, libs, out)
    print(f"compare: measured in {time.monotonic() - started:.0f} s")
    if failures:
        print("compare: FAILED runs:\n  " + "\n  ".join(failures))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
import collections
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time

COLLS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall"]


class Layout(collections.namedtuple("Layout", "hosts per_host")):
    """Where the ranks of a run are: on `hosts` hosts, `per_host` ranks each, rank r on host
    r // per_host. `make compare` has one host; tools/compare/hosts.py several."""

    @property
    def nranks(self):
        return self.hosts * self.per_host

    def __str__(self):
        if self.hosts == 1:
            return f"{self.per_host} ranks"
        return f"{self.hosts} hosts x {self.per_host}"


LAYOUTS = [Layout(1, 2), Layout(1, 4)]
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


def outcome(returncode, stdout, stderr, coll, nranks):
    """What a finished run gave: (rows, None), (rows, SKIPPED) or (rows, what went wrong)."""
    rows = parse_rows(stdout, coll, nranks)
    if returncode == SKIPPED:
        return rows, SKIPPED
    if returncode != 0:
        tail = (stderr.strip().splitlines() or ["no message"])[-1]
        return rows, f"exit {returncode}: {tail}"
    if not rows:
        return rows, "no result rows"
    return rows, None


def run_one(cmd, coll, nranks):
    """Runs cmd, which prints the rows; outcome()'s answer."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT + 30)
    except subprocess.TimeoutExpired:
        return {}, "timed out"
    return outcome(done.returncode, done.stdout, done.stderr, coll, nranks)


def measure(libs, layouts, mode, run):
    """[(coll, layout, lib, pass, size, busbw)] over every pass; and the failures seen.
    run(lib, coll, layout, size_range) runs one program over one range: (rows, error)."""
    results, failures, broken = [], [], set()
    for p in range(mode["passes"]):
        started = time.monotonic()
        for coll in COLLS:
            for layout in layouts:
                for k in range(len(libs)):
                    lib = libs[(k + p) % len(libs)]  # rotate who runs first
                    if (coll, layout, lib) in broken:
                        continue
                    for size_range in mode["ranges"]:
                        rows, error = run(lib, coll, layout, size_range)
                        for size, (busbw, wrong) in rows.items():
                            results.append((coll, layout, lib, p, size, busbw))
                            if wrong:
                                error = error or f"{wrong} wrong elements at {size} B"
                        if error:
                            break
                    if error == SKIPPED:
                        broken.add((coll, layout, lib))
                        print(f"{lib}: {coll} skipped (not supported)", file=sys.stderr)
                    elif error:
                        broken.add((coll, layout, lib))
                        failures.append(f"{lib} {coll} {layout}: {error}")
                        print(f"compare: {failures[-1]}", file=sys.stderr)
        print(f"compare: pass {p + 1}/{mode['passes']} took {time.monotonic() - started:.0f} s",
              file=sys.stderr)
    return results, failures


def by_key(results):
    """{(coll, layout, lib, size): [busbw of each pass]}."""
    found = {}
    for coll, layout, lib, _, size, busbw in results:
        found.setdefault((coll, layout, lib, size), []).append(busbw)
    return found


def medians(results):
    """{(coll, layout, lib, size): median busbw over passes}."""
    return {key: statistics.median(v) for key, v in by_key(results).items()}


def ratio_spread(passes, peers, coll, layout, size):
    """The noise a run shows in one ratio: (lowest, highest) of ncclshim / the best peer (the
    best by median) when each side's passes may pair with any of the other's; None when
    unknown. Highest below 1: ncclshim was slower in every pass."""
    ours = passes.get((coll, layout, "ncclshim", size))
    theirs = [(statistics.median(passes[key]), passes[key])
              for key in ((coll, layout, p, size) for p in peers) if key in passes]
    if not ours or not theirs:
        return None
    best = max(theirs)[1]
    if min(best) <= 0:
        return None
    return min(ours) / max(best), max(ours) / min(best)


def table(med, passes, libs, layouts):
    """The text table: one block per (collective, layout), one row per size."""
    peers = [lib for lib in libs if lib != "ncclshim"]
    lines = ["busbw in GB/s (out of place, median over passes); ratio = ncclshim / best other,",
             "then its lowest and highest over any pairing of the two libraries' passes"]
    for coll in COLLS:
        for layout in layouts:
            sizes = sorted({k[3] for k in med if k[0] == coll and k[1] == layout})
            if not sizes:
                continue
            lines.append("")
            lines.append(f"{coll}, {layout}")
            lines.append("%12s" % "size (B)" + "".join("%10s" % lib for lib in libs) +
                         "%8s %11s  %s" % ("ratio", "passes", "best other"))
            for size in sizes:
                row = [med.get((coll, layout, lib, size)) for lib in libs]
                cells = "".join("%10s" % ("-" if v is None else "%.4f" % v) for v in row)
                ours = med.get((coll, layout, "ncclshim", size))
                best = max(((med[(coll, layout, p, size)], p) for p in peers
                            if (coll, layout, p, size) in med), default=None)
                ratio = "-"
                if ours is not None and best is not None and best[0] > 0:
                    ratio = "%.2f" % (ours / best[0])
                best_name = best[1] if best and best[0] > 0 else "-"
                spread = ratio_spread(passes, peers, coll, layout, size)
                spread = "-" if spread is None else "%.2f-%.2f" % spread
                lines.append("%12d%s%8s %11s  %s" % (size, cells, ratio, spread, best_name))
    return "\n".join(lines)


def ratio_to_best(med, peers, coll, layout, size):
    """(ncclshim's busbw, its ratio to the best peer), either None when unknown."""
    ours = med.get((coll, layout, "ncclshim", size))
    best = max((med.get((coll, layout, p, size), 0.0) for p in peers), default=0.0)
    if ours is None or best <= 0:
        return ours, None
    return ours, ours / best


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale:
            return f"{size // scale} {unit}"
    return f"{size} B"


SUMMARY_SIZES = [8, 64 << 10, 1 << 20, 64 << 20, 256 << 20]


def summary(med, passes, libs, layouts):
    """docs/performance.md's table, in Markdown: ncclshim's busbw and ratio at a few sizes; every
    size at which the best peer's median was higher, with the ratio's spread over passes; and
    those at which ncclshim was slower in every pass, beyond the noise the run shows."""
    peers = [lib for lib in libs if lib != "ncclshim"]
    head = ["collective, ranks"] + [human(s) for s in SUMMARY_SIZES] + \
        ["sizes slower than the best peer (ratio; over passes)", "slower in every pass"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for coll in COLLS:
        for layout in layouts:
            sizes = sorted({k[3] for k in med if k[:3] == (coll, layout, "ncclshim")})
            if not sizes:
                continue
            cells = []
            for size in SUMMARY_SIZES:
                ours, ratio = ratio_to_best(med, peers, coll, layout, size)
                cells.append("-" if ratio is None else "%.3g (%.2fx)" % (ours, ratio))
            slower, behind = [], []
            for size in sizes:
                ratio = ratio_to_best(med, peers, coll, layout, size)[1]
                if ratio is None or ratio >= 1:
                    continue
                spread = ratio_spread(passes, peers, coll, layout, size)
                slower.append(f"{human(size)} ({ratio:.2f}; {spread[0]:.2f}-{spread[1]:.2f})")
                if spread[1] < 1:
                    behind.append(human(size))
            lines.append(f"| {coll}, {layout} | " + " | ".join(cells) + " | " +
                         (", ".join(slower) or "none") + " | " + (", ".join(behind) or "none") +
                         " |")
    return "\n".join(lines)


def write_csv(path, results):
    """results.csv: a row per (collective, layout, library, pass, size); ranks counts all."""
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["collective", "hosts", "ranks", "library", "pass", "size", "busbw"])
        for coll, layout, lib, p, size, busbw in results:
            writer.writerow([coll, layout.hosts, layout.nranks, lib, p, size, busbw])


def read_csv(path):
    """The rows of a results.csv, typed as measure() returns them; the libraries and layouts
    seen. A file without the hosts column (older runs) is of one host."""
    results, libs, layouts = [], [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            hosts = int(row.get("hosts") or 1)
            layout = Layout(hosts, int(row["ranks"]) // hosts)
            results.append((row["collective"], layout, row["library"],
                            int(row["pass"]), int(row["size"]), float(row["busbw"])))
            if row["library"] not in libs:
                libs.append(row["library"])
            if layout not in layouts:
                layouts.append(layout)
    return results, [lib for lib in LIBS if lib in libs], layouts


def report(results, libs, layouts, out, text_tail="", md_tail=""):
    """Prints the table and writes table.txt, summary.md and the PNGs under out; text_tail and
    md_tail, when given, end table.txt and summary.md."""
    import plot  # matplotlib: only here, so that hosts.py --probe runs before deps install it

    passes = by_key(results)
    med = medians(results)
    text = table(med, passes, libs, layouts) + text_tail
    print(text)
    with open(os.path.join(out, "table.txt"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(summary(med, passes, libs, layouts) + md_tail + "\n")
    for path in plot.plot_all(med, COLLS, layouts, libs, out):
        print(f"compare: wrote {path}")


def libraries():
    """The libraries to measure; exits when an MPI is missing (Gloo is optional)."""
    libs = [lib for lib in LIBS if lib != "gloo"]
    if gloo_available():
        libs.append("gloo")
    else:
        print("gloo: skipped (python3-torch not available)")
    for tool in ("mpirun.openmpi", "mpirun.mpich"):
        if shutil.which(tool) is None:
            sys.exit(f"compare: {tool} not found: run tools/deps.sh compare")
    return libs


def describe(libs, mode, layouts):
    """The line that says what a run will measure."""
    ranges = "; ".join(f"{' '.join(sizes)} -w {warmup} -n {iters}"
                       for sizes, warmup, iters in mode["ranges"])
    return (f"{', '.join(libs)}; {ranges}; {mode['passes']} passes; "
            f"{', '.join(str(layout) for layout in layouts)}")


def conclude(failures):
    """The exit status: 1, after listing them, if any run failed."""
    if failures:
        print("compare: FAILED runs:\n  " + "\n  ".join(failures))
        return 1
    return 0


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
        results, libs, layouts = read_csv(args.from_csv)
        report(results, libs, layouts, out)
        return 0

    libs = libraries()
    print(f"compare: {describe(libs, mode, LAYOUTS)}", flush=True)

    def run(lib, coll, layout, size_range):
        cmd = command(lib, coll, layout.nranks, args.build, size_range)
        return run_one(cmd, coll, layout.nranks)

    started = time.monotonic()
    results, failures = measure(libs, LAYOUTS, mode, run)
    write_csv(os.path.join(out, "results.csv"), results)
    report(results, libs, LAYOUTS, out)
    print(f"compare: measured in {time.monotonic() - started:.0f} s")
    return conclude(failures)


if __name__ == "__main__":
    sys.exit(main())

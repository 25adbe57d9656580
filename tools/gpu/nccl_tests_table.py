# SPDX-License-Identifier: Apache-2.0
"""nccl_tests_table: the side-by-side table of tools/gpu-check's compare stage.

Reads DIR/<lib>-<collective>-n<ranks>.log, nccl-tests output of the genuine NCCL (lib
"genuine") and of ncclshim (lib "ncclshim") run alike, and prints a Markdown table: per
collective, rank count and size, each library's out-of-place time and bandwidth (busbw; at 1
rank, where busbw is 0 for most collectives, algbw) and the ratio of the times; then the
speed targets, each met or not: issue 12's (ranks on one GPU, every rank of ncclshim on its
device team), with --network issue 13's (every rank with a host of its own, so both
libraries take their network path), or with --issue14 issue 14's (ncclshim at 1, 2, 4 and 8
ranks on one GPU against each collective's memory limit; --mps MPSDIR: the same logs taken
under MPS, for its 8 B target). Writes the same rows to DIR/compare.csv. Exits 1 when a log
has no rows or a row reports wrong elements.

Usage: python3 nccl_tests_table.py [--network | --issue14 [--mps MPSDIR]] DIR
"""

import csv
import glob
import os
import re
import sys

LIBS = ("genuine", "ncclshim")
LOG_NAME = re.compile(r"^(genuine|ncclshim)-([a-z_]+)-n(\d+)\.log$")


def parse_rows(text):
    """{size: (time_us, algbw, busbw, wrong)} from nccl-tests rows (out-of-place columns): size
    count type redop root time algbw busbw #wrong time algbw busbw #wrong."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 13 or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        wrong = sum(0 if f == "N/A" else int(float(f)) for f in (fields[8], fields[12]))
        rows[int(fields[0])] = (float(fields[5]), float(fields[6]), float(fields[7]), wrong)
    return rows


def human(size):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def read_logs(folder):
    """{(collective, ranks): {lib: rows}} and the problems found."""
    results, problems = {}, []
    for path in sorted(glob.glob(os.path.join(folder, "*.log"))):
        match = LOG_NAME.match(os.path.basename(path))
        if not match:
            continue
        lib, coll, ranks = match.group(1), match.group(2), int(match.group(3))
        with open(path, errors="replace") as log:
            rows = parse_rows(log.read())
        if not rows:
            problems.append(f"{os.path.basename(path)}: no result rows (see the log)")
        for size, (_, _, _, wrong) in rows.items():
            if wrong:
                problems.append(f"{os.path.basename(path)}: {wrong} wrong elements at "
                                f"{human(size)}")
        results.setdefault((coll, ranks), {})[lib] = rows
    return results, problems


def table(results, out_csv):
    print("| collective | ranks | size | genuine us | ncclshim us | time ratio | "
          "genuine GB/s | ncclshim GB/s |")
    print("|---|---|---|---|---|---|---|---|")
    with open(out_csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["collective", "ranks", "bytes", "genuine_us", "ncclshim_us",
                         "genuine_algbw", "ncclshim_algbw", "genuine_busbw", "ncclshim_busbw"])
        for (coll, ranks), libs in sorted(results.items()):
            sizes = sorted(set().union(*(rows.keys() for rows in libs.values())))
            for size in sizes:
                cells = [libs.get(lib, {}).get(size) for lib in LIBS]
                g, s = cells
                ratio = f"{s[0] / g[0]:.2f}x" if g and s and g[0] > 0 else "-"
                bw = 1 if ranks == 1 else 2
                print(f"| {coll} | {ranks} | {human(size)} | "
                      f"{g[0] if g else '-'} | {s[0] if s else '-'} | {ratio} | "
                      f"{g[bw] if g else '-'} | {s[bw] if s else '-'} |")
                writer.writerow([coll, ranks, size] +
                                [c[k] if c else "" for k in (0, 1, 2) for c in cells])


def one_rank_target(results, most):
    """1 rank: ncclshim's all-reduce time within `most` times the genuine one at every size."""
    one = results.get(("all_reduce", 1), {})
    common = sorted(set(one.get("genuine", {})) & set(one.get("ncclshim", {})))
    ratios = [(one["ncclshim"][s][0] / one["genuine"][s][0], s) for s in common
              if one["genuine"][s][0] > 0]
    text = f"1 rank, all-reduce within {most:g}x of the genuine time at every size"
    if not ratios:
        return (text + " (not measured)", None)
    worst = max(ratios)
    return (text + f" (worst {worst[0]:.2f}x at {human(worst[1])})", worst[0] <= most)


def targets(results):
    """Issue 12's speed targets: (text, met or None when not measured)."""
    ours2 = results.get(("all_reduce", 2), {}).get("ncclshim", {})
    big = ours2.get(256 << 20)
    small = ours2.get(8)
    out = [("2 ranks, float32 all-reduce of 256 MiB: busbw >= 100 GB/s" +
            (f" (measured {big[2]} GB/s)" if big else " (not measured)"),
            big[2] >= 100 if big else None),
           ("2 ranks, 8 B all-reduce: time <= 50 us" +
            (f" (measured {small[0]} us)" if small else " (not measured)"),
            small[0] <= 50 if small else None)]
    out.append(one_rank_target(results, 1.5))
    return out


NETWORK_COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "alltoall")


def targets_network(results):
    """Issue 13's speed targets, every rank a host of its own: (text, met or None)."""
    slower, compared = [], 0
    for coll in NETWORK_COLLS:
        for ranks in (2, 4):
            libs = results.get((coll, ranks), {})
            gen, ours = libs.get("genuine", {}), libs.get("ncclshim", {})
            for size in sorted(set(gen) & set(ours)):
                compared += 1
                if gen[size][0] > 0 and ours[size][0] > gen[size][0]:
                    slower.append(f"{coll} {ranks}r {human(size)} "
                                  f"({ours[size][0] / gen[size][0]:.2f}x)")
    out = [(f"never slower than the genuine NCCL at any size of {', '.join(NETWORK_COLLS)}, "
            f"2 and 4 ranks ({compared} sizes compared" +
            (f"; slower: {', '.join(slower)})" if slower else ")"),
            not slower if compared else None)]
    libs2 = results.get(("all_reduce", 2), {})
    ours, gen = libs2.get("ncclshim", {}), libs2.get("genuine", {})
    small = ours.get(8)
    out.append(("2 ranks, 8 B all-reduce: time <= 600 us" +
                (f" (measured {small[0]} us)" if small else " (not measured)"),
                small[0] <= 600 if small else None))
    big, big_gen = ours.get(256 << 20), gen.get(256 << 20)
    both = big and big_gen and big_gen[2] > 0
    out.append(("2 ranks, 256 MiB all-reduce: busbw >= 3x the genuine" +
                (f" (measured {big[2]} against {big_gen[2]} GB/s, {big[2] / big_gen[2]:.2f}x)"
                 if both else " (not measured)"),
                big[2] >= 3 * big_gen[2] if both else None))
    return out


# Issue 14: every rank on one GPU, whose memory moves MEMORY_GBS (an H100's: a 1 GiB
# device-to-device copy ran at 1.5 TB/s, 3.0 TB/s of memory traffic; docs/device.md). One
# kernel of the leader reads every input once and writes every output once, so a collective
# of S bytes (nccl-tests' size) at n ranks moves at least these bytes, and its busbw (nccl-tests'
# factor times S / time) can be at most MEMORY_GBS times factor * S / bytes.
MEMORY_GBS = 3000.0
TRAFFIC = {  # (bytes moved / S, busbw factor), as functions of n
    "all_reduce": (lambda n: 2.0 * n, lambda n: 2.0 * (n - 1) / n),  # n inputs, n outputs
    "all_gather": (lambda n: n + 1.0, lambda n: (n - 1) / n),  # S read, n*S written
    "reduce_scatter": (lambda n: n + 1.0, lambda n: (n - 1) / n),  # n*S read, S written
    "broadcast": (lambda n: n + 1.0, lambda n: 1.0),  # S read, n copies written
    "alltoall": (lambda n: 2.0 * n, lambda n: (n - 1) / n),  # n*S read, n*S written
}


def memory_limit(coll, n, memory_gbs=MEMORY_GBS):
    moved, factor = TRAFFIC[coll]
    return memory_gbs * factor(n) / moved(n)


def targets_issue14(results, mps_results):
    """Issue 14's speed targets: (text, met or None when not measured)."""
    out = []

    def busbw(coll, n, size=256 << 20):
        row = results.get((coll, n), {}).get("ncclshim", {}).get(size)
        return row[2] if row else None

    for coll, share in (("all_reduce", None), ("all_gather", 0.6), ("reduce_scatter", 0.6),
                        ("broadcast", 0.6), ("alltoall", 0.6)):
        limit = memory_limit(coll, 2)
        want = 450.0 if share is None else share * limit
        got = busbw(coll, 2)
        out.append((f"2 ranks, {coll} of 256 MiB: busbw >= {want:.0f} GB/s (limit "
                    f"{limit:.0f} GB/s: {TRAFFIC[coll][0](2):g} x S moved at {MEMORY_GBS:g} "
                    f"GB/s)" + (f" (measured {got} GB/s, {got / limit:.2f} of it)"
                                if got is not None else " (not measured)"),
                    got >= want if got is not None else None))
    for label, res, most in (("own contexts", results, 20.0), ("under MPS", mps_results, 12.0)):
        row = res.get(("all_reduce", 2), {}).get("ncclshim", {}).get(8)
        out.append((f"2 ranks, 8 B all-reduce, {label}: time <= {most:g} us" +
                    (f" (measured {row[0]} us)" if row else " (not measured)"),
                    row[0] <= most if row else None))
    two = busbw("all_reduce", 2)
    for n in (4, 8):
        got = busbw("all_reduce", n)
        both = got is not None and two is not None
        out.append((f"{n} ranks, all-reduce of 256 MiB: busbw >= half the 2-rank figure" +
                    (f" (measured {got} against {two} GB/s)" if both else " (not measured)"),
                    got >= two / 2 if both else None))
    out.append(one_rank_target(results, 1.1))
    return out


def main():
    args = sys.argv[1:]
    mode = args[0] if args and args[0] in ("--network", "--issue14") else None
    args = args[1:] if mode else args
    mps_folder = None
    if mode == "--issue14" and len(args) >= 2 and args[0] == "--mps":
        mps_folder, args = args[1], args[2:]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    folder = args[0]
    results, problems = read_logs(folder)
    table(results, os.path.join(folder, "compare.csv"))
    if mode == "--issue14":
        mps_results = read_logs(mps_folder)[0] if mps_folder else {}
        issue, found = 14, targets_issue14(results, mps_results)
    elif mode == "--network":
        issue, found = 13, targets_network(results)
    else:
        issue, found = 12, targets(results)
    print(f"\nSpeed targets (issue {issue}):\n")
    for text, met in found:
        print(f"- {'met' if met else 'NOT MET' if met is False else 'not measured'}: {text}")
    for p in problems:
        print(f"\nPROBLEM: {p}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

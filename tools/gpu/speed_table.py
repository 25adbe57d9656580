# SPDX-License-Identifier: Apache-2.0
"""speed_table: the speed table of tools/gpu-check's first stage, from its nccl-tests logs.

Reads DIR/ncclshim-<collective>-n<ranks>[-<variant>].log (variant: "leaders", every rank
leading its own share of the GPU, NCCLSHIM_RANK_LEADERS=1; none: the ranks share one leader)
and prints a Markdown table, a row per collective, rank count and variant: the out-of-place
time at 8 B, 256 KiB and 8 MiB (or the next size measured, named), the bus bandwidth at the
largest size (algbw at 1 rank, where busbw is 0 for most collectives) and the memory limit on
it at MEMORY GB/s (nccl_tests_table's bytes-moved model; --memory-gbs, by default an H200's
device copy, 4300). Ends with one line, the 2- and 4-rank all_reduce figures, for the
summary. Exits 1 when a log has no rows or a row reports wrong elements.

Usage: python3 speed_table.py [--memory-gbs GBS] DIR
"""

import glob
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from nccl_tests_table import TRAFFIC, human, memory_limit, parse_rows  # noqa: E402

LOG_NAME = re.compile(r"^ncclshim-([a-z_]+)-n(\d+)(?:-([a-z]+))?\.log$")
SIZES = (8, 256 << 10, 8 << 20)


def limit(coll, n, memory_gbs):
    if n == 1 or coll not in TRAFFIC:
        return None
    return memory_limit(coll, n, memory_gbs)


def cell(found, size):
    """The time at size, or at the next size measured (nccl-tests rounds small sizes up to a
    multiple of the rank count), naming it."""
    near = min((s for s in found if s >= size), default=None)
    if near is None or near > 4 * size:
        return "-"
    return f"{found[near][0]:g} us" + ("" if near == size else f" ({human(near)})")


def main():
    args = sys.argv[1:]
    memory_gbs = 4300.0
    if len(args) == 3 and args[0] == "--memory-gbs":
        memory_gbs, args = float(args[1]), args[2:]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    rows, problems = [], []
    for path in sorted(glob.glob(os.path.join(args[0], "ncclshim-*.log"))):
        match = LOG_NAME.match(os.path.basename(path))
        if not match:
            continue
        coll, n, variant = match.group(1), int(match.group(2)), match.group(3) or "shared"
        with open(path, errors="replace") as log:
            found = parse_rows(log.read())
        if not found:
            problems.append(f"{os.path.basename(path)}: no result rows")
            continue
        for size, (_, _, _, wrong) in found.items():
            if wrong:
                problems.append(f"{os.path.basename(path)}: {wrong} wrong at {human(size)}")
        rows.append((coll, n, variant, found))
    print(f"| collective | ranks | leader | {' | '.join(human(s) for s in SIZES)} "
          f"| largest: busbw GB/s | memory limit GB/s |")
    print("|---|---|---|" + "---|" * len(SIZES) + "---|---|")
    headline = []
    for coll, n, variant, found in sorted(rows):
        top = max(found)
        bw = found[top][1] if n == 1 else found[top][2]
        times = " | ".join(cell(found, s) for s in SIZES)
        cap = limit(coll, n, memory_gbs)
        print(f"| {coll} | {n} | {variant} | {times} | {bw:g} at {human(top)}"
              f"{' (algbw)' if n == 1 else ''} | {f'{cap:.0f}' if cap else '-'} |")
        if coll == "all_reduce" and n > 1:
            small = found.get(8)
            headline.append(f"n{n} {variant} {small[0]:g} us at 8 B, {bw:g} GB/s at "
                            f"{human(top)}" if small else f"n{n} {variant} {bw:g} GB/s")
    if problems:
        print()
    for p in problems:
        print(f"PROBLEM: {p}")
    print(f"\nall_reduce: {'; '.join(headline) if headline else 'no multi-rank rows'}"
          f"{f'; {len(problems)} problems' if problems else ''}")
    return 1 if problems or not rows else 0


if __name__ == "__main__":
    sys.exit(main())

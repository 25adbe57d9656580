# SPDX-License-Identifier: Apache-2.0
"""gloo_perf: the Gloo side of `make compare`, through Debian's python3-torch.

One rank of torch.distributed with the gloo backend; started N times by ncclshim-launch,
which sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT as torchrun does. Same collective
names, sizes, warm-up and iteration counts, checking, timing and output rows as
tools/compare/mpi_perf.c (float32, sum, out of place only; the slowest rank's time).

Usage: ncclshim-launch -n N python3 gloo_perf.py COLL [-b BYTES] [-e BYTES] [-f FACTOR]
       [-w WARMUP] [-n ITERS]
"""

import argparse
import sys
import time

import torch
import torch.distributed as dist

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "alltoall": lambda n: (n - 1) / n,
}


def size_arg(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    if text[-1:].upper() in units:
        return int(float(text[:-1]) * units[text[-1:].upper()])
    return int(text)


def shape(coll, nbytes, n):
    """(param, send elements, recv elements), as tools/bench's counts functions."""
    count = nbytes // 4
    if coll in ("all_reduce", "broadcast"):
        return count, count, count
    param = count // n
    if coll == "all_gather":
        return param, param, param * n
    if coll == "reduce_scatter":
        return param, param * n, param
    return param, param * n, param * n


def make_call(coll, send, recv, param, rank, n):
    """A function running the collective once from send into recv."""
    if param == 0 and coll not in ("all_reduce", "broadcast"):
        # Nothing to move (size < 4 n bytes); gloo's all_gather dies of SIGFPE on empty blocks.
        return lambda: None
    if coll == "all_reduce":
        def run():
            recv.copy_(send)  # torch reduces in place; out of place costs this copy
            dist.all_reduce(recv)
    elif coll == "broadcast":
        def run():
            if rank == 0:
                recv.copy_(send)
            dist.broadcast(recv, 0)
    elif coll == "all_gather":
        outs = list(recv.split(param)) if param else [recv[:0]] * n
        def run():
            dist.all_gather(outs, send)
    elif coll == "reduce_scatter":
        ins = list(send.split(param)) if param else [send[:0]] * n
        def run():
            dist.reduce_scatter(recv, ins)
    else:
        def run():
            dist.all_to_all_single(recv, send)
    return run


def values(rank, count, offset=0):
    """Rank r's inputs: small integers, so float sums are exact in any order."""
    idx = torch.arange(offset, offset + count, dtype=torch.int64)
    return (rank + 1 + idx % 7).to(torch.float32)


def check(coll, send, recv, param, nsend, nrecv, rank, n):
    """One checked call; returns the wrong elements over all ranks (as mpi_perf.c)."""
    send[:nsend] = values(rank, nsend)
    recv[:nrecv] = float("nan")
    make_call(coll, send[:nsend], recv[:nrecv], param, rank, n)()
    idx = torch.arange(nrecv, dtype=torch.int64)
    tri = n * (n + 1) // 2
    if coll == "all_reduce":
        want = tri + n * (idx % 7)
    elif coll == "reduce_scatter":
        want = tri + n * ((rank * param + idx) % 7)
    elif coll == "broadcast":
        want = 1 + idx % 7
    elif coll == "all_gather":
        want = idx // param + 1 + (idx % param) % 7 if param else idx
    else:
        want = idx // param + 1 + (rank * param + idx % param) % 7 if param else idx
    wrong = torch.tensor([int((recv[:nrecv] != want.to(torch.float32)).sum())])
    dist.all_reduce(wrong)
    return int(wrong)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("coll", choices=sorted(BUS_FACTOR))
    parser.add_argument("-b", type=size_arg, default=8)
    parser.add_argument("-e", type=size_arg, default=32 << 20)
    parser.add_argument("-f", type=int, default=2)
    parser.add_argument("-w", type=int, default=5)
    parser.add_argument("-n", type=int, default=20)
    args = parser.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    coll = args.coll
    alloc = max(args.e // 4, 1)
    send = torch.zeros(alloc, dtype=torch.float32)
    recv = torch.zeros(alloc, dtype=torch.float32)
    if rank == 0:
        print(f"# gloo_perf {coll}, {n} ranks, warmup iters: {args.w} iters: {args.n} "
              f"(out of place only)\n# torch {torch.__version__} gloo")
        print("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s" % (
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong"))

    for nbytes in (args.e, args.b):  # warm-up, as tools/bench
        param, nsend, nrecv = shape(coll, nbytes, n)
        run = make_call(coll, send[:nsend], recv[:nrecv], param, rank, n)
        for _ in range(args.w):
            run()
    total_wrong = 0
    nbytes = args.b
    while nbytes <= args.e:
        param, nsend, nrecv = shape(coll, nbytes, n)
        total = max(nsend, nrecv)
        wrong = check(coll, send, recv, param, nsend, nrecv, rank, n)
        total_wrong += wrong
        steps = alloc // total if total and alloc // total else 1
        calls = [make_call(coll, send[s * total:s * total + nsend],
                           recv[s * total:s * total + nrecv], param, rank, n)
                 for s in range(min(steps, args.n))]
        calls[0]()
        dist.barrier()
        t0 = time.perf_counter()
        for it in range(args.n):
            calls[it % len(calls)]()
        sec = torch.tensor([(time.perf_counter() - t0) / args.n if args.n else 0.0],
                           dtype=torch.float64)
        dist.all_reduce(sec, op=dist.ReduceOp.MAX)
        sec = float(sec)
        alg_bytes = param * 4 * (1 if coll in ("all_reduce", "broadcast") else n)
        algbw = alg_bytes / 1e9 / sec if sec > 0 else 0.0
        if rank == 0:
            print("%12d  %12d  %8s  %6s  %6d  %7.2f  %6.2f  %6.2f  %6d" % (
                total * 4, param, "float",
                "sum" if coll in ("all_reduce", "reduce_scatter") else "none",
                0 if coll == "broadcast" else -1, sec * 1e6, algbw,
                algbw * BUS_FACTOR[coll](n), wrong), flush=True)
        nbytes *= args.f
    if rank == 0:
        print(f"# Out of bounds values : {total_wrong} {'FAILED' if total_wrong else 'OK'}")
    dist.destroy_process_group()
    return 1 if total_wrong else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except RuntimeError as err:
        if "does not support" not in str(err):
            raise
        # e.g. reduce_scatter in torch 1.13: say so, and exit 77 ("skipped") for compare.py.
        print(f"gloo_perf: {err}", file=sys.stderr)
        sys.exit(77)

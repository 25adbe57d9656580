# SPDX-License-Identifier: Apache-2.0
"""torch_check: PyTorch's torch.distributed with backend nccl, checked, on whatever
libnccl.so.2 PyTorch loads (ncclshim through LD_PRELOAD or a swapped file, in tools/gpu-check).

Check mode (under torchrun, every rank on one GPU unless there are more): all_reduce with every
op PyTorch offers for NCCL (sum, product, min, max, avg, premul_sum), all_gather_into_tensor,
reduce_scatter_tensor, broadcast from every root, all_to_all_single, send/recv (blocking, and
batched around a ring), barrier, and collectives in two new_group()s, on float32, bfloat16 and
float16 tensors with odd and large counts; the inputs are small integers, so every exact result
is known (bfloat16's premul_sum: NCCL's result for what PyTorch passes, see premul_factor). Then
20 steps of DDP training of a small model, whose losses and final weights must equal a
single-process run on the same global batch (to float32 rounding). Exits 1 on any mismatch,
after printing each.

Where every rank's captures are allowed (one rank, a GPU per rank, or NCCLSHIM_RANK_LEADERS=1:
a rank in the process of a device team leader that shares its GPU may not capture), also
collectives captured in CUDA graphs (torch.cuda.graph): an all_reduce and a scaling replayed 10
times, the result exact; and the time of an 8-byte all_reduce captured (per replay) and not
(per call).

Kill mode (--kill N, not under torchrun: its agent kills every rank as soon as one dies, which
would hide a hang): starts N ranks itself, training in a loop; the last one kills itself at
step 5. Every other rank must then die of PyTorch's watchdog (an NCCL error, not its 10-minute
timeout) within --deadline seconds. Exits 1 on a hang or a rank that ends without an error.

--expect ncclshim|genuine: fails unless the library that PyTorch's NCCL calls resolve to is that
one (PyTorch maps its own libnccl.so.2 even when another is preloaded).
--backend gloo --device cpu runs the same checks on the CPU, as a dry run of this script.

Usage: torchrun --standalone --nproc_per_node N torch_check.py [--expect ncclshim]
       python3 torch_check.py --kill N [--deadline S] [--expect ncclshim]
"""

import argparse
import copy
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

import torch
import torch.distributed as dist

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
COUNTS = (1001, (1 << 20) + 3)  # odd; the large one past the small-message paths
KILL_STEP = 5
PREMUL_FACTOR = 0.5


class Checker:
    """Counts checks; prints and counts every mismatch."""

    def __init__(self, rank):
        self.rank = rank
        self.checks = 0
        self.failed = 0

    def equal(self, what, got, want):
        self.checks += 1
        got = got.float().cpu()
        want = want.float().cpu()
        if got.shape != want.shape or not torch.equal(got, want):
            bad = (got != want).nonzero() if got.shape == want.shape else None
            where = f"{bad.shape[0]} elements differ, first at {bad[0].tolist()}: " \
                    f"{got[tuple(bad[0])].item()} != {want[tuple(bad[0])].item()}" \
                if bad is not None and bad.numel() else f"shape {got.shape} != {want.shape}"
            print(f"rank {self.rank}: {what}: {where}", flush=True)
            self.failed += 1

    def close(self, what, got, want, rtol=1e-5, atol=1e-6):
        self.checks += 1
        if not torch.allclose(got, want, rtol=rtol, atol=atol):
            print(f"rank {self.rank}: {what}: {got.tolist() if got.numel() < 8 else got} "
                  f"!= {want.tolist() if want.numel() < 8 else want}", flush=True)
            self.failed += 1


def values(rank, count, salt=0):
    """Rank `rank`'s input: small integers 1..3, exact in every dtype, different per rank."""
    return ((torch.arange(count, dtype=torch.float64) + rank + salt) % 3) + 1


def reduce_ops(backend, world, dtype):
    """(name, ReduceOp, reference over stacked inputs) for every op the backend offers on
    `dtype`; avg only where its result is exact (a power-of-two number of ranks)."""
    ops = [("sum", dist.ReduceOp.SUM, lambda x: x.sum(0)),
           ("product", dist.ReduceOp.PRODUCT, lambda x: x.prod(0)),
           ("min", dist.ReduceOp.MIN, lambda x: x.min(0).values),
           ("max", dist.ReduceOp.MAX, lambda x: x.max(0).values)]
    if backend == "nccl" and world & (world - 1) == 0:
        ops.append(("avg", dist.ReduceOp.AVG, lambda x: x.sum(0) / x.shape[0]))
    if backend == "nccl":
        # NCCL's PreMulSum: every input scaled by the factor, then summed.
        ops.append(("premul_sum", dist._make_nccl_premul_sum(PREMUL_FACTOR),
                    lambda x: (x * premul_factor(dtype)).sum(0)))
    return ops


def premul_factor(dtype):
    """The factor NCCL applies in a premul_sum of PREMUL_FACTOR on `dtype` tensors. PyTorch
    2.11 passes bfloat16's as a 4-byte float (unpackPreMulSum<float, ncclBfloat16>,
    pytorch/pytorch#190745), of which NCCL, and ncclshim as NCCL does, read ncclTypeSize = 2
    bytes: the float's first two bytes in memory (its low half on x86 and Arm) taken as a
    bfloat16; of 0.5f, +0. float16's factor is passed as a half, float32's and float64's at
    their own size."""
    if dtype != torch.bfloat16:
        return PREMUL_FACTOR
    low_half = torch.tensor([PREMUL_FACTOR], dtype=torch.float32).view(torch.bfloat16)[0]
    return low_half.item()


def check_collectives(chk, rank, world, device, backend):
    for dtype in DTYPES:
        for count in COUNTS:
            tag = f"{str(dtype).replace('torch.', '')} x{count}"
            inputs = torch.stack([values(r, count) for r in range(world)])

            for name, op, reference in reduce_ops(backend, world, dtype):
                if name == "product" and count > 1001:
                    continue  # 3^world stays exact; keep the large count to the sums
                if name == "premul_sum" and dtype == torch.bfloat16 and count == COUNTS[0] \
                        and rank == 0:
                    print(f"torch_check: all_reduce premul_sum bfloat16 expects NCCL's result, "
                          f"a factor of {premul_factor(dtype)} for {PREMUL_FACTOR}: PyTorch "
                          f"passes a float scalar of which NCCL reads 2 bytes "
                          f"(pytorch/pytorch#190745)", flush=True)
                t = inputs[rank].to(dtype).to(device)
                dist.all_reduce(t, op=op)
                chk.equal(f"all_reduce {name} {tag}", t, reference(inputs).to(dtype))

            out = torch.empty(world * count, dtype=dtype, device=device)
            dist.all_gather_into_tensor(out, inputs[rank].to(dtype).to(device))
            chk.equal(f"all_gather_into_tensor {tag}", out, inputs.reshape(-1).to(dtype))

            big = torch.stack([values(r, world * count, salt=1) for r in range(world)])
            out = torch.empty(count, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(out, big[rank].to(dtype).to(device))
            want = big.sum(0)[rank * count:(rank + 1) * count]
            chk.equal(f"reduce_scatter_tensor sum {tag}", out, want.to(dtype))

            for root in range(world):
                t = inputs[rank].to(dtype).to(device)
                dist.broadcast(t, src=root)
                chk.equal(f"broadcast root {root} {tag}", t, inputs[root].to(dtype))

            # Block j of rank r's input goes to rank j: r * world + j, with j's own offsets.
            block = count // world or 1
            send = torch.stack([(torch.arange(world * block, dtype=torch.float64) // block)
                                + r * world for r in range(world)]) % 256
            out = torch.empty(world * block, dtype=dtype, device=device)
            dist.all_to_all_single(out, send[rank].to(dtype).to(device))
            want = torch.cat([send[r][rank * block:(rank + 1) * block] for r in range(world)])
            chk.equal(f"all_to_all_single {tag}", out, want.to(dtype))

    check_point_to_point(chk, rank, world, device)
    dist.barrier()
    check_groups(chk, rank, world, device)


def check_point_to_point(chk, rank, world, device):
    count = 4099
    if world > 1:
        # Blocking: rank 0 sends to the last rank and back.
        last = world - 1
        if rank == 0:
            dist.send(values(0, count).float().to(device), dst=last)
            t = torch.empty(count, device=device)
            dist.recv(t, src=last)
            chk.equal("send/recv from the last rank", t, values(last, count) * 2)
        elif rank == last:
            t = torch.empty(count, device=device)
            dist.recv(t, src=0)
            chk.equal("send/recv to the last rank", t, values(0, count))
            dist.send(values(last, count).float().to(device) * 2, dst=0)
    # Batched, around the ring in both directions at once.
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    from_prev = torch.empty(count, device=device)
    from_next = torch.empty(count, device=device)
    ops = [dist.P2POp(dist.isend, values(rank, count).float().to(device), nxt),
           dist.P2POp(dist.isend, values(rank, count, salt=1).float().to(device), prv),
           dist.P2POp(dist.irecv, from_prev, prv),
           dist.P2POp(dist.irecv, from_next, nxt)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    chk.equal("batch_isend_irecv from the previous rank", from_prev, values(prv, count))
    chk.equal("batch_isend_irecv from the next rank", from_next, values(nxt, count, salt=1))


def check_groups(chk, rank, world, device):
    """Collectives in sub-communicators: every even rank, and the first and last rank."""
    for members in (list(range(0, world, 2)), sorted({0, world - 1})):
        group = dist.new_group(members)
        if rank in members:
            t = values(rank, 1001).float().to(device)
            dist.all_reduce(t, group=group)
            want = torch.stack([values(r, 1001) for r in members]).sum(0)
            chk.equal(f"all_reduce in new_group({members})", t, want)
            t = values(rank, 1001).float().to(device)
            dist.broadcast(t, src=members[-1], group=group)
            chk.equal(f"broadcast in new_group({members})", t, values(members[-1], 1001))
        dist.barrier()


# --- DDP ------------------------------------------------------------------------------------

def check_graphs(chk, world, device):
    x = torch.ones(1024, device=device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm up outside the capture, as torch.cuda.graph asks
            dist.all_reduce(x)
    torch.cuda.current_stream().wait_stream(side)
    x.fill_(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(x)
        x.mul_(2)
    for _ in range(10):
        graph.replay()
    torch.cuda.synchronize()
    chk.equal("all_reduce and mul_ captured, 10 replays", x, torch.full_like(x, (2 * world) ** 10))

    small = torch.zeros(2, device=device)  # 8 bytes
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dist.all_reduce(small)
    times = {}
    for name, step in (("call", lambda: dist.all_reduce(small)), ("replay", graph.replay)):
        for _ in range(100):
            step()
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(1000):
            step()
        torch.cuda.synchronize()
        times[name] = (time.perf_counter() - started) * 1e3  # us per step over 1000
    print(f"torch_check: 8 B all_reduce, {times['call']:.1f} us a call, "
          f"{times['replay']:.1f} us a replay of a captured one", flush=True)


def model_and_batch(device, world):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                torch.nn.Linear(32, 4)).to(device)
    inputs = torch.randn(16 * 4, 16).to(device)  # a global batch of 64: 4 * 16 per step
    targets = torch.randn(16 * 4, 4).to(device)
    return model, inputs, targets


def train(model, inputs, targets, steps, step_hook=None, loss_of=None):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(steps):
        if step_hook is not None:
            step_hook(step)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        loss.backward()
        opt.step()
        losses.append(loss_of(loss) if loss_of is not None else loss.detach())
    return losses


def check_ddp(chk, rank, world, device):
    torch.backends.cuda.matmul.allow_tf32 = False
    model, inputs, targets = model_and_batch(device, world)
    single = copy.deepcopy(model)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)
    share = inputs.shape[0] // world
    mine = slice(rank * share, (rank + 1) * share)

    def global_loss(loss):
        # Equal shares: the global batch's loss is the mean of the ranks' losses.
        t = loss.detach().clone()
        dist.all_reduce(t)
        return t / world

    losses = train(ddp, inputs[mine], targets[mine], 20, loss_of=global_loss)
    want = train(single, inputs, targets, 20)
    chk.close("DDP losses over 20 steps", torch.stack(losses), torch.stack(want))
    for (name, p), q in zip(ddp.module.named_parameters(), single.parameters()):
        chk.close(f"DDP weights {name} after 20 steps", p.detach(), q.detach())


# --- which library ---------------------------------------------------------------------------

class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def mapped(name):
    """The paths of the files mapped into this process whose names start with `name`."""
    paths = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith(name) and path not in paths:
                paths.append(path)
    return paths


def loaded_nccl():
    """The file that PyTorch's NCCL calls resolve to, or None. PyTorch maps its own
    libnccl.so.2 even when another is preloaded, so the mappings do not say; the dynamic
    linker's order does: the global scope first (the program, LD_PRELOAD, what was opened
    RTLD_GLOBAL), then the scope of the library that calls (libtorch_cuda.so and what it
    needs). Asks dlsym for ncclCommInitRankConfig in that order, then dladdr for its file."""
    libc = ctypes.CDLL(None)  # dlopen(NULL): the global scope
    dladdr = getattr(libc, "dladdr", None) or ctypes.CDLL("libdl.so.2").dladdr
    dladdr.argtypes = (ctypes.c_void_p, ctypes.POINTER(DlInfo))
    scopes = [libc] + [ctypes.CDLL(path, mode=os.RTLD_LAZY | os.RTLD_NOLOAD)
                       for path in mapped("libtorch_cuda.so")]
    for scope in scopes:
        try:
            address = ctypes.cast(scope.ncclCommInitRankConfig, ctypes.c_void_p).value
        except AttributeError:
            continue
        info = DlInfo()
        if dladdr(address, ctypes.byref(info)) and info.dli_fname:
            return os.fsdecode(info.dli_fname)
    return None


def check_library(chk, expect):
    path = loaded_nccl()
    chk.checks += 1
    if path is None:
        print(f"rank {chk.rank}: no library defines ncclCommInitRankConfig for PyTorch "
              f"(mapped: {', '.join(mapped('libnccl.so')) or 'no libnccl.so'})", flush=True)
        chk.failed += 1
        return
    with open(path, "rb") as lib:
        is_shim = b"ncclshim" in lib.read()
    if is_shim != (expect == "ncclshim"):
        print(f"rank {chk.rank}: NCCL's symbols resolve to {path}, "
              f"{'ncclshim' if is_shim else 'not ncclshim'}, expected {expect}", flush=True)
        chk.failed += 1
    elif chk.rank == 0:
        others = [p for p in mapped("libnccl.so")
                  if os.path.realpath(p) != os.path.realpath(path)]
        print(f"libnccl.so.2 in use: {path} ({'ncclshim' if is_shim else 'genuine'})" +
              (f"; also mapped: {', '.join(others)}" if others else ""), flush=True)


# --- modes ----------------------------------------------------------------------------------

def device_of(args, local_rank):
    if args.device == "cpu":
        return torch.device("cpu")
    device = torch.device("cuda", local_rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    return device


def run_checks(args):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = device_of(args, int(os.environ.get("LOCAL_RANK", rank)))
    dist.init_process_group(args.backend, device_id=device if device.type == "cuda" else None)
    chk = Checker(rank)
    if args.expect:
        check_library(chk, args.expect)
    started = time.time()
    check_collectives(chk, rank, world, device, args.backend)
    check_ddp(chk, rank, world, device)
    if device.type == "cuda" and (world == 1 or world <= torch.cuda.device_count() or
                                  os.environ.get("NCCLSHIM_RANK_LEADERS") == "1"):
        check_graphs(chk, world, device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    failed = torch.tensor([chk.failed], dtype=torch.float32, device=device)
    dist.all_reduce(failed)
    if rank == 0:
        print(f"torch_check: {world} ranks, backend {args.backend}, {chk.checks} checks a rank "
              f"in {time.time() - started:.1f} s, {int(failed.item())} failed", flush=True)
    dist.destroy_process_group()
    return 1 if chk.failed or failed.item() else 0


def kill_worker(args):
    """One rank of kill mode: trains until its peer dies; the last rank kills itself."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = device_of(args, rank)
    dist.init_process_group(args.backend, device_id=device if device.type == "cuda" else None)
    if args.expect:
        chk = Checker(rank)
        check_library(chk, args.expect)
        if chk.failed:
            return 2
    model, inputs, targets = model_and_batch(device, world)
    ddp = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None)

    def hook(step):
        if step == KILL_STEP and rank == world - 1:
            print(f"rank {rank}: killing myself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    # Each step's loss is read on the host, as training loops log it: a stream that never
    # finishes would block here for good unless the watchdog ends the process.
    train(ddp, inputs, targets, 1 << 30, step_hook=hook, loss_of=lambda loss: loss.item())
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_kill(args):
    n = args.kill
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               WORLD_SIZE=str(n), TORCH_NCCL_ASYNC_ERROR_HANDLING="1")
    command = [sys.executable, os.path.abspath(__file__), "--worker", "--backend", args.backend,
               "--device", args.device] + (["--expect", args.expect] if args.expect else [])
    ranks = [subprocess.Popen(command, env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(n)]
    # Wait for every rank up to the deadline; whoever is still running then hangs.
    started = time.time()
    ended = [None] * n
    while any(t is None for t in ended) and time.time() - started < args.deadline:
        for r, proc in enumerate(ranks):
            if ended[r] is None and proc.poll() is not None:
                ended[r] = time.time() - started
        time.sleep(0.2)
    for proc in ranks:
        if proc.poll() is None:
            proc.kill()
    failed = 0
    for r, proc in enumerate(ranks):
        out = proc.communicate()[0]
        last = "    " + "\n    ".join(out.strip().splitlines()[-6:])
        if ended[r] is None:
            print(f"rank {r}: HANG, still running {args.deadline:.0f} s after the start; "
                  f"last lines:\n{last}", flush=True)
            failed += 1
        elif r == n - 1:
            ok = proc.returncode == -signal.SIGKILL
            print(f"rank {r}: killed itself ({'ok' if ok else f'exit {proc.returncode}'})")
            failed += not ok
        else:
            # The survivors must end by an error that names the failure, not by a clean
            # exit (or by the watchdog's timeout, which is 10 minutes).
            words = {"nccl": ("ncclRemoteError", "remote process exited"),
                     "gloo": ("Connection reset", "Connection closed")}[args.backend]
            named = any(w in out for w in words)
            ok = proc.returncode != 0 and named
            print(f"rank {r}: exit {proc.returncode} after {ended[r]:.1f} s, "
                  f"{'an error naming the failure' if named else 'no error message'}"
                  f"{'' if ok else ' FAILED'}; last lines:\n{last}", flush=True)
            failed += not ok
    print(f"torch_check kill: {n} ranks, backend {args.backend}, "
          f"{'passed' if not failed else f'{failed} failed'}", flush=True)
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--expect", choices=("ncclshim", "genuine"))
    parser.add_argument("--kill", type=int, metavar="N", help="kill mode with N ranks")
    parser.add_argument("--deadline", type=float, default=180.0,
                        help="kill mode: seconds within which every rank must have ended")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return kill_worker(args)
    if args.kill:
        return run_kill(args)
    return run_checks(args)


if __name__ == "__main__":
    sys.exit(main())

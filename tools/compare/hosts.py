#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""hosts.py: `make compare-hosts`, `make compare` across hosts made of network namespaces.

Makes 4 hosts on this machine: a network namespace each (cmp-hI-PID, I = 0..3), with one end
of a veth pair named eth0, addressed 10.78.0.(I+1)/24, whose other end is a port of a bridge
in a fifth namespace (cmp-sw-PID); plus an IPC and a UTS namespace each (host name
cmp-hI-PID), bind-mounted under /run/ncclshim-hosts. Without its own IPC namespace a
host's ranks would reach the others' through UCX's shared memory, which goes by the boot id.
IPv6 is off, so that nothing but the runs crosses the bridge. Everything goes away on
every exit (failures, Ctrl-C, SIGTERM and SIGHUP included).

Runs, as compare.py does (its code: interleaved per collective and layout, the library order
rotating per pass, medians over passes, the same sizes, warm-up and iteration counts), all
of its collectives at 2 hosts x 1 rank, 2 x 2 and 4 x 1, rank r on host r // ranks-per-host:
- ncclshim: build/bin/<coll>_perf -c 1 -a 3, each rank started in its host with RANK,
  WORLD_SIZE, LOCAL_RANK, NCCL_COMM_ID (host 0), NCCL_SOCKET_IFNAME=eth0 and
  UCX_NET_DEVICES=eth0; UCX's default transports, so TCP between hosts and shared memory
  inside one (the wire table's loopback column shows that no byte of theirs goes over TCP
  inside a host).
- Gloo: tools/compare/gloo_perf.py the same way, with MASTER_ADDR (host 0), MASTER_PORT and
  GLOO_SOCKET_IFNAME=eth0; TCP between any two ranks, so inside a host over loopback.
- Open MPI and MPICH: mpi_perf as one multi-node job, mpirun in host 0, every host a node,
  whose daemons the MPI starts through tools/compare/netns_ssh.sh, a stand-in for ssh. Open
  MPI: pml ob1, btl tcp,vader,self, btl_tcp_if_include and oob_tcp_if_include eth0, and
  mpi_yield_when_idle where a layout has more ranks than this machine has cores (Open MPI
  yields by itself on a node it knows to be oversubscribed; here each host has only its slots
  to go by). MPICH (Debian's build: ch4:ucx): -iface eth0, UCX_NET_DEVICES=eth0.

Then the bytes each library puts on the wire: for each layout, collective, library and a few
sizes S, two runs of S alone that differ only in their timed calls (1 and 5). Each host's
tx_bytes of eth0 and of lo is read before and after each run; the difference between the two
runs, over the 4 extra calls (8 for ncclshim, whose benchmark times in place as well), is
exact per call: start-up, bootstrap, warm-up, the checked call and teardown are the same in
both and cancel out. Reported as bytes per call / S between
hosts (every packet that leaves a host's eth0 crosses the bridge; Ethernet, IP and TCP
headers and ACKs included) and, in brackets, over loopback inside the hosts (TCP between ranks
of one host). S is the benchmark's size: the larger of a rank's send and receive buffer.

And the TCP ceiling, with iperf3 (a stream a flow, bytes received): one stream from host 1 to
host 0; hosts 0 and 1 sending to each other at once; a ring of the 4 hosts, each sending to
the next at once.

Prints and writes under build/compare-hosts/ what compare.py does (results.csv of every pass,
table.txt, summary.md, a PNG per collective), plus wire.csv and tcp.csv, whose tables end
table.txt and summary.md. --from-csv reports on an earlier run's CSVs without measuring.
Exits non-zero if any run failed or gave a wrong result, after printing what it measured;
prints why and exits 0 (77 with --probe) when it cannot make the hosts (not root, no
`ip netns`). --quick (8 B, 8 KiB and 8 MiB, one pass, the wire at 1 MiB, iperf3 for 2 s)
took 7 minutes on 2 cores; the full mode is estimated at 2 to 3 hours there.

--columns times only the sizes of the summary's columns (8 B, 64 KiB, 1 MiB, 4 MiB, 16 MiB,
64 MiB) as the full mode does, in two passes, the wire at 1 MiB.

Usage: tools/compare/hosts.py [--build DIR] [--quick | --columns] [--from-csv CSV] [--probe]
"""

import argparse
import csv
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import compare
from compare import Layout

LAYOUTS = [Layout(2, 1), Layout(2, 2), Layout(4, 1)]
QUICK = {"ranges": compare.QUICK["ranges"], "passes": 1}
# The sizes of the summary's columns only (8 B, 64 KiB, 1 MiB, 16 MiB, 64 MiB, with 4 MiB
# between), as the full mode times them, in two passes.
COLUMNS = {"ranges": [(["-b", "8", "-e", "64K", "-f", "8192"], 10, 100),
                      (["-b", "1M", "-e", "64M", "-f", "4"], 2, 10)], "passes": 2}
NHOSTS = 4
SUBNET = "10.78.0"
NIC = "eth0"
NSDIR = "/run/ncclshim-hosts"  # where the hosts' IPC and UTS namespaces are bind-mounted
WIRE_CALLS = (1, 5)  # timed calls of the two runs whose difference is the wire bytes
# Calls a timed iteration makes: tools/bench times every size out of place and then in place,
# -n calls each (the same bytes: in place changes addresses, not the algorithm).
CALLS_PER_ITER = {"ncclshim": 2}
WIRE_SIZES = {"full": [1 << 20, 64 << 20], "columns": [1 << 20], "quick": [1 << 20]}
IPERF_SECONDS = {"full": 10, "columns": 10, "quick": 2}
TCP_TESTS = [("one stream, host 1 to host 0", [(1, 0)]),
             ("hosts 0 and 1 to each other at once", [(0, 1), (1, 0)]),
             ("ring of 4 hosts, each to the next at once", [(0, 1), (1, 2), (2, 3), (3, 0)])]
HERE = os.path.dirname(os.path.abspath(__file__))


def sh(*cmd):
    """Runs one setup command; raises with its message when it fails."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


class Hosts:
    """The namespaces of one run: NHOSTS hosts on a bridge."""

    def __init__(self, tag):
        self.tag = tag
        self.names = [f"cmp-h{i}-{tag}" for i in range(NHOSTS)]
        self.switch = f"cmp-sw-{tag}"

    @staticmethod
    def addr(i):
        return f"{SUBNET}.{i + 1}"

    def enter(self, i):
        """The command prefix that runs a program in host i."""
        name = self.names[i]
        return ["ip", "netns", "exec", name, "nsenter", f"--ipc={NSDIR}/{name}.ipc",
                f"--uts={NSDIR}/{name}.uts"]

    def up(self):
        no_ipv6 = ["sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                   "net.ipv6.conf.default.disable_ipv6=1"]
        sh("ip", "netns", "add", self.switch)
        # No IPv6 (its neighbour discovery would add to the bytes counted); none at all in a
        # kernel without it, which is as good.
        subprocess.run(["ip", "netns", "exec", self.switch] + no_ipv6, capture_output=True)
        sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.switch, "link", "set", "br0", "up")
        os.makedirs(NSDIR, exist_ok=True)
        for i, name in enumerate(self.names):
            port = f"cmpv{i}-{self.tag}"
            sh("ip", "netns", "add", name)
            subprocess.run(["ip", "netns", "exec", name] + no_ipv6, capture_output=True)
            # Made in the root namespace under names unique to this run, then moved away.
            sh("ip", "link", "add", port, "type", "veth", "peer", "name", f"cmpe{i}-{self.tag}")
            sh("ip", "link", "set", port, "netns", self.switch)
            sh("ip", "link", "set", f"cmpe{i}-{self.tag}", "netns", name, "name", NIC)
            sh("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
            sh("ip", "-n", name, "addr", "add", f"{self.addr(i)}/24", "dev", NIC)
            sh("ip", "-n", name, "link", "set", "lo", "up")
            sh("ip", "-n", name, "link", "set", NIC, "up")
            for kind in ("ipc", "uts"):
                open(f"{NSDIR}/{name}.{kind}", "w").close()
            sh("unshare", f"--ipc={NSDIR}/{name}.ipc", f"--uts={NSDIR}/{name}.uts",
               "hostname", name)

    def kill_all(self):
        """Ends whatever runs in the hosts (a failed run's daemons and ranks)."""
        for name in self.names:
            pids = subprocess.run(["ip", "netns", "pids", name], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def down(self):
        """Removes whatever up() made, as far as it got."""
        self.kill_all()
        for name in self.names:
            for kind in ("ipc", "uts"):
                path = f"{NSDIR}/{name}.{kind}"
                subprocess.run(["umount", path], capture_output=True)
                if os.path.exists(path):
                    os.unlink(path)
        try:
            os.rmdir(NSDIR)
        except OSError:
            pass  # not there, or another run's hosts are in it
        # Deleting a namespace destroys the veth ends in it, and with them their peers.
        for name in self.names + [self.switch]:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)
        for i in range(NHOSTS):
            for link in (f"cmpv{i}-{self.tag}", f"cmpe{i}-{self.tag}"):
                subprocess.run(["ip", "link", "del", link], capture_output=True)

    def counters(self):
        """{(host, device): tx_bytes} of every host's eth0 and lo."""
        found = {}
        for i, name in enumerate(self.names):
            for link in json.loads(sh("ip", "-n", name, "-j", "-s", "link", "show")):
                if link["ifname"] in (NIC, "lo"):
                    found[(i, link["ifname"])] = link["stats64"]["tx"]["bytes"]
        return found


def cannot_run():
    """Why the hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_SYS_ADMIN)"
    probe = f"cmp-probe-{os.getpid()}"
    try:
        made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    except FileNotFoundError:
        return "`ip` is missing (apt-get install iproute2)"
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Runner:
    """Runs one program of a library over the hosts: run(lib, coll, layout, size_range), as
    compare.measure() calls it."""

    def __init__(self, hosts, build):
        self.hosts = hosts
        self.build = os.path.abspath(build)
        self.port = 30000  # a fresh pair of ports a run: no waiting for TIME_WAIT
        self.hangs = []  # the runs that hung after their last row

    def run(self, lib, coll, layout, size_range):
        sizes, warmup, iters = size_range
        counts = sizes + ["-w", str(warmup), "-n", str(iters)]
        self.port += 2
        if lib in ("openmpi", "mpich"):
            cmds = [self.mpi_command(lib, coll, layout, counts)]
        else:
            cmds = self.rank_commands(lib, coll, layout, counts)
        rows, error = self.execute(cmds, coll, layout.nranks)
        if error == HUNG:
            self.hangs.append(f"{lib} {coll} {layout} {' '.join(sizes)}")
            print(f"compare-hosts: {lib} {coll} {layout}: hung after its last row; ended",
                  file=sys.stderr)
            error = None
        if error and error != compare.SKIPPED:
            self.hosts.kill_all()  # an MPI's daemons outlive a killed mpirun
        return rows, error

    def mpi_command(self, lib, coll, layout, counts):
        hosts = ",".join(f"{name}:{layout.per_host}"
                         for name in self.hosts.names[:layout.hosts])
        agent = os.path.join(HERE, "netns_ssh.sh")
        if lib == "openmpi":
            cmd = ["mpirun.openmpi", "--allow-run-as-root", "--bind-to", "none",
                   "--host", hosts, "-n", str(layout.nranks), "--mca", "plm_rsh_agent", agent,
                   "--mca", "pml", "ob1", "--mca", "btl", "tcp,vader,self",
                   "--mca", "btl_tcp_if_include", NIC, "--mca", "oob_tcp_if_include", NIC]
            if layout.nranks > os.cpu_count():
                cmd += ["--mca", "mpi_yield_when_idle", "1"]
        else:
            cmd = ["mpirun.mpich", "-hosts", hosts, "-n", str(layout.nranks),
                   "-launcher", "ssh", "-launcher-exec", agent, "-iface", NIC,
                   "-genv", "UCX_NET_DEVICES", NIC]
        prog = [os.path.join(self.build, "compare", "mpi_perf." + lib), coll]
        return self.hosts.enter(0) + cmd + prog + counts

    def rank_commands(self, lib, coll, layout, counts):
        """One command a rank, each in its host."""
        root = self.hosts.addr(0)
        if lib == "ncclshim":
            prog = [os.path.join(self.build, "bin", coll + "_perf"), "-c", "1", "-a", "3"]
            env = [f"NCCL_COMM_ID={root}:{self.port}", f"NCCL_SOCKET_IFNAME={NIC}",
                   f"UCX_NET_DEVICES={NIC}"]
        else:
            prog = [sys.executable, os.path.join(HERE, "gloo_perf.py"), coll]
            env = [f"MASTER_ADDR={root}", f"MASTER_PORT={self.port}",
                   f"GLOO_SOCKET_IFNAME={NIC}"]
        cmds = []
        for r in range(layout.nranks):
            ids = [f"RANK={r}", f"WORLD_SIZE={layout.nranks}",
                   f"LOCAL_RANK={r % layout.per_host}", f"LOCAL_WORLD_SIZE={layout.per_host}"]
            cmds.append(self.hosts.enter(r // layout.per_host) + ["env"] + ids + env + prog +
                        counts)
        return cmds

    def execute(self, cmds, coll, nranks):
        """Starts every command (an MPI's mpirun, or each rank), each in a process group of
        its own; the first to fail (exit not 0) ends the others, as ncclshim-launch does.
        compare.outcome() of the first one's rows and the failed one's (else the first one's)
        messages; or HUNG as the error when the first one printed its last line (all rows
        and the check's verdict) and FINALIZE_GRACE seconds later had not exited."""
        with tempfile.TemporaryDirectory() as tmp:
            procs = []
            try:
                for r, cmd in enumerate(cmds):
                    with open(f"{tmp}/{r}.out", "w") as out, open(f"{tmp}/{r}.err", "w") as err:
                        procs.append(subprocess.Popen(cmd, stdout=out, stderr=err,
                                                      stdin=subprocess.DEVNULL,
                                                      start_new_session=True))
                failed, returncode = wait_ranks(procs, f"{tmp}/0.out")
            finally:
                for proc in procs:
                    if proc.poll() is None:
                        os.killpg(proc.pid, signal.SIGKILL)
                        proc.wait()
            with open(f"{tmp}/0.out") as out, open(f"{tmp}/{failed or 0}.err") as err:
                text, messages = out.read(), err.read()
        if returncode is None:
            return {}, "timed out"
        if returncode == HUNG:
            verdict = [line for line in text.splitlines() if line.startswith(LAST_LINE)]
            rows, error = compare.outcome(0 if verdict[0].endswith(" OK") else 1, text,
                                          messages, coll, nranks)
            return rows, error or HUNG
        return compare.outcome(returncode, text, messages, coll, nranks)


HUNG = "hung"  # the status of a run that printed everything but did not exit
FINALIZE_GRACE = 10  # seconds a run may take to exit once it printed its last line
LAST_LINE = "# Out of bounds values"  # how every benchmark here ends its output


def wait_ranks(procs, out):
    """(index, status) of the first process to fail, (None, 0) when all exit 0, (None, HUNG)
    when they are still there FINALIZE_GRACE seconds after the file out (the first one's
    output) got its last line, or (None, None) after compare.TIMEOUT seconds; the others are
    ended once one fails."""
    deadline = time.monotonic() + compare.TIMEOUT
    grace_end = None
    while time.monotonic() < deadline:
        running = 0
        for r, proc in enumerate(procs):
            status = proc.poll()
            if status is None:
                running += 1
            elif status != 0:
                for other in procs:
                    if other.poll() is None:
                        os.killpg(other.pid, signal.SIGTERM)
                return r, status
        if not running:
            return None, 0
        if grace_end is None:
            with open(out) as f:
                if LAST_LINE in f.read():
                    grace_end = time.monotonic() + FINALIZE_GRACE
        elif time.monotonic() > grace_end:
            return None, HUNG
        time.sleep(0.05)
    return None, None


def wire(hosts, runner, libs, layouts, sizes):
    """[(coll, layout, lib, size, between, loopback)]: bytes a call / size between hosts and
    over the hosts' loopback; and the failures seen."""
    rows, failures = [], []
    for layout in layouts:
        for coll in compare.COLLS:
            for lib in libs:
                for size in sizes:
                    counted, error = [], None
                    for iters in WIRE_CALLS:
                        before = hosts.counters()
                        size_range = (["-b", str(size), "-e", str(size)], 1, iters)
                        _, error = runner.run(lib, coll, layout, size_range)
                        after = hosts.counters()
                        if error:
                            break
                        counted.append([sum(after[k] - before[k] for k in after if k[1] == dev)
                                        for dev in (NIC, "lo")])
                    if error == compare.SKIPPED:
                        break
                    if error:
                        failures.append(f"{lib} {coll} {layout} wire at {size} B: {error}")
                        print(f"compare-hosts: {failures[-1]}", file=sys.stderr)
                        break
                    calls = (WIRE_CALLS[1] - WIRE_CALLS[0]) * CALLS_PER_ITER.get(lib, 1)
                    between, loopback = ((b - a) / calls / size for a, b in zip(*counted))
                    rows.append((coll, layout, lib, size, between, loopback))
    return rows, failures


def wire_tables(rows, libs):
    """(text, Markdown) of the wire bytes: a block per layout and size, a row per collective."""
    text = ["", "bytes a call between hosts / S (in brackets: over loopback inside the hosts / S)"]
    md = ["", "Bytes a call between hosts / S (in brackets: over loopback inside the hosts):", ""]
    found = {(coll, layout, lib, size): (b, lo) for coll, layout, lib, size, b, lo in rows}
    blocks = sorted({(layout, size) for _, layout, _, size, _, _ in rows})
    for layout, size in blocks:
        text += ["", f"{layout}, S = {compare.human(size)}",
                 "%16s" % "collective" + "".join("%15s" % lib for lib in libs)]
        md += [f"| {layout}, {compare.human(size)} | " + " | ".join(libs) + " |",
               "|---|" + "---|" * len(libs)]
        for coll in compare.COLLS:
            cells = []
            for lib in libs:
                got = found.get((coll, layout, lib, size))
                # + 0.0: a count a few bytes short of the other run's prints as 0.00, not -0.00
                cells.append("-" if got is None else
                             "%.2f (%.2f)" % tuple(round(v, 2) + 0.0 for v in got))
            text.append("%16s" % coll + "".join("%15s" % c for c in cells))
            md.append(f"| {coll} | " + " | ".join(cells) + " |")
        md.append("")
    return "\n".join(text), "\n".join(md).rstrip()


def iperf(hosts, flows, seconds, port):
    """GB/s received by each flow (src, dst) of one test, all flows at once."""
    servers, clients = [], []
    try:
        for k, (_, dst) in enumerate(flows):
            servers.append(subprocess.Popen(
                hosts.enter(dst) + ["iperf3", "-s", "-1", "-B", hosts.addr(dst),
                                    "-p", str(port + k)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for k, (_, dst) in enumerate(flows):
            listening(hosts, dst, port + k)
        for k, (src, dst) in enumerate(flows):
            clients.append(subprocess.Popen(
                hosts.enter(src) + ["iperf3", "-c", hosts.addr(dst), "-B", hosts.addr(src),
                                    "-p", str(port + k), "-t", str(seconds), "-J"],
                stdout=subprocess.PIPE, text=True))
        rates = []
        for client in clients:
            report = json.loads(client.communicate(timeout=seconds + 60)[0])
            if "error" in report:
                raise RuntimeError(f"iperf3: {report['error']}")
            rates.append(report["end"]["sum_received"]["bits_per_second"] / 8e9)
        return rates
    finally:
        for proc in servers + clients:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def listening(hosts, i, port):
    """Waits (5 s at most) until host i listens on the TCP port."""
    for _ in range(250):
        found = subprocess.run(["ip", "netns", "exec", hosts.names[i], "ss", "-Hltn",
                                f"sport = :{port}"], capture_output=True, text=True).stdout
        if found.strip():
            return
        time.sleep(0.02)
    raise RuntimeError(f"iperf3 does not listen on host {i} port {port}")


def tcp_ceiling(hosts, seconds):
    """[(test, src, dst, GB/s)] of TCP_TESTS."""
    rows = []
    for n, (name, flows) in enumerate(TCP_TESTS):
        for (src, dst), rate in zip(flows, iperf(hosts, flows, seconds, 5201 + 10 * n)):
            rows.append((name, src, dst, rate))
    return rows


def tcp_tables(rows):
    """(text, Markdown) of the TCP ceiling."""
    text = ["", "TCP ceiling, iperf3 (GB/s received, a stream a flow)"]
    md = ["", "| TCP ceiling, iperf3 (a stream a flow) | GB/s received |", "|---|---|"]
    for name, _ in TCP_TESTS:
        flows = [(src, dst, rate) for test, src, dst, rate in rows if test == name]
        if not flows:
            continue
        each = ", ".join(f"{src}->{dst} {rate:.3f}" for src, dst, rate in flows)
        total = f"{each}; sum {sum(f[2] for f in flows):.3f}" if len(flows) > 1 else each
        text.append(f"  {name}: {total}")
        md.append(f"| {name} | {total} |")
    return "\n".join(text), "\n".join(md)


CEILING_CASE = ("all_reduce", Layout(2, 1), 64 << 20)  # what the two-way test bounds


def ceiling_share(results, tcp_rows):
    """(text, Markdown): ncclshim's 2 x 1 all-reduce at 64 MiB against the two-way iperf3
    test. Its bus bandwidth is what each host sends and receives, so the bound is a
    direction of that test: the mean of the two, and each."""
    coll, layout, size = CEILING_CASE
    busbw = compare.by_key(results).get((coll, layout, "ncclshim", size))
    rates = [rate for test, _, _, rate in tcp_rows if test == TCP_TESTS[1][0]]
    if not busbw or len(rates) != 2 or min(rates) <= 0:
        return "", ""
    ours, mean = statistics.median(busbw), sum(rates) / 2
    line = (f"{coll}, {layout}, {compare.human(size)}: {ours:.3f} GB/s (passes "
            f"{min(busbw):.3f}-{max(busbw):.3f}), {100 * ours / mean:.0f}% of a direction of "
            f"'{TCP_TESTS[1][0]}' ({mean:.3f} GB/s mean; {100 * ours / max(rates):.0f}% of the "
            f"faster, {100 * ours / min(rates):.0f}% of the slower)")
    return "\n" + line, "\n" + line + "\n"


def write_rows(path, head, rows):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(head)
        writer.writerows(rows)


WIRE_HEAD = ["collective", "hosts", "ranks", "library", "size", "between", "loopback"]
TCP_HEAD = ["test", "from", "to", "gbps"]


def save(out, results, wire_rows, tcp_rows):
    compare.write_csv(os.path.join(out, "results.csv"), results)
    write_rows(os.path.join(out, "wire.csv"), WIRE_HEAD,
               [(c, lay.hosts, lay.nranks, lib, s, b, lo)
                for c, lay, lib, s, b, lo in wire_rows])
    write_rows(os.path.join(out, "tcp.csv"), TCP_HEAD, tcp_rows)


def load(results_csv):
    """An earlier run's results, wire rows and TCP rows (results.csv, and wire.csv and
    tcp.csv beside it where they are)."""
    results, libs, layouts = compare.read_csv(results_csv)
    folder = os.path.dirname(results_csv)
    wire_rows, tcp_rows = [], []
    if os.path.exists(os.path.join(folder, "wire.csv")):
        with open(os.path.join(folder, "wire.csv"), newline="") as f:
            for row in csv.DictReader(f):
                hosts = int(row["hosts"])
                wire_rows.append((row["collective"], Layout(hosts, int(row["ranks"]) // hosts),
                                  row["library"], int(row["size"]), float(row["between"]),
                                  float(row["loopback"])))
    if os.path.exists(os.path.join(folder, "tcp.csv")):
        with open(os.path.join(folder, "tcp.csv"), newline="") as f:
            tcp_rows = [(row["test"], int(row["from"]), int(row["to"]), float(row["gbps"]))
                        for row in csv.DictReader(f)]
    return results, libs, layouts, wire_rows, tcp_rows


def report(out, results, libs, layouts, wire_rows, tcp_rows):
    wire_text, wire_md = wire_tables(wire_rows, libs)
    tcp_text, tcp_md = tcp_tables(tcp_rows)
    share_text, share_md = ceiling_share(results, tcp_rows)
    compare.report(results, libs, layouts, out,
                   text_tail=wire_text + "\n" + tcp_text + share_text,
                   md_tail="\n" + wire_md + "\n" + tcp_md + share_md)


def measure_all(hosts, args, libs, out):
    """Everything a run measures; the failures seen."""
    kind = "quick" if args.quick else "columns" if args.columns else "full"
    mode = {"quick": QUICK, "columns": COLUMNS, "full": compare.FULL}[kind]
    print(f"compare-hosts: {compare.describe(libs, mode, LAYOUTS)}; wire at "
          f"{', '.join(compare.human(s) for s in WIRE_SIZES[kind])}", flush=True)
    started = time.monotonic()
    tcp_rows = tcp_ceiling(hosts, IPERF_SECONDS[kind])
    print(tcp_tables(tcp_rows)[0].strip(), flush=True)
    runner = Runner(hosts, args.build)
    results, failures = compare.measure(libs, LAYOUTS, mode, runner.run)
    print(f"compare-hosts: busbw measured in {time.monotonic() - started:.0f} s", flush=True)
    wire_rows, wire_failures = wire(hosts, runner, libs, LAYOUTS, WIRE_SIZES[kind])
    save(out, results, wire_rows, tcp_rows)
    report(out, results, libs, LAYOUTS, wire_rows, tcp_rows)
    print(f"compare-hosts: measured in {time.monotonic() - started:.0f} s")
    if runner.hangs:
        print(f"compare-hosts: {len(runner.hangs)} runs printed every row and their check's "
              f"verdict but had not exited {FINALIZE_GRACE} s later (ended; their rows "
              "count):\n  " + "\n  ".join(runner.hangs))
    return failures + wire_failures


def leave(signum, _frame):
    raise SystemExit(128 + signum)  # unwinds through main's finally: the hosts go away


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--quick", action="store_true",
                        help="fewer sizes, one pass (7 minutes on 2 cores)")
    parser.add_argument("--columns", action="store_true",
                        help="only the summary's sizes (8 B, 64 KiB, 1 MiB-64 MiB), two passes")
    parser.add_argument("--from-csv", metavar="CSV",
                        help="measure nothing: report on the results.csv of an earlier run "
                             "(and its wire.csv and tcp.csv)")
    parser.add_argument("--probe", action="store_true",
                        help="only check that the hosts can be made: exit 0, or 77 and why")
    args = parser.parse_args()
    out = os.path.join(args.build, "compare-hosts")
    if args.from_csv:
        os.makedirs(out, exist_ok=True)
        results, libs, layouts, wire_rows, tcp_rows = load(args.from_csv)
        report(out, results, libs, layouts, wire_rows, tcp_rows)
        return 0
    why = cannot_run()
    if why:
        print(f"compare-hosts: skipped: {why}")
        return compare.SKIPPED if args.probe else 0
    if args.probe:
        return 0

    os.makedirs(out, exist_ok=True)
    libs = compare.libraries()
    hosts = Hosts(os.getpid())
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, leave)
    try:
        try:
            hosts.up()
        except RuntimeError as err:
            print(f"compare-hosts: could not make the hosts: {err}")
            return 1
        failures = measure_all(hosts, args, libs, out)
    except KeyboardInterrupt:
        print("compare-hosts: interrupted")
        return 130
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
        hosts.down()
    return compare.conclude(failures)


if __name__ == "__main__":
    sys.exit(main())

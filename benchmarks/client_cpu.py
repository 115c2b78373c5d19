"""The benchmark client's CPU per 1,000 streamed tokens *during the load*: servescope vs `vllm bench serve`.

    .venv/bin/python benchmarks/client_cpu.py [--rounds 3] [--concurrency 8,32,128] [--requests 200] [--shared]
                                              [--telemetry on,off] [--servescope-args "--transport httpx"]
                                              [--variant "--transport aiohttp"]
    .venv/bin/python benchmarks/client_cpu.py --sim [--streams 512,1024,2048,4096] [--rounds 3] [--client-alone]

Default mode starts the real CPU vLLM (tiny dense model, prefix caching off, via tests/support/vllm_server.py),
then for each concurrency and round runs the tools on 256 in / 64 out random prompts (ignore_eos, a fresh seed per
run), each going first in turn: vllm bench, servescope with its default telemetry (/metrics sampled every second:
what a user runs) and servescope with `--telemetry-interval off` (vllm bench samples nothing during a run);
`--telemetry on` or `off` keeps one of the two. `--servescope-args` is appended to servescope's flags.
`--variant FLAGS` adds servescope with those flags as a third tool in the rotation (an A/B of a setting);
`--variant-checkout DIR` makes that third tool another checkout's servescope (an A/B of a change).

Where vLLM runs: its engine core and CPU worker (every `VLLM::` process) on core 0 at nice 15, the API server and
the clients free to use every core, as on a GPU host, where the engine's work is on the GPU and its own cores and
the client shares CPUs with the API server. `--shared` leaves vLLM's engine where the OS puts it: on a 2-core
box its polling engine core and worker then take both cores at the clients' priority, the server's pace and the
way tokens bunch into reads change from run to run, and single runs of one tool vary by up to 2x.
`--client-alone` gives each client the last core to itself (vLLM's engine, its API server and this script on
core 0): a client with an idle core of its own, as on a large GPU host.

While a client runs, a thread of this process samples every 5 ms the CPU time (ns) of the client process and
of all its descendants (each process's CPU clock: all its threads, live and exited; the tree is re-read from
/proc every 100 ms, with utime+stime and the reaped children's time) and of the server's engine core process
(vLLM's `VLLM::EngineCore`: not its workers, which spin on for seconds after the last step, nor the API
server). The server's busy window runs from the start of the first 5 ms interval in which the engine core
used 1 ms of CPU or more (idle, it uses none) to the end of the last one, in the longest stretch with no idle
gap over 1 s (a lone request a tool sends, then pauses, before its load is no part of it); the client's CPU
during the load is its CPU at the window's end minus at its start (interpolated between samples). With the
simulator (`--sim`), whose one process also serves HTTP, the window is servescope's own (below). Tokens are
the server's generation_tokens_total delta over the whole run (checked against requests x 64). Apart from the load it reports the start-up CPU (the whole CPU of
a 1-request, 1-output-token run of each tool) and the preparation CPU per request (the client's CPU before
the busy window starts, minus the start-up CPU, over the requests).

Prints per-run lines on stderr, then one table: per concurrency and tool the median over rounds of CPU ms per 1k
tokens and its ratio to vllm bench, CPU ms per second of the load window (what a client costs while a slow server
runs), what servescope's /metrics scrapes cost it (ms CPU/s, as its client line says), output tok/s as each tool
reports it (and its ratio to vllm bench's), mean TTFT and the TTFT gap over vLLM's own server-side TTFT (its
histogram's mean over the run, from /metrics before and after; ratio to vllm bench's); then the start-up CPU
(s), the time and CPU from
exec to the first request reaching the server (the start of the engine's first busy interval in the 1-request
runs), and the preparation CPU per request (ms) of each tool. Figures are medians of N interleaved rounds on a noisy machine.

`--sim` runs no vLLM and no vllm bench: it starts servescope's simulator once (profile `max-speed` where it
exists, else `tiny`) and runs servescope alone at each of `--streams` concurrencies (requests = 2 x streams,
256 in / 64 out; the window is servescope's own, from its saved records: the first request sent to the last
response ended, in the clock of the CPU samples; an overloaded simulator answers /metrics too late for it); it prints
CPU ms per 1k tokens per stream count and its ratio to the first (the aim: 4,096 streams within 1.2x of 512),
beside the simulator's own CPU per 1k tokens in the same window (a Python asyncio server that holds as many
streams: what the number of streams costs a process apart from the client's code) and the client's wake-ups per
token (voluntary context switches of its event loop's thread, sampled every 100 ms). There, `--client-alone`
puts the simulator and this script on core 0 and the client on the last core; by default both go where the OS
puts them, as before.
"""

from __future__ import annotations

import argparse
import bisect
import http.client
import json
import os
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from servescope.core.telemetry import parse_metrics  # noqa: E402
from tests.support import vllm_server  # noqa: E402

IN_LEN, OUT_LEN = 256, 64
SAMPLE_S = 0.020  # /metrics scrapes (simulator mode)
CPU_SAMPLE_S = 0.005  # CPU clocks of the client and the engine
SCAN_EVERY = 20  # CPU samples between two reads of the whole process tree from /proc (100 ms)
CLK_TCK = os.sysconf("SC_CLK_TCK")
TICK_NS = 1_000_000_000 // CLK_TCK
ENGINE_BUSY_NS = 1_000_000  # engine CPU in one 5 ms interval that makes it busy (idle: 0)
ENGINE_GAP_S = 1.0  # an idle gap longer than this ends a busy stretch
# parse_metrics() sums each sample over its label sets (engine=, model_name=), so these keys are plain names
RUNNING, WAITING, GEN = "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:generation_tokens_total"
VLLM_BENCH, SERVESCOPE, VARIANT = "vllm bench", "servescope", "variant"
SERVESCOPE_OFF = "servescope, telemetry off"
TTFT = "vllm:time_to_first_token_seconds"
PREP_NOTE = ("(the start-up run's CPU also holds its work after the load, results and exit, which a run's CPU before "
             "the window does not: preparation can come out a little low, even below 0)")


# --- the client's CPU, from /proc ------------------------------------------------------------------------------

@dataclass(frozen=True)
class ProcStat:
    ppid: int
    start: int  # field 22, starttime: tells a reused pid apart from the process we saw
    own: int  # fields 14 + 15, utime + stime: all the process's threads, live and exited
    reaped: int  # fields 16 + 17, cutime + cstime: the children it has waited for, each with its whole subtree


def read_stat(pid: int) -> ProcStat | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            s = f.read()
    except OSError:  # gone between the listing and the read
        return None
    rest = s[s.rindex(b")") + 2:].split()  # the command name may hold spaces and parentheses; rest[0] is field 3
    return ProcStat(ppid=int(rest[1]), start=int(rest[19]), own=int(rest[11]) + int(rest[12]),
                    reaped=int(rest[13]) + int(rest[14]))


def cpu_ns(pid: int) -> int | None:
    """The process's CPU clock (all its threads, live and exited: user + system) in ns; None once it is gone.
    The clock id is Linux's encoding of `clock_getcpuclockid(pid)`: ((~pid) << 3) | CPUCLOCK_SCHED."""
    try:
        return time.clock_gettime_ns(((~pid) << 3) | 2)
    except OSError:
        return None


def all_stats() -> dict[int, ProcStat]:
    out: dict[int, ProcStat] = {}
    for name in os.listdir("/proc"):  # lists processes (thread group leaders), not their other threads
        if name.isdigit():
            st = read_stat(int(name))
            if st is not None:
                out[int(name)] = st
    return out


class TreeCPU:
    """CPU time (ns) of a process and every descendant, sampled.

    The rule, so that each process's CPU is counted exactly once and none is lost:
    - a member (the root, or a process seen as a descendant of a member) counts, while it is in /proc (running
      or a zombie), its own CPU (its CPU clock, else utime+stime) plus its cutime+cstime: the final CPU of the
      children it has reaped;
    - when a member disappears from /proc it has been reaped. If its parent, when last seen, was a member, that
      parent's cutime+cstime now holds its final CPU (the kernel adds the child's utime+stime+cutime+cstime at
      the wait), so it is dropped here: adding its last value too would count it twice;
    - if its parent, when last seen, was not a member (an orphan reparented to init or a subreaper outside the
      tree, which we keep as a member once seen: membership sticks while the same process lives), no member
      will ever hold its CPU: its last value seen is kept for good (`outside`). The root itself is reaped by
      this process, so its last value is kept the same way (`root_last`).
    `scan()` reads the whole tree from /proc (a few ms); `quick()` re-reads only the members' CPU clocks (a few
    us), the reaped and outside parts as the last scan left them (they move only when a member exits).
    What can still be missed: the CPU between a process's last sample and its exit when nobody in the tree reaps
    it, a child reaped by a member that set SIGCHLD to SIG_IGN (the kernel then adds nothing to cutime), and a
    member reparented and reaped between two scans. None of these happen with these two clients.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self.root_start: int | None = None
        self.members: dict[int, ProcStat] = {}  # members alive at the last scan, as then seen
        self.own: dict[int, int] = {}  # their own CPU (ns) when last read
        self.reaped = 0  # the members' cutime + cstime at the last scan (ns)
        self.outside = 0  # final CPU of members reaped outside the tree (the root not included)
        self.root_last = 0  # the root's last value, once it is gone

    def _own(self, pid: int, st: ProcStat | None) -> int:
        ns = cpu_ns(pid)
        if ns is None:  # gone since: its last clock reading, else its last stat
            ns = self.own.get(pid, st.own * TICK_NS if st is not None else 0)
        return ns

    def scan(self) -> int:
        stats = all_stats()
        kids: dict[int, list[int]] = {}
        for pid, st in stats.items():
            kids.setdefault(st.ppid, []).append(pid)
        root = stats.get(self.root)
        if self.root_start is None and root is not None:
            self.root_start = root.start
        seeds = [p for p, old in self.members.items() if p in stats and stats[p].start == old.start]
        if root is not None and root.start == self.root_start:
            seeds.append(self.root)
        now: dict[int, ProcStat] = {}
        while seeds:
            p = seeds.pop()
            if p not in now:
                now[p] = stats[p]
                seeds.extend(kids.get(p, ()))
        for p, old in self.members.items():
            if p in now:
                continue
            last = self.own.get(p, old.own * TICK_NS) + old.reaped * TICK_NS
            if p == self.root:
                self.root_last = last
            elif old.ppid not in self.members:
                self.outside += last
        self.members = now
        self.own = {p: self._own(p, st) for p, st in now.items()}
        self.reaped = sum(st.reaped for st in now.values()) * TICK_NS
        return sum(self.own.values()) + self.reaped + self.outside + self.root_last

    def quick(self) -> int:
        for p in self.own:
            ns = cpu_ns(p)
            if ns is not None:
                self.own[p] = ns
        return sum(self.own.values()) + self.reaped + self.outside + self.root_last


CLIENT_CPUS: set[int] | None = None  # --client-alone: the clients' cores (every other process kept off them)


def wakeups(pid: int) -> int | None:
    """Voluntary context switches of the process's main thread (the event loop's): how often it slept and woke."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def server_apart(server_pid: int) -> None:
    """--client-alone: the server process (all its threads) on core 0, at its usual priority: vLLM's API server
    beside its engine, or the simulator."""
    for task in Path(f"/proc/{server_pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), {0})
        except OSError:
            continue


def engine_pids(server_pid: int) -> list[int]:
    """vLLM's engine core processes among the server's descendants (`VLLM::EngineCore...`). Its workers are left
    out: a CPU worker keeps spinning for seconds after the last step. So is the API server, which also answers
    /metrics and health checks. Empty when there is none (then the window comes from /metrics)."""
    stats = all_stats()
    out: list[int] = []
    seeds = [p for p, st in stats.items() if st.ppid == server_pid]
    while seeds:
        p = seeds.pop()
        try:
            comm = Path(f"/proc/{p}/comm").read_text().strip()
        except OSError:
            continue
        if comm.startswith("VLLM::EngineCor"):
            out.append(p)
        seeds.extend(q for q, st in stats.items() if st.ppid == p)
    return out


# --- the server's /metrics -------------------------------------------------------------------------------------

class Metrics:
    """GET /metrics on one kept-alive connection (a new one per scrape would cost the server more)."""

    def __init__(self, url: str) -> None:
        u = urlsplit(url)
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.conn: http.client.HTTPConnection | None = None

    def get(self) -> dict[str, float] | None:
        for _ in range(2):  # once more on a fresh connection when the kept one was closed
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
                self.conn.request("GET", "/metrics")
                r = self.conn.getresponse()
                body = r.read()
                if r.status != 200:
                    return None
                got = parse_metrics(body)  # servescope's scrape: only the families it shows, the rest unread
                return {k: v for k, v in got.items() if isinstance(v, float)}
            except (OSError, http.client.HTTPException):
                self.close()
        return None

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def busy(m: dict[str, float]) -> float:
    return m.get(RUNNING, 0.0) + m.get(WAITING, 0.0)


class Sampler:
    """Every 5 ms the client tree's CPU and the engine's CPU (one thread, CPU clocks); with no engine processes
    (the simulator), every 20 ms the server's running + waiting and generation tokens from /metrics (another
    thread, so a scrape the busy server answers late leaves no hole in the CPU series)."""

    def __init__(self, root: int, url: str, engine: list[int], scrape: bool = True) -> None:
        self.tree = TreeCPU(root)
        self.engine = engine
        self.metrics = Metrics(url)
        self.done = threading.Event()
        self.cpu: list[tuple[float, int]] = []  # (monotonic s, client CPU ns)
        self.engine_cpu: list[tuple[float, int]] = []  # (monotonic s, engine CPU ns)
        self.load: list[tuple[float, float, float]] = []  # (monotonic s, running + waiting, generation tokens)
        self.wakes: list[tuple[float, int]] = []  # (monotonic s, the client's loop thread's voluntary switches)
        self.n = 0
        jobs = [(self.sample_cpu, CPU_SAMPLE_S)] + ([] if engine or not scrape else [(self.sample_load, SAMPLE_S)])
        self.threads = [threading.Thread(target=self.every, args=(fn, dt), name=f"client-cpu-{fn.__name__}",
                                         daemon=True) for fn, dt in jobs]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join()
        self.n = 0
        self.sample_cpu()  # the last value, a whole scan: the root has been reaped by now
        self.metrics.close()

    def sample_cpu(self) -> None:
        t0 = time.monotonic()
        scan = self.n % SCAN_EVERY == 0
        ns = self.tree.scan() if scan else self.tree.quick()
        if scan:
            w = wakeups(self.tree.root)
            if w is not None:
                self.wakes.append((time.monotonic(), w))
        self.n += 1
        if self.engine:
            self.engine_cpu.append((time.monotonic(), sum(cpu_ns(p) or 0 for p in self.engine)))
        self.cpu.append(((t0 + time.monotonic()) / 2, ns))

    def sample_load(self) -> None:
        t0 = time.monotonic()
        m = self.metrics.get()
        if m is not None:
            self.load.append(((t0 + time.monotonic()) / 2, busy(m), m.get(GEN, 0.0)))

    def every(self, fn: Callable[[], None], dt: float) -> None:
        due = time.monotonic()
        while not self.done.is_set():
            fn()
            due += dt
            wait = due - time.monotonic()
            if wait < 0:  # fell behind (a slow scrape, a busy machine): carry on from now rather than burst
                due, wait = time.monotonic(), 0.0
            self.done.wait(wait)

    def first_busy(self) -> float | None:
        """When the server started on the tool's first request: the start of the first interval the engine used
        CPU in (else the first /metrics sample with a request)."""
        if self.engine:
            return next((t0 for (t0, a), (_, b) in zip(self.engine_cpu, self.engine_cpu[1:], strict=False)
                         if b - a >= ENGINE_BUSY_NS), None)
        return next((t for t, b, _ in self.load if b > 0), None)

    def window(self) -> tuple[float, float, int] | None:
        """(start, end, samples) of the server's busy window: from the engine's CPU where it is known (the first
        interval it used CPU in, to the last), else from /metrics (the first and last sample with requests)."""
        if self.engine:
            busy_iv = [(t0, t1) for (t0, a), (t1, b) in zip(self.engine_cpu, self.engine_cpu[1:], strict=False)
                       if b - a >= ENGINE_BUSY_NS]
            # the load is the longest stretch with no idle gap over 1 s (within the load, a low-priority engine
            # core waits for its worker's step without CPU); a lone request before a pause is another stretch
            spans: list[list[float]] = []
            for t0, t1 in busy_iv:
                if spans and t0 - spans[-1][1] <= ENGINE_GAP_S:
                    spans[-1][1] = t1
                    spans[-1][2] += 1
                else:
                    spans.append([t0, t1, 1])
            if not spans:
                return None
            a, b, n = max(spans, key=lambda sp: sp[1] - sp[0])
            return a, b, int(n)
        busy_t = [t for t, b, _ in self.load if b > 0]
        return (busy_t[0], busy_t[-1], len(busy_t)) if busy_t else None


def interp(series: list[tuple[float, int]], t: float) -> float:
    """The value at time t, linear between the samples around it (held flat outside them)."""
    ts = [x for x, _ in series]
    i = bisect.bisect_left(ts, t)
    if i == 0:
        return float(series[0][1])
    if i == len(series):
        return float(series[-1][1])
    (t0, v0), (t1, v1) = series[i - 1], series[i]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0) if t1 > t0 else float(v1)


# --- one client run --------------------------------------------------------------------------------------------

@dataclass
class Run:
    tool: str
    requests: int
    total_s: float  # the whole run's client CPU
    before_s: float = float("nan")  # client CPU before the busy window starts
    load_s: float = float("nan")  # client CPU during the busy window
    window_s: float = float("nan")
    tokens: float = 0.0  # server's generation tokens over the whole run
    stdout: str = ""
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def ms_per_1k(self) -> float:
        return self.load_s * 1e6 / self.tokens if self.tokens else float("nan")

    @property
    def ms_per_s(self) -> float:
        """The client's CPU per second of the load window (ms/s): what it costs while a slow server runs."""
        return self.load_s * 1e3 / self.window_s if self.window_s > 0 else float("nan")

    @property
    def ttft_gap_ms(self) -> float:
        """The tool's mean TTFT minus the server's own (vLLM's TTFT histogram over the run): the client's share."""
        return self.extra.get("ttft_ms", float("nan")) - self.extra.get("server_ttft_ms", float("nan"))


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def settle(m: Metrics, timeout_s: float = 10.0) -> dict[str, float]:
    """/metrics once the server is idle and its token counter has stopped moving (it lags the last token)."""
    deadline = time.monotonic() + timeout_s
    last = m.get() or {}
    while time.monotonic() < deadline:
        time.sleep(0.1)
        cur = m.get() or {}
        if busy(cur) == 0 and cur.get(GEN) == last.get(GEN):
            return cur
        last = cur
    return last


def own_window(sessions: Path) -> tuple[float, float, int] | None:
    """servescope's own load window, from the newest session under `sessions`: its first request sent to its last
    response ended (each record's stamps are CLOCK_MONOTONIC ns, the clock of this script's samples)."""
    import polars as pl

    dirs = sorted((d for d in sessions.iterdir() if (d / "requests").is_dir()), key=lambda d: d.stat().st_mtime)
    if not dirs:
        return None
    df = pl.read_parquet(dirs[-1] / "requests" / "*.parquet", columns=["sent_ns", "end_ns"]).filter(
        pl.col("sent_ns") > 0)
    if df.height == 0:
        return None
    return float(df["sent_ns"].min()) / 1e9, float(df["end_ns"].max()) / 1e9, df.height  # type: ignore[arg-type]


def run_client(tool: str, cmd: list[str], env: dict[str, str] | None, url: str, requests: int, out_len: int,
               out_dir: Path, tag: str, engine: list[int], cwd: Path = ROOT,
               window: Callable[[], tuple[float, float, int] | None] | None = None) -> Run:
    m = Metrics(url)
    before = settle(m)
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out_path, err_path = out_dir / f"{tag}.out", out_dir / f"{tag}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        spawn = time.monotonic()
        cpus = CLIENT_CPUS
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd, start_new_session=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        sampler = Sampler(proc.pid, url, engine, scrape=window is None)
        sampler.start()
        try:
            rc = proc.wait()
        finally:
            if proc.poll() is None:
                kill_group(proc)
            sampler.stop()
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if rc != 0:
        raise SystemExit(f"{tool} failed ({rc}): {shlex.join(cmd)}\n{err_path.read_text(errors='replace')[-3000:]}")
    after = settle(m)
    m.close()
    # the root and everything reaped into it come back exactly through our own wait; orphans only sampled
    total = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime) + sampler.tree.outside / 1e9
    run = Run(tool, requests, total, tokens=after.get(GEN, 0.0) - before.get(GEN, 0.0),
              stdout=out_path.read_text(errors="replace"))
    n_ttft = after.get(TTFT + "_count", 0.0) - before.get(TTFT + "_count", 0.0)
    if n_ttft > 0:
        run.extra["server_ttft_ms"] = (after.get(TTFT + "_sum", 0.0) - before.get(TTFT + "_sum", 0.0)) / n_ttft * 1e3
    expected = requests * out_len
    if abs(run.tokens - expected) > max(out_len, 0.01 * expected):
        print(f"  WARNING: {tool} {tag}: the server generated {run.tokens:.0f} tokens, expected {expected} "
              f"({requests} x {out_len})", file=sys.stderr)
    sampled = sampler.cpu[-1][1] / 1e9 if sampler.cpu else 0.0
    if abs(sampled - total) > 0.1 + 0.05 * total:  # the sampled tree against the kernel's own sum at our wait
        print(f"  WARNING: {tool} {tag}: sampled CPU {sampled:.2f} s, rusage {total:.2f} s", file=sys.stderr)
    first = sampler.first_busy() if window is None else None  # a simulator is busy with the preparation too
    if first is not None and len(sampler.cpu) >= 2:  # exec to the first request reaching the server
        run.extra["first_s"], run.extra["first_cpu_s"] = first - spawn, interp(sampler.cpu, first) / 1e9
    win = window() if window is not None else sampler.window()
    if window is not None:  # the tool's own window: the CPU samples inside it
        run.extra["samples"] = float(len(sampler.cpu))
        run.extra["busy_samples"] = float(sum(win[0] <= t <= win[1] for t, _ in sampler.cpu) if win else 0)
    else:
        run.extra["samples"] = float(len(sampler.engine_cpu) - 1 if engine else len(sampler.load))
        run.extra["busy_samples"] = float(win[2] if win else 0)
    if win and len(sampler.cpu) >= 2:
        start, end, _ = win
        c0, c1 = interp(sampler.cpu, start), interp(sampler.cpu, end)
        run.before_s, run.load_s, run.window_s = c0 / 1e9, (c1 - c0) / 1e9, end - start
        if window is not None and engine and len(sampler.engine_cpu) >= 2 and run.tokens:
            server = interp(sampler.engine_cpu, end) - interp(sampler.engine_cpu, start)
            run.extra["server_ms_per_1k"] = server / 1e6 / run.tokens * 1000
        if len(sampler.wakes) >= 2 and run.tokens:
            run.extra["wakes_per_token"] = (interp(sampler.wakes, end) - interp(sampler.wakes, start)) / run.tokens
    elif out_len > 1 and "warm" not in tag:  # a short warm run may slip between samples
        print(f"  WARNING: {tool} {tag}: no sample saw the server busy", file=sys.stderr)
    return run


# --- the two tools ---------------------------------------------------------------------------------------------

def vllm_bench_cmd(srv: vllm_server.VLLMServer, conc: int, n: int, out_len: int,
                   seed: int) -> list[str]:
    return [str(srv.venv / "bin" / "vllm"), "bench", "serve", "--backend", "vllm", "--base-url", srv.url,
            "--model", srv.model, "--dataset-name", "random", "--random-input-len", str(IN_LEN),
            "--random-output-len", str(out_len), "--num-prompts", str(n), "--max-concurrency", str(conc),
            "--ignore-eos", "--seed", str(seed)]


def servescope_cmd(url: str, conc: int, n: int, out_len: int, seed: int, out_dir: Path,
                   extra: list[str], telemetry: bool = False) -> list[str]:
    wl = out_dir / f"w-{seed}-{out_len}.toml"
    wl.write_text(f'[workload]\nname = "bench"\napi = "completions"\ninput_tokens = {IN_LEN}\n'
                  f"output_tokens = {out_len}\nseed = {seed}\n")
    return [sys.executable, "-m", "servescope", "run", "--url", url, "-w", str(wl), "-c", str(conc),
            "-n", str(n), "--seed", str(seed), *([] if telemetry else ["--telemetry-interval", "off"]), "--json",
            "--sessions-dir", str(out_dir / "sessions"), *extra]


def check_servescope(run: Run) -> None:
    try:
        cells = json.loads(run.stdout.strip().splitlines()[-1])["cells"]
        ok = sum(int(c["requests_ok"]) for c in cells)
        run.extra["out_tok_s"] = float(cells[-1]["output_tok_s"])
        run.extra["ttft_ms"] = float(cells[-1]["ttft_ms"]["mean"])
        tele = (cells[-1].get("client") or {}).get("telemetry_cpu_ms_per_s")
        if tele is not None:
            run.extra["scrape_ms_per_s"] = float(tele)
    except (ValueError, KeyError, IndexError, TypeError):
        print("  WARNING: servescope printed no readable JSON result", file=sys.stderr)
        return
    if ok != run.requests:
        print(f"  WARNING: servescope: {ok} of {run.requests} requests succeeded", file=sys.stderr)


def read_vllm_bench(run: Run) -> None:
    """vllm bench serve's own output tok/s and mean TTFT, from the result it prints."""
    import re

    for key, label in (("out_tok_s", r"Output token throughput \(tok/s\):"), ("ttft_ms", r"Mean TTFT \(ms\):")):
        m = re.search(label + r"\s+([\d.]+)", run.stdout)
        if m:
            run.extra[key] = float(m.group(1))


Runner = Callable[[int, int, int, int, str], Run]  # (concurrency, requests, output tokens, seed, tag) -> Run


def raise_open_files(need: int) -> None:
    """Children inherit the limit: raise the soft one up to the hard one when `need` descriptors do not fit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        new = hard if hard == resource.RLIM_INFINITY else max(soft, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        if hard != resource.RLIM_INFINITY and hard < need:
            print(f"WARNING: the open-files limit ({hard}) is below the {need} this run wants", file=sys.stderr)


def rotated(items: list[tuple[str, Runner]], rnd: int) -> list[tuple[str, Runner]]:
    """Round `rnd`'s order: each tool goes first in turn (two tools: alternating)."""
    k = rnd % len(items)
    return items[k:] + items[:k]


def med(xs: list[float]) -> float:
    xs = [x for x in xs if x == x]  # leave out NaN (a run whose busy window was never seen)
    return statistics.median(xs) if xs else float("nan")


def show(run: Run, label: str, startup_s: float) -> None:
    prep = (run.before_s - startup_s) / run.requests * 1000
    print(f"  {label} {run.tool:<10} window {run.window_s:6.1f} s  tokens {run.tokens:7.0f}  "
          f"load CPU {run.load_s:6.2f} s = {run.ms_per_1k:6.1f} ms/1k tok  before {run.before_s:5.2f} s "
          f"(prep {prep:5.2f} ms/req)  total {run.total_s:6.2f} s  "
          f"[{run.extra.get('busy_samples', 0):.0f} busy of {run.extra.get('samples', 0):.0f} samples]"
          + (f"  simulator {run.extra['server_ms_per_1k']:6.1f} ms/1k tok" if "server_ms_per_1k" in run.extra else "")
          + (f"  wake-ups {run.extra['wakes_per_token']:.3f}/tok" if "wakes_per_token" in run.extra else ""),
          file=sys.stderr)


def startup_runs(tools: dict[str, Runner], rounds: int) -> tuple[dict[str, float], dict[str, tuple[float, float]]]:
    """The whole CPU of a 1-request, 1-output-token run of each tool, and its time and CPU from exec to the request
    reaching the server: medians of `rounds`, each going first in turn."""
    got: dict[str, list[Run]] = {name: [] for name in tools}
    for rnd in range(rounds):
        order = rotated(list(tools.items()), rnd)
        for name, fn in order:
            r = fn(1, 1, 1, 900 + rnd, f"startup-{rnd}")
            got[name].append(r)
            at = (f"; exec to first request {r.extra['first_s']:5.2f} s, {r.extra['first_cpu_s']:5.2f} s CPU"
                  if "first_s" in r.extra else "")  # not timed against the simulator
            print(f"  start-up round {rnd + 1} {name:<10} {r.total_s:6.2f} s CPU{at}", file=sys.stderr)
    first = {name: (med([r.extra.get("first_s", float("nan")) for r in v]),
                    med([r.extra.get("first_cpu_s", float("nan")) for r in v])) for name, v in got.items()}
    return {name: med([r.total_s for r in v]) for name, v in got.items()}, first


def show_first(first: dict[str, tuple[float, float]]) -> None:
    print("exec to the first request reaching the server, 1-request run (wall s, client CPU s): " + ", ".join(
        f"{name} {w:.2f} s, {c:.2f} s CPU" for name, (w, c) in first.items()))


def cpu_model() -> str:
    """lscpu's model name, and whether the CPU has AVX-512 (the CPU vLLM's speed depends on it)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "?"
    name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "?")
    return f"{name}, {'with' if 'avx512f' in out else 'no'} AVX-512"


LOAD_AT_START = os.getloadavg()


def header(args: argparse.Namespace, extra: list[str], alternating: str) -> None:
    print(f"\nclient CPU during the load, {IN_LEN} in / {OUT_LEN} out, ignore_eos; medians of {args.rounds} "
          f"interleaved rounds ({alternating}); {time.strftime('%Y-%m-%d %H:%M')}, "
          f"{os.cpu_count()} cores ({cpu_model()}); load average (1, 5, 15 min) at the start "
          f"{', '.join(f'{x:.2f}' for x in LOAD_AT_START)}, at the end {', '.join(f'{x:.2f}' for x in os.getloadavg())}. "
          "This machine is noisy (shared): read medians and ratios, not single figures.")
    print(f"servescope flags: {shlex.join(extra)}" if extra else "servescope flags: (none beyond those said)")


def main_vllm(args: argparse.Namespace, extra: list[str], tmp: Path) -> None:
    variant = shlex.split(args.variant)
    variant_root = Path(args.variant_checkout).resolve() if args.variant_checkout else ROOT
    if args.variant_checkout:
        import compileall

        compileall.compile_dir(str(variant_root / "servescope"), quiet=1)
    third = bool(variant or args.variant_checkout)  # a third tool in the rotation
    concs = [int(x) for x in args.concurrency.split(",")]
    raise_open_files(max(concs) + 1024)
    print("starting vLLM (tiny dense model, --no-enable-prefix-caching) ...", file=sys.stderr)
    if not args.shared:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = "0"  # the CPU worker's threads on core 0
    srv = vllm_server.start("dense", ["--no-enable-prefix-caching", "--max-model-len", "2048"])
    env = vllm_server.vllm_env(tmp / "scratch")
    engine = engine_pids(srv.proc.pid)
    if not args.shared:
        vllm_server.engine_apart({0})  # see the layouts above
    if args.client_alone:  # the clients on the last core, alone: vLLM, its API server and this script on core 0
        global CLIENT_CPUS
        CLIENT_CPUS = {(os.cpu_count() or 2) - 1}
        server_apart(srv.proc.pid)
        os.sched_setaffinity(0, {0})
    print(f"engine processes (the busy window): {engine}", file=sys.stderr)
    telemetry = [t.strip() for t in args.telemetry.split(",") if t.strip()]
    try:
        def vb(conc: int, n: int, out_len: int, seed: int, tag: str) -> Run:
            r = run_client(VLLM_BENCH, vllm_bench_cmd(srv, conc, n, out_len, seed), env, srv.url, n, out_len,
                           tmp, f"vb-{tag}", engine)
            read_vllm_bench(r)
            return r

        def ss(conc: int, n: int, out_len: int, seed: int, tag: str) -> Run:
            r = run_client(SERVESCOPE, servescope_cmd(srv.url, conc, n, out_len, seed, tmp, extra, telemetry=True),
                           None, srv.url, n, out_len, tmp, f"ss-{tag}", engine)
            check_servescope(r)
            return r

        def so(conc: int, n: int, out_len: int, seed: int, tag: str) -> Run:
            r = run_client(SERVESCOPE_OFF, servescope_cmd(srv.url, conc, n, out_len, seed, tmp, extra), None,
                           srv.url, n, out_len, tmp, f"so-{tag}", engine)
            check_servescope(r)
            return r

        def sv(conc: int, n: int, out_len: int, seed: int, tag: str) -> Run:
            r = run_client(VARIANT, servescope_cmd(srv.url, conc, n, out_len, seed, tmp, [*extra, *variant]), None,
                           srv.url, n, out_len, tmp, f"sv-{tag}", engine, cwd=variant_root)
            check_servescope(r)
            return r

        tools: dict[str, Runner] = {VLLM_BENCH: vb, **({SERVESCOPE: ss} if "on" in telemetry else {}),
                                    **({SERVESCOPE_OFF: so} if "off" in telemetry else {}),
                                    **({VARIANT: sv} if third else {})}
        startup, first = startup_runs(tools, args.rounds)
        results: dict[tuple[str, int], list[Run]] = {}
        seed = 1
        for conc in concs:
            # one untimed warm run so no tool pays for the server's first-shape compile
            so(conc, max(conc, 8), OUT_LEN, 10_000 + conc, f"warm-{conc}")
            for rnd in range(args.rounds):
                order = rotated(list(tools.items()), rnd)
                for name, fn in order:
                    seed += 1
                    r = fn(conc, args.requests, OUT_LEN, seed, f"{conc}-{rnd}")
                    results.setdefault((name, conc), []).append(r)
                    show(r, f"c={conc} round {rnd + 1}", startup[name])
    finally:
        try:
            srv.stop()
        finally:
            try:  # the engine core and anything else vLLM started: its own process group
                os.killpg(srv.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    header(args, extra, "each tool going first in turn")
    what = f"servescope from {variant_root}" if args.variant_checkout else "servescope"
    flags = f" with {shlex.join(variant)}" if variant else ""
    print(f"{args.requests} requests per run; `servescope` samples /metrics every second (its default), `{SERVESCOPE_OFF}` "
          "runs with --telemetry-interval off" + (f"; variant: {what}{flags}" if third else ""))
    print("| c | tool | CPU ms / 1k tok | ratio to vllm bench | CPU ms per s of the window | /metrics scrapes ms CPU/s "
          "| output tok/s (ratio) | mean TTFT ms | TTFT gap over vLLM's own ms (ratio) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for conc in concs:
        base = results[(VLLM_BENCH, conc)]
        a = med([r.ms_per_1k for r in base])
        tok_a = med([r.extra.get("out_tok_s", float("nan")) for r in base])
        gap_a = med([r.ttft_gap_ms for r in base])
        for name in tools:
            runs = results[(name, conc)]
            b = med([r.ms_per_1k for r in runs])
            tok = med([r.extra.get("out_tok_s", float("nan")) for r in runs])
            gap = med([r.ttft_gap_ms for r in runs])
            scrape = med([r.extra.get("scrape_ms_per_s", float("nan")) for r in runs])
            print(f"| {conc} | {name} | {b:,.1f} | {b / a if a else float('nan'):.2f} | "
                  f"{med([r.ms_per_s for r in runs]):,.1f} | {scrape:.2f} | {tok:,.1f} ({tok / tok_a:.2f}) | "
                  f"{med([r.extra.get('ttft_ms', float('nan')) for r in runs]):,.2f} | {gap:,.2f} ({gap / gap_a:.2f}) |")
    print("start-up CPU (whole 1-request, 1-output-token run): " + ", ".join(
        f"{name} {startup[name]:.2f} s" for name in tools))
    show_first(first)
    prep = {name: med([(r.before_s - startup[name]) / r.requests * 1000 for (n, _), runs in results.items()
                       if n == name for r in runs]) for name in tools}
    print("preparation CPU per request (CPU before the busy window minus start-up, over the requests; median of "
          "all runs): " + ", ".join(f"{name} {v:.2f} ms" for name, v in prep.items()))
    print(PREP_NOTE)


def main_sim(args: argparse.Namespace, extra: list[str], tmp: Path) -> None:
    from servescope.sim.launcher import start_sim

    streams = [int(x) for x in args.streams.split(",")]
    raise_open_files(max(streams) + 1024)  # before any child starts: the simulator and clients inherit it
    profile = "max-speed" if (ROOT / "servescope" / "sim" / "profiles" / "max-speed.toml").exists() else "tiny"
    print(f"starting the simulator (profile {profile}) ...", file=sys.stderr)
    results: dict[int, list[Run]] = {}
    with start_sim(profile, ["--no-enable-prefix-caching"]) as sim:
        if args.client_alone:  # the client on the last core alone; the simulator and this script on core 0
            global CLIENT_CPUS
            CLIENT_CPUS = {(os.cpu_count() or 2) - 1}
            server_apart(sim.proc.pid)
            os.sched_setaffinity(0, {0})

        def ss(conc: int, n: int, out_len: int, seed: int, tag: str) -> Run:
            # the simulator's CPU is sampled as an engine's is, for its own CPU per token (not for the window)
            r = run_client(SERVESCOPE, servescope_cmd(sim.url, conc, n, out_len, seed, tmp, extra), None, sim.url,
                           n, out_len, tmp, f"ss-{tag}", [sim.proc.pid], window=lambda: own_window(tmp / "sessions"))
            check_servescope(r)
            return r

        startup, _ = startup_runs({SERVESCOPE: ss}, args.rounds)  # exec to first request: too quick for /metrics
        ss(8, 16, OUT_LEN, 10_000, "warm")  # untimed: the first run of a fresh simulator
        seed = 1
        for rnd in range(args.rounds):
            order = streams if rnd % 2 == 0 else streams[::-1]
            for s in order:
                seed += 1
                r = ss(s, 2 * s, OUT_LEN, seed, f"{s}-{rnd}")
                results.setdefault(s, []).append(r)
                show(r, f"streams={s} round {rnd + 1}", startup[SERVESCOPE])

    header(args, extra, "the order of stream counts reversed every other round")
    where = (f"the simulator and this script on core 0, the client on core {min(CLIENT_CPUS)} (--client-alone)"
             if CLIENT_CPUS else "both where the OS puts them")
    print(f"servescope alone on the simulator (profile {profile}), requests = 2 x streams; {where}")
    print(f"| streams | requests | servescope CPU ms / 1k tok | ratio to {streams[0]} streams | simulator CPU ms / 1k tok "
          f"| ratio | client loop wake-ups per token |")
    print("|---|---|---|---|---|---|---|")

    def fig(runs: list[Run], key: str) -> float:
        return med([r.extra.get(key, float("nan")) for r in runs])

    base = med([r.ms_per_1k for r in results[streams[0]]])
    base_sim = fig(results[streams[0]], "server_ms_per_1k")
    for s in streams:
        v, sv = med([r.ms_per_1k for r in results[s]]), fig(results[s], "server_ms_per_1k")
        print(f"| {s} | {2 * s} | {v:,.1f} | {v / base if base else float('nan'):.2f} | {sv:,.1f} | "
              f"{sv / base_sim if base_sim else float('nan'):.2f} | {fig(results[s], 'wakes_per_token'):.3f} |")
    prep = med([(r.before_s - startup[SERVESCOPE]) / r.requests * 1000 for runs in results.values() for r in runs])
    print(f"start-up CPU (whole 1-request, 1-output-token run): servescope {startup[SERVESCOPE]:.2f} s")
    print(f"preparation CPU per request (median of all runs): servescope {prep:.2f} ms")
    print(PREP_NOTE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="8,32,128")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--servescope-args", default="", help='extra flags for servescope, e.g. "--transport httpx"')
    ap.add_argument("--variant", default="", help='vLLM mode: also run servescope with these extra flags, as a third '
                    'tool in the rotation, e.g. "--transport aiohttp"')
    ap.add_argument("--variant-checkout", default="", metavar="DIR",
                    help="vLLM mode: the variant runs this other checkout's servescope (`python -m servescope` from "
                         "DIR imports DIR's package first), e.g. a worktree of the commit before a change")
    ap.add_argument("--shared", action="store_true",
                    help="vLLM mode: leave vLLM's engine where the OS puts it (default: its engine core and worker on "
                         "core 0 at a lower priority, the API server and the clients on the other cores)")
    ap.add_argument("--client-alone", action="store_true",
                    help="each client on the last core alone, the server (vLLM's engine and API server, or the "
                         "simulator) and this script on core 0: a client with an idle core of its own, as on a large "
                         "GPU host")
    ap.add_argument("--telemetry", default="on,off",
                    help="vLLM mode: run servescope with its default /metrics sampling (on), with --telemetry-interval "
                         "off (off), or both as two tools in the rotation (on,off: the default)")
    ap.add_argument("--sim", action="store_true", help="servescope alone on its simulator at --streams")
    ap.add_argument("--streams", default="512,1024,2048,4096")
    args = ap.parse_args()
    extra = shlex.split(args.servescope_args)
    # servescope's own modules compiled once, as a wheel install does (this checkout is an editable install,
    # and PYTHONDONTWRITEBYTECODE would otherwise make every run compile them again: ~0.1 s of start-up)
    import compileall

    compileall.compile_dir(str(ROOT / "servescope"), quiet=1)
    # a SIGTERM then unwinds through the finally blocks that stop the server and the client
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    tmp = Path(tempfile.mkdtemp(prefix="servescope-client-cpu-"))
    try:
        if args.sim:
            main_sim(args, extra, tmp)
        else:
            main_vllm(args, extra, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

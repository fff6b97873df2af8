"""``simagent bench kernel``: the kernel layer measured side by side in one run (design.md §9.4).

Figures are ratios or rates taken in the same process and run, because these machines
are noisy; nothing here is asserted by tests, which check behaviour instead.

JSON keys are exactly ``roundtrip_ratio``, ``capture_mb_s``, ``peak_rss_growth_mb``,
``interrupt_s``, ``restart_s`` and ``out_grep_rss_growth_mb`` (the kernel's peak RSS
growth while ``_out[n].grep`` scans a 200 MB earlier output). MB means 2**20 bytes of UTF-8 output.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from jupyter_client.manager import KernelManager

from simagent.kernel import Kernel
from simagent.kernel_api.outputs import raw_name, write_record
from simagent.paths import SessionPaths

ROUNDTRIP_RUNS = 200
CAPTURE_SIZES_MB = (10, 100)
#: Size of the earlier output ``_out[n].grep`` scans (the kernel's RSS must not grow with it).
OUT_GREP_MB = 200
RESTART_RUNS = 3

#: Kernel code defining a block of just over 1 MB of tqdm-like bars, coloured logs and
#: warnings; run once as setup, so the timed cell measures capture, not generation.
MIXED_BLOCK_SETUP = r'''
def _simagent_bench_block():
    parts, size, epoch = [], 0, 0
    while size < (1 << 20):
        new = [f"\repoch {epoch:4d}: {i:3d}%|{'█' * (i // 10):<10}| "
               f"{i}/100 [00:01<00:00, 85.31it/s]"
               for i in range(0, 101, 4)]
        new.append("\n")
        new += [f"\x1b[32mINFO\x1b[0m epoch {epoch} step {j}: residual={1.0 / (j + epoch + 1):.6e}"
                " dt=1.0e-02\n" for j in range(8)]
        new.append(f"\x1b[33mWARNING\x1b[0m epoch {epoch}: CFL number 0.93 close to limit\n")
        size += sum(len(p.encode()) for p in new)
        parts += new
        epoch += 1
    return "".join(parts)
_simagent_b = _simagent_bench_block()
'''

#: The timed cell: ``reps`` blocks, then a final line the result must contain.
MIXED_OUTPUT_CODE = ("import sys\nfor _ in range({reps}):\n    sys.stdout.write(_simagent_b)\n"
                     "print(\"\\nDONE final energy=-1.2345\")\n")


def mixed_output_code(n_mb: int) -> str:
    """The timed cell printing ``n_mb`` blocks (run :data:`MIXED_BLOCK_SETUP` first)."""
    return MIXED_OUTPUT_CODE.replace("{reps}", str(n_mb))


def rss_bytes(pid: int | str = "self") -> int | None:
    """Resident memory of ``pid`` (this process by default); None once it is gone."""
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return None


class _PeakRss:
    """Samples this process's RSS every few ms; ``growth_mb`` is peak minus baseline."""

    def __init__(self, interval: float = 0.005, pid: int | str = "self") -> None:
        self.interval = interval
        self.pid = pid
        self.base = rss_bytes(pid) or 0
        self.peak = self.base
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            rss = rss_bytes(self.pid)
            if rss is not None and rss > self.peak:
                self.peak = rss
            self._stop.wait(self.interval)

    def __enter__(self) -> _PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        rss = rss_bytes(self.pid)
        if rss is not None and rss > self.peak:
            self.peak = rss

    @property
    def growth_mb(self) -> float:
        return (self.peak - self.base) / (1 << 20)


def _out_grep_growth(kernel, paths: SessionPaths, n_mb: int) -> float:
    """Peak RSS growth of the *kernel* while ``_out[n].grep`` scans an ``n_mb`` MB output
    (written straight to ``outputs/`` as an earlier execution's): grep must stream."""
    n = 9_999  # past any execution of this bench
    line = "step {:9d} residual=1.234567e-04 dt=1.0e-02 CFL=0.93 T=1234.5678 K\n"
    block = "".join(line.format(i) for i in range(10_000))
    with open(paths.outputs / raw_name(n), "w", encoding="utf-8") as fh:
        for _ in range(-(-(n_mb << 20) // len(block))):
            fh.write(block)
        fh.write("NEEDLE final energy=-1.2345\n")
    write_record(paths.outputs, n, {"n": n, "code": "(bench)", "status": "ok"})
    kernel.execute("import gc; gc.collect()")
    with _PeakRss(pid=kernel.pid) as rss:
        res = kernel.execute(f"print(len(_out[{n}].grep('NEEDLE')))")
    if res.status != "ok" or res.stdout.strip() != "1":
        raise RuntimeError(f"_out grep bench: unexpected result {res.model_text()[:300]!r}")
    return round(rss.growth_mb, 1)


def _bare_roundtrip(km, kc, code: str) -> float:
    """The reference: a minimal jupyter_client loop (execute, iopub until idle, reply)."""
    t0 = time.perf_counter()
    msg_id = kc.execute(code, store_history=True, allow_stdin=False)
    while True:
        msg = kc.get_iopub_msg(timeout=30)
        if (msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "status"
                and msg["content"]["execution_state"] == "idle"):
            break
    while kc.get_shell_msg(timeout=30)["parent_header"].get("msg_id") != msg_id:
        pass
    return time.perf_counter() - t0


def _interrupt_latency(kernel, code: str) -> float:
    """Seconds from ``interrupt()`` to ``execute`` returning, for a cell that would run on."""
    box: dict = {}

    def run() -> None:
        box["result"] = kernel.execute(code)

    th = threading.Thread(target=run)
    th.start()
    while kernel.state != "busy":
        time.sleep(0.005)
    time.sleep(0.5)  # let the cell get going
    t0 = time.perf_counter()
    kernel.interrupt()
    th.join()
    elapsed = time.perf_counter() - t0
    if box["result"].status != "interrupted":
        raise RuntimeError(f"interrupt bench: cell ended {box['result'].status!r}")
    return elapsed


def run_kernel_bench(progress: Callable[[str], None] | None = None,
                     roundtrip_runs: int = ROUNDTRIP_RUNS,
                     capture_sizes_mb: tuple[int, ...] = CAPTURE_SIZES_MB,
                     out_grep_mb: int = OUT_GREP_MB,
                     ) -> tuple[dict, dict]:
    """Run every kernel micro-benchmark: (JSON figures with the six keys, details)."""
    say = progress or (lambda _m: None)
    with tempfile.TemporaryDirectory(prefix="simagent-bench-") as tmp:
        paths = SessionPaths(Path(tmp) / "session")
        kernel = Kernel(paths, cwd=tmp)
        say("starting kernels")
        kernel.start()
        km = KernelManager(kernel_name="python3")
        log = open(paths.root / "bare-kernel.log", "wb")  # noqa: SIM115 - the bare kernel's life
        km.start_kernel(cwd=tmp, stdout=log, stderr=log)
        kc = km.client()
        kc.start_channels()
        kc.wait_for_ready(timeout=60)
        try:
            say(f"round trip: {roundtrip_runs} x 1+1, interleaved")
            ours, bare = [], []
            for _ in range(10):  # warm both
                kernel.execute("1+1")
                _bare_roundtrip(km, kc, "1+1")
            for _ in range(roundtrip_runs):
                t0 = time.perf_counter()
                kernel.execute("1+1")
                ours.append(time.perf_counter() - t0)
                bare.append(_bare_roundtrip(km, kc, "1+1"))
            p50_ours, p50_bare = statistics.median(ours), statistics.median(bare)

            kernel.execute(MIXED_BLOCK_SETUP)
            capture: dict[str, float] = {}
            growth = 0.0
            for n_mb in capture_sizes_mb:
                say(f"capture: {n_mb} MB of progress bars and logs")
                code = mixed_output_code(n_mb)
                with _PeakRss() as rss:
                    t0 = time.perf_counter()
                    res = kernel.execute(code)
                    elapsed = time.perf_counter() - t0
                if res.status != "ok" or "DONE final energy=-1.2345" not in res.stdout:
                    raise RuntimeError(f"capture bench: unexpected result {res.status!r}")
                printed = res.raw_path.stat().st_size if res.raw_path else 0
                capture[f"{n_mb}MB"] = round(printed / (1 << 20) / elapsed, 1)
                growth = round(rss.growth_mb, 1)  # reported for the largest run

            say(f"_out grep: {out_grep_mb} MB output, kernel RSS")
            grep_growth = _out_grep_growth(kernel, paths, out_grep_mb)

            say("interrupt: busy loop and sleep")
            interrupt = {
                "busy_loop": round(_interrupt_latency(kernel, "while True:\n    pass"), 3),
                "sleep": round(_interrupt_latency(kernel, "import time\ntime.sleep(100)"), 3),
            }
            say("restart")
            restarts = [kernel.restart() for _ in range(RESTART_RUNS)]
        finally:
            kernel.shutdown()
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            log.close()
    return {
        "roundtrip_ratio": round(p50_ours / p50_bare, 3),
        "capture_mb_s": capture,
        "peak_rss_growth_mb": growth,
        "interrupt_s": interrupt,
        "restart_s": round(statistics.median(restarts), 3),
        "out_grep_rss_growth_mb": grep_growth,
    }, {"p50_ms": {"simagent": round(p50_ours * 1e3, 2),
                   "jupyter_client": round(p50_bare * 1e3, 2)}}


#: Goals from the kernel issue; the table marks each figure against its goal.
GOALS = {
    "roundtrip_ratio": ("<=", 1.2),
    "capture_mb_s": (">=", 50.0),
    "peak_rss_growth_mb": ("<=", 64.0),
    "interrupt_s": ("<=", 1.0),
    "restart_s": ("<=", 2.0),
    "out_grep_rss_growth_mb": ("<=", 50.0),  # issue 15: _out[n].grep on a 200 MB output
}


def _meets(op: str, value: float, goal: float) -> bool:
    return value <= goal if op == "<=" else value >= goal


def format_table(results: dict, detail: dict | None = None) -> str:
    rows = []
    for key, (op, goal) in GOALS.items():
        value = results[key]
        items = value.items() if isinstance(value, dict) else [("", value)]
        for sub, v in items:
            name = f"{key} [{sub}]" if sub else key
            mark = "ok" if _meets(op, v, goal) else "MISSED"
            rows.append((name, f"{v:g}", f"{op} {goal:g}", mark))
    p50 = (detail or {}).get("p50_ms", {})
    w = max(len(r[0]) for r in rows)
    lines = [f"{'metric':<{w}}  {'value':>9}  {'goal':>8}", "-" * (w + 25)]
    lines += [f"{n:<{w}}  {v:>9}  {g:>8}  {m}" for n, v, g, m in rows]
    if p50:
        lines.append(f"(1+1 p50: simagent {p50['simagent']} ms, "
                     f"bare jupyter_client {p50['jupyter_client']} ms)")
    return "\n".join(lines)


__all__ = ["format_table", "mixed_output_code", "run_kernel_bench"]

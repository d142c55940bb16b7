"""Peak memory of one benchmark case, measured in isolation.

CPU: each case runs in its own process, forked from a small server that has imported torch and
nothing else has run in: build the case, run one warm-up call (which also counts its FLOPs and
bytes, see :mod:`primal_attention.bench.counters`), read the resident set size (the idle
baseline: model, inputs, optimiser state, library buffers), reset the kernel's high-water mark
(``/proc/self/clear_refs``), run one call and read the high-water mark again. The server runs
with glibc's mmap threshold fixed at 64 KiB, so every tensor buffer is its own mapping and leaves
the RSS when freed; the figure is therefore "peak RSS minus the idle baseline" of one call.

CUDA: in the benchmark process, ``torch.cuda.max_memory_allocated`` minus the memory allocated
before the call, after one warm-up call.
"""

from __future__ import annotations

import gc
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from typing import Any

CPU_METHOD = (
    "peak RSS minus idle RSS of one call, in a fresh forked process (glibc mmap threshold 64 KiB), "
    "after one warm-up call"
)
CUDA_METHOD = "torch.cuda.max_memory_allocated minus allocated before the call, after one warm-up call"


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field in KiB (``VmRSS``: the resident set now; ``VmHWM``: its high-water mark)."""
    with open("/proc/self/status") as fh:
        match = re.search(rf"^{field}:\s+(\d+) kB", fh.read(), re.MULTILINE)
    if match is None:
        raise RuntimeError(f"/proc/self/status has no {field}")
    return int(match.group(1))


def measure_case(case_dict: dict[str, Any], *, count_ops: bool = True) -> dict[str, Any]:
    """Build and run one case here; on CPU the caller is a fresh process (see :class:`MemoryServer`)."""
    import torch

    from primal_attention.bench.counters import count
    from primal_attention.bench.workloads import Case, build

    case = Case(**case_dict)
    step = build(case)
    result: dict[str, Any] = {}
    t0 = time.perf_counter()
    if count_ops and case.mode == "eager":
        result.update(count(step))
    else:
        step()
    result["warmup_s"] = time.perf_counter() - t0
    gc.collect()
    if case.device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        result["call_s"] = time.perf_counter() - t0
        result["memory_bytes"] = int(torch.cuda.max_memory_allocated() - base)
        result["memory_method"] = CUDA_METHOD
        return result
    base = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM to the current RSS
    t0 = time.perf_counter()
    step()
    result["call_s"] = time.perf_counter() - t0
    result["memory_bytes"] = int((status_kib("VmHWM") - base) * 1024)
    result["idle_rss_bytes"] = int(base * 1024)
    result["memory_method"] = CPU_METHOD
    return result


class MemoryServer:
    """A subprocess that forks one child per measured case (CPU only)."""

    def __init__(self, threads: int | None = None) -> None:
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="131072")
        cmd = [sys.executable, "-m", "primal_attention.bench.memory"]
        if threads:
            cmd += ["--threads", str(threads)]
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True, env=env, bufsize=1
        )
        ready = self._read(120.0)
        if ready is None or ready.get("ready") is not True:
            self.close()
            raise RuntimeError(f"memory server did not start: {ready}")

    def _read(self, timeout: float) -> dict[str, Any] | None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def measure(self, case_dict: dict[str, Any], *, count_ops: bool, timeout_s: float) -> dict[str, Any]:
        """{"memory_bytes", "flops", ...} or {"error": why}."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"case": case_dict, "count_ops": count_ops, "timeout_s": timeout_s}) + "\n")
        self.proc.stdin.flush()
        reply = self._read(timeout_s + 60.0)
        if reply is None:
            self.close()
            raise RuntimeError("memory server stopped answering")
        return reply

    def close(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> MemoryServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _child(request: dict[str, Any], threads: int | None, write_fd: int) -> None:
    try:
        import torch

        if threads:
            torch.set_num_threads(threads)
        result = measure_case(request["case"], count_ops=request["count_ops"])
    except Exception as err:  # noqa: BLE001 - reported to the parent, which marks the case
        result = {"error": f"{type(err).__name__}: {err}"}
    with os.fdopen(write_fd, "w") as fh:
        fh.write(json.dumps(result))


def _wait_child(pid: int, read_fd: int, timeout_s: float) -> dict[str, Any]:
    chunks = []
    deadline = time.monotonic() + timeout_s
    with os.fdopen(read_fd) as fh:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return {"error": f"over the time budget ({timeout_s:.0f} s) while measuring memory", "timeout": True}
            ready, _, _ = select.select([fh], [], [], left)
            if ready:
                data = fh.read()
                chunks.append(data)
                break
    _, status = os.waitpid(pid, 0)
    text = "".join(chunks)
    if text:
        return json.loads(text)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        why = " (out of memory?)" if sig == signal.SIGKILL else ""
        return {"error": f"killed by signal {sig}{why}", "killed": True}
    return {"error": f"measurement process exited with status {os.WEXITSTATUS(status)}"}


def serve(threads: int | None) -> None:
    """Answer one JSON request per stdin line with one JSON line; the protocol owns the real stdout."""
    import torch  # noqa: F401 - imported once here, shared by every forked child

    import primal_attention  # noqa: F401 - registers the attentions

    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything the cases print goes to stderr
    proto.write(json.dumps({"ready": True}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_fd)
            _child(request, threads, write_fd)
            os._exit(0)
        os.close(write_fd)
        proto.write(json.dumps(_wait_child(pid, read_fd, float(request["timeout_s"]))) + "\n")


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="memory measurement server of primal bench (internal)")
    parser.add_argument("--threads", type=int, default=None)
    serve(parser.parse_args().threads)

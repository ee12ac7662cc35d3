"""Sandboxed execution of untrusted candidate code: a pool of pre-started fork-servers.

    pool = SandboxPool(SandboxConfig(workers=2))
    result = pool.call(files, [("pkg.util", "clamp", [5, 0, 3])])
    result.status, result.calls[0].value          # "ok", 3
    pool.close()

How an evaluation is contained (details in `sandbox_server.py`, design notes in
docs/sandbox.md): the candidate runs as a non-root uid with no capabilities and
no_new_privs, in fresh pid / mount / network / ipc / uts namespaces, over a
read-only host filesystem with private size-bounded tmpfs on /tmp, $HOME,
/dev/shm and every masked path, under rlimits (CPU soft = hard, address space,
file size, open files, processes) and a per-worker pids cgroup; a wall-clock
deadline kills its pid namespace (and every process in it). The candidate only
ever sees its own files and the *inputs* of the calls made to it; it answers
with literal values over a pipe. Expected outputs never enter the sandbox
(`call` mode) or stay in the trusted harness process (`check` mode, HumanEval).
Each result carries a per-run secret that the candidate never sees.

Where the kernel refuses namespaces, the pool warns once, counts it in
`stats["fallbacks"]` and runs with rlimits only -- or raises if
`require_isolation` is set.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import hashlib
import json
import logging
import os
import queue
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from typing import Any

from gagar_jax.configlib import check, check_positive_ints
from gagar_jax.envs import sandbox_server as wire

_SERVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sandbox_server.py")
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_masked_paths() -> tuple[str, ...]:
  """Host paths hidden behind an empty tmpfs inside the sandbox."""
  paths = {"/root", "/home", "/work", "/srv", "/mnt", "/media", "/opt", "/var/tmp", _REPO}
  paths.add(os.path.expanduser("~"))
  return tuple(sorted(paths))


# Jobs remembered by the pools of rollouts (`SandboxConfig.for_rollouts`): a few steps' worth.
ROLLOUT_MEMO_ENTRIES = 4096


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
  """Pool size, isolation and per-evaluation limits (experiment configs set `workers`
  through `sandbox_workers`; the limits keep these defaults)."""

  workers: int = 2
  isolate: bool = True
  require_isolation: bool = False
  cpu_s: int = 5
  wall_s: float = 10.0
  memory_mb: int = 512
  fsize_mb: int = 8
  nofile: int = 64
  nproc: int = 32
  tmpfs_mb: int = 32
  uid_base: int = 61000
  masked_paths: tuple[str, ...] = dataclasses.field(default_factory=default_masked_paths)
  # Interpreter for the fork-servers; "" = /usr/bin/python3 when present (its stdlib
  # is readable by the sandbox's uid), else this interpreter.
  interpreter: str = ""
  # Answer a job identical to one already run (same files, same calls or check) with
  # that run's result, for up to this many recent jobs (0: every job runs). Only `ok`
  # results are kept; identical jobs in flight at once run once. The episodes of a
  # group often test the same files (the task as given, the same one-line fix): in
  # `make run` about half of the jobs repeat one (results/performance.md, section 13).
  # A candidate whose answers depend on time or randomness gets its first answer again.
  memo_entries: int = 0

  @classmethod
  def for_rollouts(cls, workers: int) -> SandboxConfig:
    """The pools of RL, SFT and evaluation runs: `workers` workers, repeated jobs answered
    from the memo (`memo_entries`)."""
    return cls(workers=workers, memo_entries=ROLLOUT_MEMO_ENTRIES)

  def __post_init__(self):
    check_positive_ints(
      self, ("workers", "cpu_s", "memory_mb", "fsize_mb", "nofile", "nproc", "tmpfs_mb")
    )
    check(self.memo_entries >= 0, "memo_entries", f"must be >= 0, got {self.memo_entries}")
    check(self.wall_s > 0, "wall_s", f"must be > 0, got {self.wall_s}")
    check(
      self.uid_base >= 1000, "uid_base", f"must be a non-system uid >= 1000, got {self.uid_base}"
    )


@dataclasses.dataclass
class CallResult:
  ok: bool
  value: Any = None
  error: str = ""


@dataclasses.dataclass
class SandboxResult:
  """Outcome of one evaluation. `status`: ok | timeout | crashed | refused | error."""

  status: str
  calls: list[CallResult] = dataclasses.field(default_factory=list)
  passed: bool = False  # check mode only
  detail: str = ""
  isolation: str = ""
  elapsed_s: float = 0.0


class SandboxError(RuntimeError):
  pass


def _interpreter(cfg: SandboxConfig) -> str:
  if cfg.interpreter:
    return cfg.interpreter
  system = "/usr/bin/python3"
  if os.path.exists(system):
    probe = subprocess.run(
      [system, "-c", "import sys; print(sys.version_info >= (3, 10))"],
      capture_output=True,
      text=True,
    )
    if probe.stdout.strip() == "True":
      return system
  return sys.executable


class _Worker:
  """One fork-server process and the socket to it."""

  def __init__(self, worker_id: int, cfg: SandboxConfig, server_cfg: dict, interpreter: str):
    self.worker_id = worker_id
    parent, child = socket.socketpair()
    self.sock = parent
    self.proc = subprocess.Popen(
      [interpreter, "-I", _SERVER, str(worker_id), json.dumps(server_cfg), str(child.fileno())],
      pass_fds=[child.fileno()],
      env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
      stdin=subprocess.DEVNULL,
      stdout=subprocess.DEVNULL,
      # GAGAR_SANDBOX_DEBUG=1 shows the servers' tracebacks on this process's stderr.
      stderr=None if server_cfg.get("debug") else subprocess.DEVNULL,
      start_new_session=True,
    )
    child.close()
    self.sock.settimeout(30)
    hello = b""
    while not hello.endswith(b"\n"):
      chunk = self.sock.recv(4096)
      if not chunk:
        raise SandboxError(f"sandbox worker {worker_id} failed to start (exit {self.proc.wait()})")
      hello += chunk
    self.cgroup = json.loads(hello).get("cgroup")

  def alive(self) -> bool:
    return self.proc.poll() is None

  def run(self, job: dict, timeout: float) -> dict:
    job_r, job_w = os.pipe()
    res_r, res_w = os.pipe()
    try:
      socket.send_fds(self.sock, [b"J"], [job_r, res_w])
    finally:
      os.close(job_r)
      os.close(res_w)
    writer = threading.Thread(target=self._write_job, args=(job_w, job), daemon=True)
    writer.start()
    harness_pid = None
    try:
      self.sock.settimeout(10)
      harness_pid = struct.unpack("<I", self._recv_exact(4))[0]
      try:
        result = wire.recv_msg(res_r, time.monotonic() + timeout, limit=64 << 20)
      except (TimeoutError, EOFError, ValueError) as e:
        result = {
          "status": "timeout" if isinstance(e, TimeoutError) else "error",
          "detail": f"harness: {type(e).__name__}",
        }
        self._kill(harness_pid)
      self.sock.settimeout(timeout + 10)
      if self._recv_exact(1) != b"D":
        raise SandboxError("worker protocol error")
      return result
    finally:
      os.close(res_r)
      writer.join(timeout=1)

  @staticmethod
  def _write_job(fd, job):
    try:
      wire.send_msg(fd, job)
    except OSError:
      pass
    finally:
      os.close(fd)

  def _recv_exact(self, n):
    data = b""
    while len(data) < n:
      chunk = self.sock.recv(n - len(data))
      if not chunk:
        raise SandboxError(f"sandbox worker {self.worker_id} died")
      data += chunk
    return data

  @staticmethod
  def _kill(pid):
    if pid:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass

  def close(self):
    try:
      self.sock.close()
    finally:
      if self.alive():
        self.proc.kill()
      self.proc.wait()
      if self.cgroup:
        try:
          os.rmdir(self.cgroup)
        except OSError:
          pass


class SandboxPool:
  """Evaluates untrusted candidates in parallel; dead workers are replaced."""

  def __init__(self, config: SandboxConfig | None = None):
    self.config = config or SandboxConfig()
    self._interpreter = _interpreter(self.config)
    self._fallback_dir = tempfile.mkdtemp(prefix="gagar-sandbox-")
    os.chmod(self._fallback_dir, 0o700)
    self._lock = threading.Lock()
    self.stats = {
      "evaluations": 0,
      "fallbacks": 0,
      "timeouts": 0,
      "crashes": 0,
      "errors": 0,
      "worker_restarts": 0,
      "memo_hits": 0,
    }
    self._memo: collections.OrderedDict[str, futures.Future] = collections.OrderedDict()
    self._warned = False
    isolate = self.config.isolate and os.geteuid() == 0
    if self.config.isolate and not isolate:
      self._fallback_warning("not running as root: namespaces and uid drop are unavailable")
    self._isolate = isolate
    self._free: queue.Queue[_Worker] = queue.Queue()
    self._workers = [self._start(i) for i in range(self.config.workers)]
    for w in self._workers:
      self._free.put(w)
    self._executor = futures.ThreadPoolExecutor(self.config.workers)
    self._closed = False

  def _server_cfg(self, worker_id: int) -> dict:
    c = self.config
    masked = [p for p in c.masked_paths if not self._interpreter.startswith(p.rstrip("/") + "/")]
    return {
      "isolate": self._isolate,
      "require_isolation": c.require_isolation,
      "uid": c.uid_base + worker_id,
      "tmpfs_mb": c.tmpfs_mb,
      "masked_paths": masked,
      "fallback_dir": self._fallback_dir,
      "debug": bool(os.environ.get("GAGAR_SANDBOX_DEBUG")),
      "limits": {
        "cpu_s": c.cpu_s,
        "wall_s": c.wall_s,
        "memory_mb": c.memory_mb,
        "fsize_mb": c.fsize_mb,
        "nofile": c.nofile,
        "nproc": c.nproc,
      },
    }

  def _start(self, worker_id: int) -> _Worker:
    if self.config.require_isolation and not self._isolate:
      raise SandboxError("isolation required but unavailable (the pool must run as root)")
    return _Worker(worker_id, self.config, self._server_cfg(worker_id), self._interpreter)

  def _replace(self, worker: _Worker) -> _Worker:
    worker.close()
    with self._lock:
      self.stats["worker_restarts"] += 1
    fresh = self._start(worker.worker_id)
    self._workers[worker.worker_id] = fresh
    return fresh

  def _fallback_warning(self, why: str):
    with self._lock:
      self.stats["fallbacks"] += 1
      if not self._warned:
        self._warned = True
        logging.warning("sandbox running WITHOUT full isolation: %s", why)
        if self.config.require_isolation:
          raise SandboxError(f"isolation required but unavailable: {why}")

  def _run_job(self, job: dict) -> SandboxResult:
    if self._closed:
      raise SandboxError("pool is closed")
    if not self.config.memo_entries:
      return self._run_fresh(job)
    key = hashlib.sha256(json.dumps(job, sort_keys=True).encode()).hexdigest()
    with self._lock:
      known = self._memo.get(key)
      if known is None:
        self._memo[key] = mine = futures.Future()
        while len(self._memo) > self.config.memo_entries:
          self._memo.popitem(last=False)
      else:
        self._memo.move_to_end(key)
        self.stats["memo_hits"] += 1
    if known is not None:
      return copy.deepcopy(known.result())
    try:
      result = self._run_fresh(job)
    except BaseException as e:
      with self._lock:
        self._memo.pop(key, None)
      mine.set_exception(e)
      raise
    if result.status != "ok":  # kept for the jobs waiting on it, then forgotten
      with self._lock:
        self._memo.pop(key, None)
    mine.set_result(result)
    return copy.deepcopy(result)

  def _run_fresh(self, job: dict) -> SandboxResult:
    secret = secrets.token_hex(16)
    job = dict(job, secret=secret, limits=self._server_cfg(0)["limits"])
    worker = self._free.get()
    try:
      if not worker.alive():  # died between jobs: replace it before use
        worker = self._replace(worker)
      try:
        raw = worker.run(job, self.config.wall_s + 5)
      except (SandboxError, OSError) as e:
        raw = {"status": "error", "detail": f"worker died: {e}"}
      if not worker.alive():
        worker = self._replace(worker)
    finally:
      self._free.put(worker)
    return self._check_result(raw, secret)

  def _check_result(self, raw: dict, secret: str) -> SandboxResult:
    status = raw.get("status", "error")
    if status in ("ok", "timeout", "crashed") and raw.get("secret") != secret:
      status, raw = "error", {"detail": "result without the run's secret"}
    if raw.get("warning"):
      self._fallback_warning(raw["warning"])
    elif raw.get("isolation") == "fallback" and self._isolate:
      self._fallback_warning("namespaces refused by the kernel")
    if status == "refused":
      raise SandboxError(f"isolation required but refused: {raw.get('detail')}")
    with self._lock:
      self.stats["evaluations"] += 1
      key = {"timeout": "timeouts", "crashed": "crashes", "error": "errors"}.get(status)
      if key:
        self.stats[key] += 1
    calls = [
      CallResult(True, wire.decode(r["value"]))
      if r.get("ok")
      else CallResult(False, None, r["error"])
      for r in raw.get("results", [])
    ]
    return SandboxResult(
      status=status,
      calls=calls,
      passed=bool(raw.get("passed", False)) and status == "ok",
      detail=raw.get("detail", ""),
      isolation=raw.get("isolation", ""),
      elapsed_s=float(raw.get("elapsed_s", 0.0)),
    )

  def call(self, files: dict[str, str], calls: Sequence[tuple[str, str, list]]) -> SandboxResult:
    """Imports the candidate's `files` in a sandbox and makes `calls` (module, func, args).

    Returns one `CallResult` per call, in order; calls after a crash or timeout fail.
    """
    job = {
      "files": dict(files),
      "calls": [{"module": m, "func": f, "args": wire.encode(list(a))} for m, f, a in calls],
    }
    return self._run_job(job)

  def check(
    self, files: dict[str, str], *, prompt: str, test: str, entry_point: str, module: str
  ) -> SandboxResult:
    """HumanEval-style: trusted `check(candidate)` from `test` against `module.entry_point`."""
    job = {
      "files": dict(files),
      "check": {"prompt": prompt, "test": test, "entry_point": entry_point, "module": module},
    }
    return self._run_job(job)

  def submit(self, fn, *args) -> futures.Future:
    """Runs `fn(*args)` (which uses this pool) on the pool's threads; returns a future."""
    return self._executor.submit(fn, *args)

  def map(self, fn, items):
    """Runs `fn(item)` (which uses this pool) for every item, workers in parallel."""
    return list(self._executor.map(fn, items))

  def close(self):
    if self._closed:
      return
    self._closed = True
    self._executor.shutdown(wait=True)
    for w in self._workers:
      w.close()
    shutil.rmtree(self._fallback_dir, ignore_errors=True)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()

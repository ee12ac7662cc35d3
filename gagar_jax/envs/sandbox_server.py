"""The sandbox's fork-server: a standalone, standard-library-only script.

Started by `gagar_jax.envs.sandbox.SandboxPool` with the system interpreter, as
root, in isolated mode (`python3 -I sandbox_server.py WORKER_ID CONFIG_JSON`),
one per worker. It never reads a job: for each job it receives two pipe file
descriptors from the pool over a Unix socket and forks. The process tree of
one evaluation is:

  server (pre-started, holds no job data)
   `- C  harness (root, trusted): forks P *before* reading the job, so nothing of
         the job is in any heap the candidate inherits; reads the job; drives the
         candidate over an RPC pipe; writes the result with the per-run secret.
       `- P  watcher (root): unshares pid/mount/net/ipc/uts namespaces, forks Q,
             reports Q's pid to C, waits for Q.
           `- Q  pid 1 of the new namespace: read-only host filesystem, private
                 size-bounded tmpfs over /tmp, $HOME, /dev/shm and masked paths,
                 fresh /proc; writes the candidate's files into its workspace;
                 rlimits; drops to a worker-specific non-root uid with no
                 capabilities and no_new_privs; then imports and calls the
                 candidate's functions on request. When Q dies the kernel kills
                 every process left in its pid namespace.

The hidden expectations never enter C for call-mode jobs (the pool compares
results itself); check-mode jobs (HumanEval) run the benchmark's trusted check
code in C against a proxy that forwards each call to Q. Values cross the RPC
pipe as tagged JSON (literals only), so a candidate cannot hand the harness an
object with a forged `__eq__`.

Where the kernel refuses namespaces (e.g. not root), Q runs with rlimits and a
new session only, and the result says `isolation: "fallback"`.
"""

import ctypes
import errno
import importlib
import json
import math
import os
import resource
import select
import shutil
import signal
import socket
import struct
import sys
import time
import traceback

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER, PR_SET_NO_NEW_PRIVS = 1, 36, 38

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]


def _check(rc, what):
  if rc != 0:
    e = ctypes.get_errno()
    raise OSError(e, f"{what}: {os.strerror(e)}")


def _prctl(option, value):
  _check(_libc.prctl(option, ctypes.c_ulong(value), 0, 0, 0), f"prctl({option})")


def _mount(source, target, fstype, flags, data=None):
  enc = lambda s: None if s is None else s.encode()
  _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


# ---------------------------------------------------------------- framing + values


def send_msg(fd, obj):
  data = json.dumps(obj, separators=(",", ":")).encode()
  payload = struct.pack("<I", len(data)) + data
  view = memoryview(payload)
  while view:
    n = os.write(fd, view)
    view = view[n:]


def _read_exact(fd, n, deadline):
  chunks, got = [], 0
  while got < n:
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise TimeoutError
    chunk = os.read(fd, n - got)
    if not chunk:
      raise EOFError
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def recv_msg(fd, deadline=None, limit=64 << 20):
  (size,) = struct.unpack("<I", _read_exact(fd, 4, deadline))
  if size > limit:
    raise ValueError(f"message of {size} bytes exceeds {limit}")
  return json.loads(_read_exact(fd, size, deadline))


def encode(obj, depth=0):
  """Python literal -> tagged JSON. Raises TypeError for anything else."""
  if depth > 100:
    raise ValueError("value nested too deeply")
  if obj is None or isinstance(obj, bool | str):
    return obj
  if isinstance(obj, int):
    return {"i": str(obj)} if abs(obj) > 2**53 else obj
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else {"f": repr(obj)}
  if type(obj) in (list, tuple, set, frozenset):
    tag = {list: "l", tuple: "t", set: "s", frozenset: "z"}[type(obj)]
    return {tag: [encode(x, depth + 1) for x in obj]}
  if type(obj) is dict:
    return {"d": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in obj.items()]}
  raise TypeError(f"unsupported value of type {type(obj).__name__}")


def decode(obj):
  if not isinstance(obj, dict):
    return obj
  ((tag, v),) = obj.items()
  if tag == "i":
    return int(v)
  if tag == "f":
    return float(v)
  if tag == "d":
    return {decode(k): decode(x) for k, x in v}
  items = [decode(x) for x in v]
  return {"l": list, "t": tuple, "s": set, "z": frozenset}[tag](items)


# ---------------------------------------------------------------- Q: the candidate


def _setup_filesystem(cfg):
  """Inside the new mount + pid namespace, still root."""
  _mount(None, "/", None, MS_REC | MS_PRIVATE)
  # Read-only host: every existing mount, remounted read-only through a bind.
  mounts = []
  with open("/proc/self/mountinfo") as f:
    for line in f:
      mounts.append(line.split()[4].encode().decode("unicode_escape"))
  for target in sorted(set(mounts), key=len):
    if target.startswith("/proc") or target.startswith("/sys/fs/cgroup"):
      continue
    try:
      _mount(target, target, None, MS_BIND | MS_REC)
      _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID)
    except OSError:
      if target == "/":
        raise
  flags = MS_NOSUID | MS_NODEV
  _mount("tmpfs", "/tmp", "tmpfs", flags, f"size={cfg['tmpfs_mb']}m,mode=1777")
  _mount("tmpfs", "/dev/shm", "tmpfs", flags | MS_NOEXEC, "size=8m,mode=1777")
  for path in cfg["masked_paths"]:
    if os.path.isdir(path):
      _mount("tmpfs", path, "tmpfs", flags | MS_NOEXEC, "size=1m,mode=755")
  _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)


def _set_limits(limits, uid_nonroot):
  lim = [
    (resource.RLIMIT_CPU, limits["cpu_s"]),
    (resource.RLIMIT_AS, limits["memory_mb"] << 20),
    (resource.RLIMIT_FSIZE, limits["fsize_mb"] << 20),
    (resource.RLIMIT_NOFILE, limits["nofile"]),
    (resource.RLIMIT_CORE, 0),
  ]
  if uid_nonroot:
    lim.append((resource.RLIMIT_NPROC, limits["nproc"]))
  for which, value in lim:
    resource.setrlimit(which, (value, value))


def _candidate_main(cfg, job_files_fd, rpc_in, rpc_out, isolated):
  """Q. Never returns."""
  try:
    os.setsid()
    home = "/tmp/home"
    workspace = "/tmp/ws"
    if isolated:
      _setup_filesystem(cfg)
    else:
      workspace = os.path.join(cfg["fallback_dir"], f"ws-{os.getpid()}")
      home = workspace + "-home"
    for d in (workspace, home):
      os.makedirs(d, exist_ok=True)
    uid = cfg["uid"]
    files = recv_msg(job_files_fd, time.monotonic() + 30)
    os.close(job_files_fd)
    for rel, src in files.items():
      path = os.path.normpath(os.path.join(workspace, rel))
      if not path.startswith(workspace + os.sep):
        continue
      os.makedirs(os.path.dirname(path), exist_ok=True)
      with open(path, "w") as f:
        f.write(src)
    del files
    if isolated:
      for root, dirs, names in os.walk(workspace):
        for n in dirs + names:
          os.chown(os.path.join(root, n), uid, uid)
      os.chown(workspace, uid, uid)
      os.chown(home, uid, uid)
    # Keep only the RPC pipe; stdio to /dev/null (prints are discarded).
    null = os.open("/dev/null", os.O_RDWR)
    for fd in (0, 1, 2):
      os.dup2(null, fd)
    keep = sorted({0, 1, 2, rpc_in, rpc_out})
    prev = 2
    for fd in keep[3:]:
      os.closerange(prev + 1, fd)
      prev = fd
    os.closerange(prev + 1, 1 << 16)
    os.environ.clear()
    os.environ.update({"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8"})
    os.chdir(workspace)
    sys.path[:] = [workspace] + [p for p in sys.path if p and not p.startswith(workspace)]
    _set_limits(cfg["limits"], isolated)
    if isolated:
      os.setgroups([])
      os.setresgid(uid, uid, uid)
      os.setresuid(uid, uid, uid)
      _prctl(PR_SET_NO_NEW_PRIVS, 1)
    # Re-armed after the uid change (which clears it): die with the watcher.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    sys.setrecursionlimit(2000)
  except BaseException:
    if cfg.get("debug"):
      traceback.print_exc()
    os._exit(70)
  _serve_calls(rpc_in, rpc_out)


def _serve_calls(rpc_in, rpc_out):
  send_msg(rpc_out, {"ready": True})
  while True:
    try:
      msg = recv_msg(rpc_in, None, limit=16 << 20)
    except BaseException:
      os._exit(0)
    if msg.get("op") != "call":
      os._exit(0)
    try:
      fn = getattr(importlib.import_module(msg["module"]), msg["func"])
      value = fn(*decode(msg["args"]))
      reply = {"ok": True, "value": encode(value)}
      if len(json.dumps(reply)) > 1 << 20:
        reply = {"ok": False, "error": "result larger than 1 MiB"}
    except BaseException as e:  # the candidate's own failure, reported, never fatal
      try:
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"[:300]}
      except BaseException:
        reply = {"ok": False, "error": "exception"}
    send_msg(rpc_out, reply)


# ---------------------------------------------------------------- P and C


def _watcher_main(cfg, files_r, rpc_in, rpc_out, report_w):
  """P: unshare, fork Q, report its pid (and the isolation level), wait."""
  _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
  isolated = cfg["isolate"]
  if isolated:
    try:
      _check(
        _libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS),
        "unshare",
      )
    except OSError as e:
      if cfg["require_isolation"]:
        os.write(report_w, json.dumps({"error": str(e)}).encode() + b"\n")
        os._exit(71)
      isolated = False
      os.write(report_w, json.dumps({"warning": f"namespaces refused: {e}"}).encode() + b"\n")
  q = os.fork()
  if q == 0:
    os.close(report_w)
    _candidate_main(cfg, files_r, rpc_in, rpc_out, isolated)
  os.write(report_w, json.dumps({"pid": q, "isolated": isolated}).encode() + b"\n")
  os.close(report_w)
  for fd in (files_r, rpc_in, rpc_out):
    os.close(fd)
  _, status = os.waitpid(q, 0)
  os._exit(0)


def _kill_tree(q_pid, isolated):
  try:
    if isolated:
      os.kill(q_pid, signal.SIGKILL)  # pid 1 of its namespace: takes all with it
    else:
      os.killpg(q_pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


class _Candidate:
  """C's handle on Q: RPC calls under one wall-clock deadline."""

  def __init__(self, rpc_w, rpc_r, deadline):
    self.rpc_w, self.rpc_r, self.deadline = rpc_w, rpc_r, deadline
    self.dead = None

  def call(self, module, func, args):
    if self.dead:
      raise RuntimeError(self.dead)
    try:
      send_msg(self.rpc_w, {"op": "call", "module": module, "func": func, "args": encode(args)})
      reply = recv_msg(self.rpc_r, self.deadline, limit=4 << 20)
    except TimeoutError:
      self.dead = "timeout"
      raise RuntimeError("timeout") from None
    except (EOFError, OSError, ValueError):
      self.dead = "crashed"
      raise RuntimeError("crashed") from None
    if not reply.get("ok"):
      raise CandidateError(reply.get("error", "error"))
    return decode(reply["value"])


class CandidateError(Exception):
  pass


def _run_check(job, cand):
  """HumanEval-style: trusted check code calls `candidate(...)` through the proxy."""
  check = job["check"]
  namespace = {}
  exec(check["prompt"], namespace)  # trusted: the benchmark's own prompt (helpers, stubs)
  exec(check["test"], namespace)

  def candidate(*args):
    return cand.call(check["module"], check["entry_point"], list(args))

  # As in HumanEval's own program (prompt + completion + test), the entry point's
  # name refers to the candidate inside the check code too.
  namespace[check["entry_point"]] = candidate
  try:
    namespace["check"](candidate)
    return True, "passed"
  except AssertionError as e:
    return False, f"assertion failed {e}"[:300]
  except CandidateError as e:
    return False, f"candidate raised {e}"[:300]
  except RuntimeError as e:
    return False, str(e)


def _watcher_report(report_r, deadline) -> dict:
  """The watcher's start report (JSON lines until it names the candidate's pid, or an
  error), read by the deadline."""
  info, buf = {}, b""
  while "pid" not in info and "error" not in info:
    if not select.select([report_r], [], [], max(0.0, deadline - time.monotonic()))[0]:
      raise TimeoutError("watcher did not start")
    chunk = os.read(report_r, 4096)
    if not chunk:
      raise EOFError("watcher died")
    buf += chunk
    *lines, buf = buf.split(b"\n")
    for line in lines:
      info.update(json.loads(line))
  return info


def _call(cand, call: dict) -> dict:
  """One call of a `call` job: its encoded value, or the error it raised."""
  try:
    value = cand.call(call["module"], call["func"], decode(call["args"]))
    return {"ok": True, "value": encode(value)}
  except (CandidateError, RuntimeError) as e:
    return {"ok": False, "error": str(e)}


def _harness_main(cfg, job_r, result_w):
  """C. Never returns."""
  _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
  _prctl(PR_SET_CHILD_SUBREAPER, 1)
  start = time.monotonic()
  files_r, files_w = os.pipe()
  to_q_r, to_q_w = os.pipe()
  from_q_r, from_q_w = os.pipe()
  report_r, report_w = os.pipe()
  p = os.fork()
  if p == 0:  # forked before the job is read: nothing of it is in this heap
    for fd in (job_r, result_w, files_w, to_q_w, from_q_r, report_r):
      os.close(fd)
    _watcher_main(cfg, files_r, to_q_r, from_q_w, report_w)
  for fd in (files_r, to_q_r, from_q_w, report_w):
    os.close(fd)
  result = {"status": "error", "detail": "", "results": []}
  q_pid, isolated = None, False
  try:
    job = recv_msg(job_r, start + 60)
    limits = job["limits"]
    deadline = start + limits["wall_s"]
    result["secret"] = job["secret"]
    info = _watcher_report(report_r, deadline)
    if "error" in info:
      result.update(status="refused", detail=info["error"])
      raise _Done
    q_pid, isolated = info["pid"], info["isolated"]
    result["isolation"] = "full" if isolated else "fallback"
    if "warning" in info:
      result["warning"] = info["warning"]
    send_msg(files_w, job["files"])
    os.close(files_w)
    try:
      hello = recv_msg(from_q_r, deadline)
      assert hello.get("ready")
    except (EOFError, TimeoutError, AssertionError, ValueError):
      result.update(status="crashed", detail="the sandbox did not start")
      raise _Done from None
    cand = _Candidate(to_q_w, from_q_r, deadline)
    if "check" in job:
      passed, detail = _run_check(job, cand)
      result.update(status=cand.dead or "ok", passed=passed, detail=detail)
    else:
      for call in job["calls"]:  # (appended one by one: a timeout keeps the earlier ones)
        result["results"].append(_call(cand, call))
      result["status"] = cand.dead or "ok"
  except _Done:
    pass
  except TimeoutError as e:
    result.update(status="timeout", detail=str(e))
  except BaseException as e:
    result.update(status="error", detail=f"{type(e).__name__}: {e}"[:500])
    traceback.print_exc(file=sys.stderr)
  finally:
    if q_pid is not None:
      _kill_tree(q_pid, isolated)
      if not isolated:  # the fallback workspace lives on the host: remove it
        ws = os.path.join(cfg["fallback_dir"], f"ws-{q_pid}")
        shutil.rmtree(ws, ignore_errors=True)
        shutil.rmtree(ws + "-home", ignore_errors=True)
  result["elapsed_s"] = time.monotonic() - start
  try:
    send_msg(result_w, result)
  finally:
    # Reap everything (P, and anything re-parented to this subreaper).
    while True:
      try:
        if os.waitpid(-1, 0)[0] <= 0:
          break
      except ChildProcessError:
        break
    os._exit(0)


class _Done(Exception):
  pass


# ---------------------------------------------------------------- the server loop


def _join_cgroup(cfg, worker_id):
  """Own pids cgroup (v1 or v2) for this worker: a process bound for every uid."""
  for root in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):
    if not os.path.exists(os.path.join(root, "cgroup.procs")):
      continue
    path = os.path.join(root, "gagar_sandbox", f"w{worker_id}-{os.getpid()}")
    try:
      os.makedirs(path, exist_ok=True)
      with open(os.path.join(path, "pids.max"), "w") as f:
        f.write(str(cfg["limits"]["nproc"] + 8))
      with open(os.path.join(path, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))
      return path
    except OSError:
      continue
  return None


def main():
  worker_id = int(sys.argv[1])
  cfg = json.loads(sys.argv[2])
  sock = socket.socket(fileno=int(sys.argv[3]))
  _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
  _prctl(PR_SET_CHILD_SUBREAPER, 1)
  cgroup = _join_cgroup(cfg, worker_id) if cfg["isolate"] else None
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  sock.sendall(json.dumps({"ready": True, "cgroup": cgroup}).encode() + b"\n")
  while True:
    try:
      msg, fds, _, _ = socket.recv_fds(sock, 16, 2)
    except OSError:
      return
    if not msg or len(fds) != 2:
      return
    job_r, result_w = fds
    c = os.fork()
    if c == 0:
      sock.close()
      _harness_main(cfg, job_r, result_w)
    os.close(job_r)
    os.close(result_w)
    sock.sendall(struct.pack("<I", c))
    # Reap C and any orphan re-parented here.
    while True:
      try:
        pid, _ = os.waitpid(-1, 0)
      except ChildProcessError:
        break
      except InterruptedError:
        continue
      if pid == c:
        while True:
          try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
              break
          except ChildProcessError:
            break
        break
    try:
      sock.sendall(b"D")
    except OSError:
      return


if __name__ == "__main__":
  try:
    main()
  except KeyboardInterrupt:
    pass
  except OSError as e:
    if e.errno != errno.EPIPE:
      raise

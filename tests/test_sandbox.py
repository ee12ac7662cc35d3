"""Hostile candidates against the sandbox: each must fail (or give its honest result),
in bounded time, without writing outside its workspace, leaving processes behind,
or hurting the pool or this process."""

import os
import socket
import threading
import time

import pytest

from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from tests.conftest import REPO

UID_BASE = 62000
MARK = "gagar_escape_marker"


@pytest.fixture(scope="module")
def pool():
  os.environ["GAGAR_TEST_SECRET"] = "hunter2-secret-value"
  p = SandboxPool(
    SandboxConfig(workers=2, cpu_s=2, wall_s=4.0, memory_mb=256, nproc=24, uid_base=UID_BASE)
  )
  yield p
  p.close()
  os.environ.pop("GAGAR_TEST_SECRET")


def _leftover_processes():
  out = []
  for pid in os.listdir("/proc"):
    if not pid.isdigit():
      continue
    try:
      with open(f"/proc/{pid}/status") as f:
        uid = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
    except (OSError, StopIteration):
      continue
    if UID_BASE <= uid < UID_BASE + 10:
      out.append(pid)
  return out


def _run(pool, body, calls=(("pkg.m", "f", []),), prelude=""):
  files = {"pkg/__init__.py": "", "pkg/m.py": prelude + "\n" + body}
  start = time.monotonic()
  result = pool.call(files, list(calls))
  elapsed = time.monotonic() - start
  assert elapsed < pool.config.wall_s + 6, elapsed
  deadline = time.monotonic() + 3
  while _leftover_processes() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert not _leftover_processes(), "processes left behind"
  return result


def _passed(result, expected=42):
  return result.status == "ok" and result.calls[0].ok and result.calls[0].value == expected


def test_honest_candidate(pool):
  result = _run(pool, "def f():\n    return 42\n")
  assert _passed(result) and result.isolation == "full"


HOSTILE = {
  "infinite_loop": "def f():\n    while True:\n        pass\n",
  "ignores_sigterm": (
    "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "def f():\n    while True:\n        pass\n"
  ),
  "fork_bomb": (
    "import os\ndef f():\n    while True:\n        try:\n            os.fork()\n"
    "        except OSError:\n            pass\n"
  ),
  "double_forked_setsid_sleepers": (
    "import os, time, signal\ndef f():\n    for _ in range(10):\n        if os.fork() == 0:\n"
    "            os.setsid()\n            if os.fork() == 0:\n"
    "                signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "                time.sleep(600)\n"
    "            os._exit(0)\n    return 41\n"
  ),
  "memory_bomb": "def f():\n    x = bytearray(6 * 1024 ** 3)\n    return 42\n",
  "gigabytes_of_output": (
    "import sys\ndef f():\n    s = 'x' * (1 << 20)\n    for _ in range(1 << 14):\n"
    "        sys.stdout.write(s)\n    return 41\n"
  ),
  "huge_file": (
    "def f():\n    with open('big', 'wb') as fh:\n        for _ in range(1 << 12):\n"
    "            fh.write(b'x' * (1 << 20))\n    return 41\n"
  ),
  "os_exit_at_import": "import os\nos._exit(0)\ndef f():\n    return 42\n",
  "sys_exit_at_import": "import sys\nsys.exit(0)\ndef f():\n    return 42\n",
  "atexit_exits_zero": (
    "import atexit, os\natexit.register(lambda: os._exit(0))\ndef f():\n    return 41\n"
  ),
  "exit_inside_call": "import os\ndef f():\n    os._exit(0)\n",
  "fake_all_passed": "print('10 passed, 0 failed')\ndef f():\n    print('OK')\n    return 41\n",
  "unbounded_recursion": "def f(n=0):\n    return f(n + 1)\n",
  "returns_object_with_forged_eq": (
    "class A:\n    def __eq__(self, other):\n        return True\ndef f():\n    return A()\n"
  ),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_candidate_fails_contained(pool, name):
  result = _run(pool, HOSTILE[name])
  assert not _passed(result), result


def test_patching_the_runner_cannot_forge_unknown_answers(pool):
  # The candidate replaces the reply encoder and assertion machinery in its own process;
  # it still cannot produce the hidden expected value (3 * x for an x it sees only now).
  body = (
    "import builtins, json\nbuiltins.AssertionError = type('N', (Exception,), {})\n"
    'json.dumps = lambda *a, **k: \'{"ok": true, "value": "all passed"}\'\n'
    "def f(x):\n    return x + 1\n"
  )
  result = _run(pool, body, calls=[("pkg.m", "f", [14])])
  assert not _passed(result, expected=42), result


def test_writes_outside_workspace_do_not_land(pool, tmp_path):
  targets = [
    f"/tmp/{MARK}",
    os.path.expanduser(f"~/{MARK}"),
    os.path.join(REPO, MARK),
    os.path.join(REPO, "tests", "test_sandbox.py"),
    f"/dev/shm/{MARK}",
    f"/var/tmp/{MARK}",
    str(tmp_path / MARK),
  ]
  body = (
    "import os\ndef f(paths):\n    done = []\n    for p in paths:\n        try:\n"
    "            with open(p, 'a') as fh:\n                fh.write('pwned')\n"
    "            done.append(p)\n        except OSError:\n            pass\n"
    "    try:\n        os.remove('" + os.path.join(REPO, "tests", "test_sandbox.py") + "')\n"
    "    except OSError:\n        pass\n    return done\n"
  )
  before = open(os.path.join(REPO, "tests", "test_sandbox.py")).read()
  result = _run(pool, body, calls=[("pkg.m", "f", [targets])])
  assert result.status == "ok"
  for path in targets[:3] + targets[4:]:
    assert not os.path.exists(path), path
  assert open(os.path.join(REPO, "tests", "test_sandbox.py")).read() == before


def test_network_to_host_is_unreachable(pool):
  server = socket.socket()
  server.bind(("127.0.0.1", 0))
  server.listen(1)
  server.settimeout(0.2)
  port = server.getsockname()[1]
  got = []

  def accept():
    try:
      got.append(server.accept())
    except OSError:
      pass

  thread = threading.Thread(target=accept)
  thread.start()
  body = (
    "import socket\ndef f(port):\n    s = socket.socket()\n    s.settimeout(1)\n"
    "    try:\n        s.connect(('127.0.0.1', port))\n        return 'connected'\n"
    "    except OSError as e:\n        return 'refused'\n"
  )
  result = _run(pool, body, calls=[("pkg.m", "f", [port])])
  thread.join()
  server.close()
  assert result.calls[0].value == "refused"
  assert not got


def test_signalling_parent_and_everyone(pool):
  body = (
    "import os, signal\ndef f():\n    for target in (os.getppid(), -1, 0, 1):\n        try:\n"
    "            os.kill(target, signal.SIGKILL)\n        except OSError:\n            pass\n"
    "    return 41\n"
  )
  result = _run(pool, body)
  assert not _passed(result)
  # This process, the pool and its workers are all still here.
  assert _passed(_run(pool, "def f():\n    return 42\n"))


def test_cannot_read_secrets_tests_or_other_candidates(pool):
  # Env secrets are scrubbed; the host's files (this repo and its tests) are masked; a
  # concurrently running candidate's workspace is private. (Hidden expectations never
  # enter the sandbox at all: the pool compares results outside.) Needles arrive
  # reversed so that they are not in the files and environment being searched.
  hunter = (
    "import os\ndef f(reversed_needles):\n    blob = repr(dict(os.environ))\n"
    "    for root in ('/tmp', '/work', '/root', '/home', '" + REPO + "', '/proc'):\n"
    "        for dirpath, dirs, files in os.walk(root):\n            for name in files:\n"
    "                try:\n"
    "                    with open(os.path.join(dirpath, name), 'rb') as fh:\n"
    "                        blob += fh.read(1 << 16).decode('latin1')\n"
    "                except Exception:\n                    pass\n"
    "    return [i for i, n in enumerate(reversed_needles) if n[::-1] in blob]\n"
  )
  sleeper = (
    "import time\ndef f():\n    with open('note.txt', 'w') as fh:\n"
    "        fh.write('other-candidate-" + MARK + "')\n    time.sleep(1.5)\n    return 'done'\n"
  )
  needles = ["hunter2-secret", "other-candidate-", "HOSTILE = {"]
  results = {}

  def run_other():
    results["other"] = pool.call({"pkg/__init__.py": "", "pkg/m.py": sleeper}, [("pkg.m", "f", [])])

  other = threading.Thread(target=run_other)
  other.start()
  time.sleep(0.5)
  files = {"pkg/__init__.py": "", "pkg/m.py": hunter}
  result = pool.call(files, [("pkg.m", "f", [[n[::-1] for n in needles]])])
  other.join()
  assert result.status == "ok", result
  assert result.calls[0].value == []
  assert results["other"].calls[0].value == "done"
  # The same search outside the sandbox finds what it looks for (the test can fail).
  assert "HOSTILE = {" in open(os.path.join(REPO, "tests", "test_sandbox.py")).read()


def test_pool_survives_and_counts(pool):
  before = dict(pool.stats)
  _run(pool, HOSTILE["os_exit_at_import"])
  _run(pool, HOSTILE["infinite_loop"])
  stats = dict(pool.stats)
  assert stats["crashes"] >= before["crashes"] + 1
  assert stats["timeouts"] + stats["crashes"] >= before["timeouts"] + before["crashes"] + 2
  assert stats["fallbacks"] == 0
  results = pool.map(
    lambda i: pool.call(
      {"pkg/__init__.py": "", "pkg/m.py": f"def f():\n    return {i}\n"}, [("pkg.m", "f", [])]
    ),
    range(8),
  )
  assert [r.calls[0].value for r in results] == list(range(8))


def test_dead_worker_is_replaced(pool):
  victim = pool._workers[0]
  victim.proc.kill()
  victim.proc.wait()
  results = [_run(pool, "def f():\n    return 42\n") for _ in range(4)]
  assert all(_passed(r) for r in results)
  assert pool.stats["worker_restarts"] >= 1


def test_fallback_without_namespaces_still_bounds_and_cleans(tmp_path):
  # isolate=False is the level used where the kernel refuses namespaces: rlimits, a
  # new session killed as a group, a host workspace that is removed afterwards.
  with SandboxPool(SandboxConfig(workers=1, isolate=False, cpu_s=1, wall_s=3.0)) as p:
    ok = p.call(
      {"pkg/__init__.py": "", "pkg/m.py": "def f():\n    return 42\n"}, [("pkg.m", "f", [])]
    )
    assert _passed(ok) and ok.isolation == "fallback"
    start = time.monotonic()
    loop = p.call(
      {"pkg/__init__.py": "", "pkg/m.py": HOSTILE["infinite_loop"]}, [("pkg.m", "f", [])]
    )
    assert not _passed(loop) and time.monotonic() - start < 8
    assert os.listdir(p._fallback_dir) == []


def test_memo_runs_identical_jobs_once_and_keeps_only_ok_results():
  """A job identical to one run before (or in flight) gets its result without a run;
  each job still gets its own copy; failures are not kept; the memo is bounded."""
  counter = "def f(*args):\n    return 7\n"
  flaky = "def f():\n    while True:\n        pass\n"
  with SandboxPool(SandboxConfig(workers=2, cpu_s=1, wall_s=2.0, memo_entries=2)) as p:
    same = {"pkg/__init__.py": "", "pkg/m.py": counter}
    results = p.map(lambda _: p.call(same, [("pkg.m", "f", [])]), range(6))
    assert all(r.status == "ok" and r.calls[0].value == 7 for r in results)
    assert p.stats["evaluations"] == 1 and p.stats["memo_hits"] == 5
    results[0].calls[0].value = "changed by one caller"
    assert p.call(same, [("pkg.m", "f", [])]).calls[0].value == 7
    p.call(same, [("pkg.m", "f", [3])])  # other arguments: another job
    assert p.stats["evaluations"] == 2
    for _ in range(2):  # a failure (over its CPU time) is not kept: it runs again
      loop = p.call({"pkg/__init__.py": "", "pkg/m.py": flaky}, [("pkg.m", "f", [])])
      assert loop.status in ("timeout", "crashed")
    assert p.stats["evaluations"] == 4 and len(p._memo) <= 2
    for i in range(3):  # bounded: the oldest entries go
      p.call(
        {"pkg/__init__.py": "", "pkg/m.py": f"def f():\n    return {i}\n"}, [("pkg.m", "f", [])]
      )
    assert len(p._memo) == 2
    p.call(same, [("pkg.m", "f", [])])
    assert p.stats["evaluations"] == 8

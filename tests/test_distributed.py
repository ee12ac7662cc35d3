"""A real 2-process `jax.distributed` run on localhost: sharded init and forward."""

import os
import socket
import subprocess
import sys

from tests.conftest import REPO


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_two_process_sharded_forward():
  port = _free_port()
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
  env["PYTHONPATH"] = REPO
  worker = os.path.join(REPO, "tests", "distributed_worker.py")
  procs = [
    subprocess.Popen(
      [sys.executable, worker, str(port), str(i)],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = []
  try:
    for p in procs:
      out, _ = p.communicate(timeout=240)
      outputs.append(out)
  finally:
    for p in procs:
      p.kill()
  for i, (p, out) in enumerate(zip(procs, outputs, strict=True)):
    assert p.returncode == 0, f"process {i} failed:\n{out[-3000:]}"
    assert f"process {i}: devices 4" in out

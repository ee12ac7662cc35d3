"""A headless Chromium driven over the DevTools protocol on a pipe (no extra packages).

    with Browser() as b:           # raises BrowserUnavailable if there is no chromium
      b.open("file:///tmp/site/index.html")
      b.eval("document.title")
      b.screenshot("/tmp/shot.png")

`--remote-debugging-pipe`: Chromium reads JSON commands on fd 3 and writes replies and
events on fd 4, each message ending in a NUL byte. Only file:// pages are opened.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time


class BrowserUnavailable(RuntimeError):
  pass


def find() -> str | None:
  for name in ("chromium", "chromium-browser"):
    path = shutil.which(name)
    if path:
      return path
  return None


class Browser:
  def __init__(self, width: int = 1280, height: int = 900, timeout: float = 30.0):
    self.width, self.height, self.timeout = width, height, timeout

  def __enter__(self):
    exe = find()
    if exe is None:
      raise BrowserUnavailable("no chromium on PATH (Debian: apt-get install chromium)")
    self._profile = tempfile.mkdtemp(prefix="gagar-chromium-")
    self._log = open(os.path.join(self._profile, "stderr.txt"), "w")
    import fcntl

    cmd_r, self._cmd_w = os.pipe()
    self._out_r, out_w = os.pipe()
    # The child's ends above 10, clear of fds 3 and 4.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (cmd_r, out_w)]
    os.close(cmd_r)
    os.close(out_w)
    cmd_r, out_w = moved

    args = [
      "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
      "--disable-extensions", f"--user-data-dir={self._profile}",
      f"--window-size={self.width},{self.height}", "about:blank",
    ]  # fmt: skip
    # The child's fd 3 reads our commands and its fd 4 writes the replies; a shell moves
    # the pipe ends there (bash: dash takes single-digit fds only; no preexec_fn, since
    # forking a threaded JAX process is unsafe).
    script = f'exec "$0" "$@" 3<&{cmd_r} 4>&{out_w} {cmd_r}<&- {out_w}>&-'
    self.proc = subprocess.Popen(
      ["bash", "-c", script, exe, *args],
      stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self._log,
      pass_fds=(cmd_r, out_w),
    )  # fmt: skip
    os.close(cmd_r)
    os.close(out_w)
    self._buf, self._id, self.events = b"", 0, []
    target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
    self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})[
      "sessionId"
    ]
    for domain in ("Page", "Runtime"):
      self.call(f"{domain}.enable")
    self.call(
      "Emulation.setDeviceMetricsOverride",
      {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
    )
    return self

  def __exit__(self, *exc):
    try:
      self._call("Browser.close")
    except Exception:  # noqa: BLE001 - closing anyway
      pass
    try:
      self.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      self.proc.kill()
    for fd in (self._cmd_w, self._out_r):
      try:
        os.close(fd)
      except OSError:
        pass
    self._log.close()
    shutil.rmtree(self._profile, ignore_errors=True)

  # -- protocol ----------------------------------------------------------------------
  def _send(self, method, params=None, session=None) -> int:
    self._id += 1
    msg = {"id": self._id, "method": method, "params": params or {}}
    if session:
      msg["sessionId"] = session
    os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
    return self._id

  def _next(self) -> dict:
    deadline = time.monotonic() + self.timeout
    while b"\0" not in self._buf:
      if time.monotonic() > deadline:
        raise TimeoutError("no message from chromium")
      chunk = os.read(self._out_r, 1 << 16)
      if not chunk:
        raise BrowserUnavailable("chromium closed the pipe")
      self._buf += chunk
    raw, self._buf = self._buf.split(b"\0", 1)
    return json.loads(raw)

  def _call(self, method, params=None, session=None) -> dict:
    want = self._send(method, params, session)
    while True:
      msg = self._next()
      if msg.get("id") == want:
        if "error" in msg:
          raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result", {})
      self.events.append(msg)

  def call(self, method, params=None) -> dict:
    return self._call(method, params, self._session)

  def wait_event(self, method: str) -> dict:
    for i, e in enumerate(self.events):
      if e.get("method") == method:
        return self.events.pop(i)
    while True:
      msg = self._next()
      if msg.get("method") == method:
        return msg
      self.events.append(msg)

  # -- what a test does --------------------------------------------------------------
  def open(self, url: str) -> None:
    if not url.startswith("file://"):
      raise ValueError("only file:// pages")
    self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
    self.call("Page.navigate", {"url": url})
    self.wait_event("Page.loadEventFired")

  def eval(self, expression: str):
    result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True})
    if "exceptionDetails" in result:
      raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
    return result["result"].get("value")

  def click(self, selector: str, navigates: bool = False) -> None:
    self.events = [e for e in self.events if e.get("method") != "Page.loadEventFired"]
    self.eval(f"document.querySelector({json.dumps(selector)}).click()")
    if navigates:
      self.wait_event("Page.loadEventFired")

  def screenshot(self, path: str) -> None:
    data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
    with open(path, "wb") as f:
      f.write(base64.b64decode(data))

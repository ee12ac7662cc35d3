"""The LM grader in-process vs served over HTTP, the server's errors, the client's retries."""

import http.client
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.grading import agent, lm_grader, openai_grader, protocol, workspace
from gagar_jax.rollout import Trajectory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRADER = os.path.join(REPO, "assets", "lm_grader")
KEY = "test-key-123"


@pytest.fixture(scope="module")
def served():
  """`experiments/serve_grader.py` on a free loopback port: (host, port, process)."""
  proc = subprocess.Popen(
    [
      sys.executable,
      os.path.join(REPO, "experiments", "serve_grader.py"),
      f"--grader={GRADER}",
      "--port=0",
      f"--api_key={KEY}",
      "--max_pending=8",
      "--read_timeout_s=2",
    ],
    stdout=subprocess.PIPE,
    stderr=subprocess.DEVNULL,
    text=True,
    cwd=REPO,
  )
  line = []
  reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)
  reader.start()
  reader.join(120)
  assert line and line[0].startswith("serving gagar-lm-grader on http://127.0.0.1:"), line
  port = int(line[0].rsplit(":", 1)[1].split("/")[0])
  yield "127.0.0.1", port, proc
  proc.terminate()
  proc.wait(10)


@pytest.fixture(scope="module")
def groups():
  """Expert fixes of held-out tasks with random habits (+ one failing copy each)."""
  habits = expert_lib.HabitConfig(**dict.fromkeys(expert_lib.HabitConfig().__dict__, 0.35))
  out = []
  with SandboxPool(SandboxConfig(workers=2, uid_base=65200)) as pool:
    for k in range(6):
      task = minirepo.generate_task(2_000_000 + k, n_functions=2)
      e = expert_lib.Expert(habits, seed=k, pool=pool)
      ds = [e.demonstrate(task) for _ in range(2 + k % 3)]
      g = [
        Trajectory(task, 0, i, [], [], [], d.turns, d.files, passed=True) for i, d in enumerate(ds)
      ]
      g.append(Trajectory(task, 0, len(g), [], [], [], [], task.files, passed=False))
      out.append(g)
  return out


def _rank(grader, ws):
  try:
    return protocol.validate(grader.rank(ws), ws)
  except protocol.InvalidRanking:
    return None


def test_served_grader_ranks_exactly_like_the_in_process_grader(served, groups, tmp_path):
  host, port, _ = served
  local = lm_grader.LMGrader.load(GRADER)
  remote = openai_grader.OpenAIGrader.from_config(
    openai_grader.OpenAIConfig(
      base_url=f"http://{host}:{port}/v1", model="gagar-lm-grader", api_key=KEY, timeout_s=60
    )
  )
  valid = 0
  for k, group in enumerate(groups):
    ws = workspace.materialize(group, str(tmp_path / f"g{k}"), seed=k)
    a, b = _rank(local, ws), _rank(remote, ws)
    assert a == b, f"group {k}: in-process {a} vs served {b}"
    assert local.last_messages == remote.last_messages
    valid += a is not None
  assert valid >= len(groups) // 2, f"only {valid}/{len(groups)} valid rankings"
  m = remote.chat.metrics()
  assert m["requests"] >= len(groups) and m["failures"] == 0 and m["completion_tokens"] > 0
  assert local.stats["tokens"] == remote.stats["tokens"] > 0


def _request(host, port, method, path, body=None, headers=None):
  conn = http.client.HTTPConnection(host, port, timeout=60)
  hdrs = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json", **(headers or {})}
  if isinstance(body, (dict, list)):
    body = json.dumps(body)
  conn.request(method, path, body=body, headers=hdrs)
  resp = conn.getresponse()
  data = json.loads(resp.read() or b"{}")
  conn.close()
  return resp.status, data


def test_malformed_requests_get_clear_4xx_and_the_server_stays_up(served):
  host, port, proc = served
  user = {"role": "user", "content": "Issue: f(1) returns 2 but should return 3.\nPassing: c1 c2"}
  url = "/v1/chat/completions"
  cases = [
    ("POST", url, "{not json", 400, "invalid_json"),
    ("POST", url, [1, 2], 400, None),
    ("POST", url, {"model": "gagar-lm-grader"}, 400, None),
    ("POST", url, {"model": "gpt-9", "messages": [user]}, 404, "model_not_found"),
    ("POST", url, {"messages": [user], "max_tokens": -3}, 400, None),
    ("POST", url, {"messages": [user], "max_tokens": "many"}, 400, None),
    ("POST", url, {"messages": [user], "temperature": "hot"}, 400, None),
    ("POST", url, {"messages": [user], "stream": True}, 400, None),
    ("POST", url, {"messages": [{"role": "wizard", "content": "x"}]}, 400, None),
    ("POST", url, {"messages": [user, {"role": "tool", "content": "x"}]}, 400, None),
    ("POST", url, {"messages": [user], "max_tokens": 4000}, 400, "context_length_exceeded"),
    ("POST", url, {"messages": [{"role": "user", "content": "x" * 5000}]}, 400, None),
    ("POST", "/v1/embeddings", {"input": "x"}, 404, "not_found"),
    ("GET", "/v1/nothing", None, 404, "not_found"),
    ("DELETE", url, None, 405, "method_not_allowed"),
  ]
  for method, path, body, status, code in cases:
    got, data = _request(host, port, method, path, body)
    assert got == status, (method, path, body, got, data)
    err = data["error"]
    assert err["message"] and err["type"] == "invalid_request_error"
    if code:
      assert err["code"] == code, err
  got, data = _request(
    host, port, "POST", url, {"messages": [user]}, {"Authorization": "Bearer no"}
  )
  assert got == 401 and data["error"]["code"] == "invalid_api_key"
  conn = http.client.HTTPConnection(host, port, timeout=60)
  conn.putrequest("POST", url)
  conn.putheader("Content-Length", str(2 << 20))
  conn.putheader("Authorization", f"Bearer {KEY}")
  conn.endheaders()  # the body is never sent: the header alone is refused
  resp = conn.getresponse()
  assert resp.status == 413 and json.loads(resp.read())["error"]["code"] == "body_too_large"
  conn.close()
  # Still up, and still right.
  assert proc.poll() is None
  assert _request(host, port, "GET", "/health") == (
    200,
    {"status": "ok", "model": "gagar-lm-grader"},
  )
  got, data = _request(host, port, "POST", url, {"messages": [user], "max_tokens": 8})
  assert got == 200 and data["choices"][0]["message"]["role"] == "assistant"
  assert data["usage"]["completion_tokens"] <= 8


def _raw(host, port, data: bytes, *, wait_s: float = 10.0) -> list[tuple[int, dict]]:
  """Sends raw bytes on one connection; returns every (status, JSON body) the server sends
  back before it closes the connection (or `wait_s` passes)."""
  with socket.create_connection((host, port), timeout=wait_s) as sock:
    sock.sendall(data)
    received = b""
    try:
      while chunk := sock.recv(65536):
        received += chunk
    except TimeoutError:
      pass
  out = []
  while received:
    head, _, rest = received.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:])
    assert headers["Content-Type"] == "application/json", headers
    n = int(headers["Content-Length"])
    out.append((status, json.loads(rest[:n])))
    received = rest[n:]
  return out


def test_hostile_clients_get_json_errors_and_never_a_second_request(served):
  host, port, proc = served
  user = {"role": "user", "content": "Issue: f(1) returns 2 but should return 3.\nPassing: c1"}
  auth = f"Authorization: Bearer {KEY}\r\n".encode()
  # A chunked body is refused and the connection closed: its bytes (here a whole valid
  # request smuggled in the body) are never answered as a second request.
  inner = json.dumps({"messages": [user], "max_tokens": 2}).encode()
  smuggled = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth
    + b"Content-Type: application/json\r\nContent-Length: " + str(len(inner)).encode()
    + b"\r\n\r\n" + inner
  )  # fmt: skip
  chunked = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth
    + b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    + f"{len(smuggled):x}\r\n".encode() + smuggled + b"\r\n0\r\n\r\n"
  )  # fmt: skip
  answers = _raw(host, port, chunked)
  assert [status for status, _ in answers] == [411], answers
  assert answers[0][1]["error"]["code"] == "length_required"
  # The same after an early refusal (wrong route): the unread body is not a request.
  wrong = smuggled.replace(b"/v1/chat/completions", b"/v1/nothing", 1)
  wrong = wrong.replace(
    b"Content-Length: " + str(len(inner)).encode(),
    b"Content-Length: " + str(len(smuggled)).encode(),
  )
  assert [s for s, _ in _raw(host, port, wrong + smuggled)] == [404]
  # A garbage request line: a JSON 400, not an HTML page.
  answers = _raw(host, port, b"\x16\x03\x01 garbage\r\n\r\n")
  assert answers[0][0] == 400 and answers[0][1]["error"]["message"], answers
  # A body that is not application/json: 415.
  got, data = _request(
    host, port, "POST", "/v1/chat/completions", {"messages": [user]},
    {"Content-Type": "text/plain"},
  )  # fmt: skip
  assert got == 415 and data["error"]["code"] == "unsupported_media_type"
  # A stalled client (headers promise 100 bytes, 10 arrive) is dropped after the read
  # timeout (2 s here), with no answer parsed from the partial body.
  start = time.monotonic()
  stalled = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + auth
    + b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages"
  )  # fmt: skip
  assert _raw(host, port, stalled, wait_s=20) == []
  assert 1.5 < time.monotonic() - start < 15
  # And a client that sends nothing at all.
  start = time.monotonic()
  assert _raw(host, port, b"", wait_s=20) == []
  assert time.monotonic() - start < 15
  assert proc.poll() is None
  assert _request(host, port, "GET", "/health")[0] == 200


class _Flaky(BaseHTTPRequestHandler):
  """Answers `plan` in order: an int status (error), "slow" (sleeps), or "ok"."""

  plan: list = []
  seen = 0

  def log_message(self, *args):
    pass

  def do_POST(self):
    type(self).seen += 1
    self.rfile.read(int(self.headers["Content-Length"]))
    step = type(self).plan.pop(0)
    if step == "slow":
      time.sleep(1.0)
      step = "ok"
    if step == "ok":
      body = {
        "choices": [{"message": {"role": "assistant", "content": "rank c1"}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
      }
      status = 200
    else:
      body, status = {"error": {"message": "nope"}}, step
    data = json.dumps(body).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Length", str(len(data)))
      self.end_headers()
      self.wfile.write(data)
    except BrokenPipeError:  # the client gave up (the timeout case)
      pass


@pytest.fixture
def flaky():
  httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
  threading.Thread(target=httpd.serve_forever, daemon=True).start()
  _Flaky.seen = 0
  yield httpd.server_address[1]
  httpd.shutdown()


def _client(port, **kw):
  config = openai_grader.OpenAIConfig(
    base_url=f"http://127.0.0.1:{port}/v1", model="m", backoff_s=0.01, **kw
  )
  return openai_grader.HTTPChatModel(config)


def _complete(chat):
  return chat.complete(
    [{"role": "user", "content": "x"}], tools=agent.TOOLS, max_tokens=4, temperature=0, seed=0
  )


def test_concurrent_requests_are_batched_and_answered_as_alone():
  # Eight threads asking at once share device calls (batches of more than one row),
  # and each greedy answer equals the one the same request gets alone.
  chat = lm_grader.load_chat_model(GRADER)
  asks = [
    [
      {
        "role": "user",
        "content": f"Issue: f({i}) returns {i + 1} but should return {i}.\nPassing: c1",
      }
    ]
    for i in range(8)
  ]
  alone = [chat.complete(m, max_tokens=8) for m in asks]
  assert set(chat.batch_sizes) == {1}
  chat.batch_sizes.clear()
  gate = threading.Barrier(len(asks))
  together = [None] * len(asks)

  def ask(i):
    gate.wait()
    together[i] = chat.complete(asks[i], max_tokens=8)

  threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(asks))]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  assert max(chat.batch_sizes) > 1, chat.batch_sizes
  assert sum(k * v for k, v in chat.batch_sizes.items()) == len(asks)
  for a, b in zip(alone, together, strict=True):
    assert a["choices"] == b["choices"] and a["usage"] == b["usage"]


def test_64_concurrent_clients_are_all_answered_never_reset(served):
  # A burst of 64 clients on loopback (plus 8 that hang up at once): every client gets
  # 200, or 503 with Retry-After from the bounded queue (8 waiting); none is reset
  # (the listen backlog is 256, not socketserver's 5) and the server keeps serving.
  import socket

  host, port, proc = served
  user = {"role": "user", "content": "Issue: f(1) returns 2 but should return 3.\nPassing: c1"}
  body = json.dumps({"messages": [user], "max_tokens": 4})
  start = threading.Barrier(64 + 8)
  results, lock = [], threading.Lock()

  def client(i):
    start.wait()
    t0 = time.perf_counter()
    try:
      conn = http.client.HTTPConnection(host, port, timeout=120)
      conn.request(
        "POST",
        "/v1/chat/completions",
        body=body,
        headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"},
      )
      resp = conn.getresponse()
      data = json.loads(resp.read())
      out = (resp.status, resp.getheader("Retry-After"), data, time.perf_counter() - t0)
      conn.close()
    except OSError as e:  # a reset or refused connection
      out = ("error", repr(e), None, time.perf_counter() - t0)
    with lock:
      results.append(out)

  def rude():
    start.wait()
    sock = socket.create_connection((host, port), timeout=30)
    head = (
      f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
      "Content-Type: application/json\r\n"
    )
    sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n{body}".encode())
    sock.close()  # gone before the answer

  threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
  threads += [threading.Thread(target=rude) for _ in range(8)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(300)
  assert len(results) == 64
  errors = [r for r in results if r[0] == "error"]
  assert not errors, errors[:3]
  assert {r[0] for r in results} <= {200, 503}, {r[0] for r in results}
  ok = [r for r in results if r[0] == 200]
  busy = [r for r in results if r[0] == 503]
  assert ok and all(r[2]["choices"][0]["message"] for r in ok)
  assert all(r[1] == "1" and r[2]["error"]["code"] == "overloaded" for r in busy)
  assert proc.poll() is None
  assert _request(host, port, "GET", "/health")[0] == 200
  lat = sorted(r[3] for r in results)
  print(
    f"64 clients: {len(ok)} x 200, {len(busy)} x 503; latency p50 {lat[31]:.3f}s p95 {lat[60]:.3f}s"
  )


def test_client_retries_transient_errors_with_backoff_and_not_bad_requests(flaky):
  _Flaky.plan = [503, 429, "ok"]
  chat = _client(flaky, retries=3)
  assert _complete(chat)["choices"][0]["message"]["content"] == "rank c1"
  m = chat.metrics()
  assert (m["requests"], m["retries"], m["failures"], m["prompt_tokens"]) == (3, 2, 0, 5)
  _Flaky.plan = [400, "ok"]
  with pytest.raises(openai_grader.EndpointError, match="HTTP 400"):
    _complete(chat)
  assert _Flaky.seen == 4  # the 400 was not retried
  _Flaky.plan = ["slow", "slow"]
  chat = _client(flaky, retries=1, timeout_s=0.2)
  with pytest.raises(openai_grader.EndpointError, match="timed out"):
    _complete(chat)
  assert chat.metrics()["retries"] == 1 and chat.metrics()["failures"] == 1


def test_endpoint_settings_come_from_config_or_environment(monkeypatch):
  from gagar_jax.errors import ConfigError

  monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
  with pytest.raises(ConfigError, match="grader.openai.base_url"):
    openai_grader.OpenAIConfig(model="m").resolved()
  monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1/")
  monkeypatch.setenv("OPENAI_MODEL", "served")
  monkeypatch.setenv("MY_KEY", "sekret")
  c = openai_grader.OpenAIConfig(api_key_env="MY_KEY").resolved()
  assert (c.base_url, c.model, c.api_key) == ("http://127.0.0.1:9/v1", "served", "sekret")
  with pytest.raises(ConfigError, match="concurrency"):
    openai_grader.OpenAIConfig(concurrency=0)

"""An OpenAI-compatible chat-completions server for a `LocalChatModel` (stdlib HTTP).

    server = make_server(chat_model, "127.0.0.1", 8000, model_name="gagar-lm-grader")
    server.serve_forever()

Routes: POST /v1/chat/completions, GET /v1/models, GET /health. Every error, a
malformed request line included, is JSON `{"error": {"message", "type", "param",
"code"}}` with a 4xx status for a bad request (invalid JSON, a body that is not
`application/json`, missing or malformed messages, unknown model, bad parameters,
body too large, a chunked body (refused: send Content-Length), missing key when one
is set, unsupported streaming) and 500 for a model failure; no request can stop the
server. After an error on a POST the connection is closed, so body bytes the server
did not read are never taken for a next request. A client that stalls mid-request
is dropped after `read_timeout_s`. Concurrent requests
are batched into shared device calls by `LocalChatModel`; at most `max_pending`
wait at once: past that a request gets 503 with `Retry-After` at once (the clients
in `openai_grader` retry on it). The listen backlog holds `BACKLOG` connections, so a
burst of clients is queued by the kernel rather than reset, and a client that hangs
up before its answer costs a closed socket, not a traceback.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import threading
import time
import traceback
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from gagar_jax.grading.lm_grader import RequestError

MAX_BODY = 1 << 20
READ_TIMEOUT_S = 30.0  # a client silent this long mid-request is dropped
BACKLOG = 256  # socketserver's default is 5: a burst of clients got connection resets
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class HTTPError(Exception):
  def __init__(
    self, status: int, message: str, param=None, code="invalid_request", kind=None, headers=None
  ):
    super().__init__(message)
    self.status, self.param, self.code = status, param, code
    self.kind = kind or ("invalid_request_error" if status < 500 else "server_error")
    self.headers = headers or {}


class _Server(ThreadingHTTPServer):
  request_queue_size = BACKLOG
  daemon_threads = True

  def handle_error(self, request, client_address):
    if isinstance(sys.exc_info()[1], _GONE):  # the client hung up: nothing to report
      return
    super().handle_error(request, client_address)


def _int_param(body, name, default, lo, hi):
  value = body.get(name, default)
  if value is None:
    return default
  if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
    raise HTTPError(400, f"{name} must be an integer in [{lo}, {hi}], got {value!r}", name)
  return value


def handle_completion(chat, model_name: str, body, counter) -> dict:
  """The response dict of one chat-completions request; raises HTTPError."""
  if not isinstance(body, dict):
    raise HTTPError(400, "the request body must be a JSON object")
  model = body.get("model", model_name)
  if model != model_name:
    raise HTTPError(
      404,
      f"model {model!r} does not exist; this server has {model_name!r}",
      "model",
      "model_not_found",
    )
  if "messages" not in body:
    raise HTTPError(400, "missing required parameter: messages", "messages")
  if body.get("stream"):
    raise HTTPError(400, "streaming is not supported", "stream")
  if _int_param(body, "n", 1, 1, 1) != 1:
    raise HTTPError(400, "only n=1 is supported", "n")
  limit = body.get("max_completion_tokens", body.get("max_tokens"))
  max_tokens = _int_param({"max_tokens": limit}, "max_tokens", 64, 1, 4096)
  seed = _int_param(body, "seed", 0, -(2**31), 2**31 - 1)
  temperature = body.get("temperature", 0.0)
  if temperature is None:
    temperature = 0.0
  if not isinstance(temperature, (int, float)) or isinstance(temperature, bool):
    raise HTTPError(400, f"temperature must be a number, got {temperature!r}", "temperature")
  tools = body.get("tools")
  if tools is not None and not isinstance(tools, list):
    raise HTTPError(400, "tools must be a list", "tools")
  try:
    response = chat.complete(
      body["messages"],
      tools=tools,
      max_tokens=max_tokens,
      temperature=float(temperature),
      seed=seed,
      model=model_name,
    )
  except RequestError as e:
    raise HTTPError(400, str(e), e.param, e.code) from e
  response["id"] = f"chatcmpl-{next(counter)}"
  response["created"] = int(time.time())
  return response


@dataclasses.dataclass
class _Serving:
  chat: object
  model_name: str
  api_key: str
  verbose: bool
  max_pending: int
  pending: threading.BoundedSemaphore
  counter: itertools.count


class _Handler(BaseHTTPRequestHandler):
  """The OpenAI-compatible routes; `serving` (set per server by `make_server`) holds the
  model, its name, the API key and the request limits."""

  protocol_version = "HTTP/1.1"
  serving: _Serving

  def log_message(self, fmt, *args):
    if self.serving.verbose:
      super().log_message(fmt, *args)

  def _send(self, status: int, payload: dict, headers=None):
    data = json.dumps(payload).encode()
    try:
      self.send_response(status)
      self.send_header("Content-Type", "application/json")
      self.send_header("Content-Length", str(len(data)))
      for name, value in (headers or {}).items():
        self.send_header(name, value)
      if self.close_connection:
        self.send_header("Connection", "close")
      self.end_headers()
      self.wfile.write(data)
    except _GONE:  # the client hung up before its answer
      self.close_connection = True

  def send_error(self, code, message=None, explain=None):
    """What http.server sends for a request it cannot parse (a garbage request line,
    bad headers, an unsupported method): the same JSON errors as the rest, never
    HTML, and the connection closed."""
    self.close_connection = True
    if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":  # no usable version:
      self.request_version = "HTTP/1.1"  # still answer with a status line and headers
    self._error(HTTPError(code, message or "bad request", code="bad_request"))

  def _error(self, e: HTTPError):
    self._send(
      e.status,
      {"error": {"message": str(e), "type": e.kind, "param": e.param, "code": e.code}},
      e.headers,
    )

  def do_GET(self):
    if self.path == "/health":
      self._send(200, {"status": "ok", "model": self.serving.model_name})
    elif self.path == "/v1/models":
      self._send(
        200, {"object": "list", "data": [{"id": self.serving.model_name, "object": "model"}]}
      )
    else:
      self._error(HTTPError(404, f"no route GET {self.path}", code="not_found"))

  def do_POST(self):
    try:
      # Until the body is read, an error must close the connection: the unread bytes
      # would otherwise be parsed as the next request.
      self.close_connection = True
      if "Transfer-Encoding" in self.headers:
        raise HTTPError(
          411,
          f"Transfer-Encoding {self.headers['Transfer-Encoding']!r} is not supported; "
          "send the body with a Content-Length",
          code="length_required",
        )
      if self.path != "/v1/chat/completions":
        raise HTTPError(404, f"no route POST {self.path}", code="not_found")
      key = self.serving.api_key
      if key and self.headers.get("Authorization", "") != f"Bearer {key}":
        raise HTTPError(401, "missing or wrong API key", code="invalid_api_key")
      length = self.headers.get("Content-Length")
      if length is None or not length.isdigit():
        raise HTTPError(411, "Content-Length required", code="length_required")
      if int(length) > MAX_BODY:
        self.close_connection = True
        raise HTTPError(413, f"body over {MAX_BODY} bytes", code="body_too_large")
      kind = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
      if kind != "application/json":
        raise HTTPError(
          415,
          f"Content-Type must be application/json, got {kind or 'none'!r}",
          code="unsupported_media_type",
        )
      raw = self.rfile.read(int(length))
      if len(raw) < int(length):
        raise HTTPError(400, "the body ended before Content-Length bytes", code="short_body")
      self.close_connection = False  # the body is read: the connection may be kept
      try:
        body = json.loads(raw)
      except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise HTTPError(400, f"invalid JSON: {e}", code="invalid_json") from e
      if not self.serving.pending.acquire(blocking=False):
        raise HTTPError(
          503,
          f"{self.serving.max_pending} requests are already waiting for the model; retry shortly",
          code="overloaded",
          headers={"Retry-After": "1"},
        )
      try:
        response = handle_completion(
          self.serving.chat, self.serving.model_name, body, self.serving.counter
        )
      finally:
        self.serving.pending.release()
      self._send(200, response)
    except HTTPError as e:
      self._error(e)
    except TimeoutError:  # the client stalled mid-body: drop it (`timeout`)
      self.close_connection = True
    except Exception as e:  # the model failed: report it, keep serving
      traceback.print_exc()
      self._error(HTTPError(500, f"{type(e).__name__}: {e}", code="internal_error"))

  def _not_allowed(self):
    self._error(HTTPError(405, f"method {self.command} not allowed", code="method_not_allowed"))

  do_PUT = do_DELETE = do_PATCH = _not_allowed


def make_server(
  chat,
  host: str,
  port: int,
  *,
  model_name: str = "gagar-lm-grader",
  api_key: str = "",
  verbose: bool = False,
  max_pending: int = 32,
  read_timeout_s: float = READ_TIMEOUT_S,
) -> ThreadingHTTPServer:
  """An HTTP server of `chat` behind the OpenAI chat-completions API (module docstring);
  at most `max_pending` requests wait for the model, a client silent for
  `read_timeout_s` is dropped."""
  if max_pending < 1:
    raise ValueError(f"max_pending must be >= 1, got {max_pending}")
  if read_timeout_s <= 0:
    raise ValueError(f"read_timeout_s must be > 0, got {read_timeout_s}")
  serving = _Serving(
    chat,
    model_name,
    api_key,
    verbose,
    max_pending,
    threading.BoundedSemaphore(max_pending),
    itertools.count(1),
  )
  # `timeout`: the socket timeout, so a stalled client is dropped, not kept forever.
  handler = type("Handler", (_Handler,), {"serving": serving, "timeout": read_timeout_s})
  return _Server((host, port), handler)

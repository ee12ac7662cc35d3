"""The grading agent against any OpenAI-compatible chat-completions endpoint.

    grader = OpenAIGrader.from_config(OpenAIConfig(base_url="http://127.0.0.1:8000/v1",
                                                   model="gagar-lm-grader"))
    ranking = grader.rank(workspace)        # the loop of grading/agent.py, over HTTP

What vLLM or SGLang serve at scale, or `experiments/serve_grader.py` for the
project's own LM grader. The base URL, model and key come from the config or
the environment (`OPENAI_BASE_URL`, `OPENAI_MODEL`, and the variable named by
`api_key_env`, `OPENAI_API_KEY` by default). Requests carry the tool schemas
(`agent.TOOLS`), `max_tokens`, `temperature` and `seed`. At most `concurrency`
requests are in flight per client; each has a timeout; connection errors,
timeouts, 429 and 5xx are retried with exponential backoff (jittered), other
4xx fail the attempt at once (the agent then retries once, then the loop falls
back). `HTTPChatModel.metrics()` reports requests, retries, failures, latency
percentiles and token counts.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request

import numpy as np

from gagar_jax.configlib import check, check_positive_ints
from gagar_jax.errors import ConfigError
from gagar_jax.grading import agent


@dataclasses.dataclass(frozen=True)
class OpenAIConfig:
  base_url: str = ""  # e.g. http://127.0.0.1:8000/v1; "" -> $OPENAI_BASE_URL
  model: str = ""  # "" -> $OPENAI_MODEL
  api_key: str = ""  # "" -> the variable named by api_key_env (may be unset: no key)
  api_key_env: str = "OPENAI_API_KEY"
  concurrency: int = 4
  timeout_s: float = 30.0
  retries: int = 3
  backoff_s: float = 0.25
  max_backoff_s: float = 4.0

  def __post_init__(self):
    check_positive_ints(self, ("concurrency",))
    check(self.retries >= 0, "retries", f"must be >= 0, got {self.retries}")
    check(self.timeout_s > 0, "timeout_s", f"must be > 0, got {self.timeout_s}")
    check(self.backoff_s >= 0, "backoff_s", "must be >= 0")

  def resolved(self) -> OpenAIConfig:
    base = self.base_url or os.environ.get("OPENAI_BASE_URL", "")
    if not base.startswith(("http://", "https://")):
      raise ConfigError(
        "grader.openai.base_url", f"needs an http(s) URL (or $OPENAI_BASE_URL), got {base!r}"
      )
    model = self.model or os.environ.get("OPENAI_MODEL", "")
    if not model:
      raise ConfigError("grader.openai.model", "needs a model name (or $OPENAI_MODEL)")
    key = self.api_key or os.environ.get(self.api_key_env, "")
    return dataclasses.replace(self, base_url=base.rstrip("/"), model=model, api_key=key)


class EndpointError(RuntimeError):
  """The endpoint refused the request (4xx) or kept failing after the retries."""

  def __init__(self, message: str, status: int | None = None):
    super().__init__(message)
    self.status = status


class HTTPChatModel:
  """`complete(messages, ...)` by POST {base_url}/chat/completions."""

  def __init__(self, config: OpenAIConfig):
    self.config = config.resolved()
    self._slots = threading.BoundedSemaphore(self.config.concurrency)
    self._lock = threading.Lock()
    self._latency: list[float] = []
    self._counts = dict.fromkeys(
      ("requests", "retries", "failures", "prompt_tokens", "completion_tokens"), 0
    )

  def _count(self, **kv):
    with self._lock:
      for k, v in kv.items():
        self._counts[k] += v

  def metrics(self) -> dict:
    with self._lock:
      lat = np.array(self._latency) if self._latency else np.array([np.nan])
      return {
        **{k: float(v) for k, v in self._counts.items()},
        "latency_p50_s": float(np.percentile(lat, 50)),
        "latency_p95_s": float(np.percentile(lat, 95)),
      }

  def _post(self, body: bytes) -> dict:
    headers = {"Content-Type": "application/json"}
    if self.config.api_key:
      headers["Authorization"] = f"Bearer {self.config.api_key}"
    req = urllib.request.Request(
      f"{self.config.base_url}/chat/completions", data=body, headers=headers, method="POST"
    )
    with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
      return json.loads(resp.read())

  def complete(self, messages, *, tools, max_tokens, temperature, seed) -> dict:
    c = self.config
    body = json.dumps(
      {
        "model": c.model,
        "messages": messages,
        "tools": tools,
        "tool_choice": "auto",
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
      }
    ).encode()
    last = None
    for attempt in range(c.retries + 1):
      if attempt:
        self._count(retries=1)
        delay = min(c.max_backoff_s, c.backoff_s * 2 ** (attempt - 1))
        time.sleep(delay * (0.5 + random.random() / 2))
      start = time.perf_counter()
      try:
        with self._slots:
          self._count(requests=1)
          response = self._post(body)
      except urllib.error.HTTPError as e:
        detail = e.read()[:300].decode(errors="replace")
        last = EndpointError(f"HTTP {e.code}: {detail}", e.code)
        if e.code != 429 and e.code < 500:
          break  # the request itself is wrong: retrying cannot help
        continue
      except (urllib.error.URLError, TimeoutError, ConnectionError, json.JSONDecodeError) as e:
        last = EndpointError(f"{type(e).__name__}: {e}")
        continue
      finally:
        with self._lock:
          self._latency.append(time.perf_counter() - start)
      usage = response.get("usage") or {}
      self._count(
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        completion_tokens=int(usage.get("completion_tokens", 0)),
      )
      return response
    self._count(failures=1)
    raise last


class OpenAIGrader(agent.AgentGrader):
  """The grading agent, its model behind an OpenAI-compatible endpoint."""

  name = "openai"

  @classmethod
  def from_config(cls, config: OpenAIConfig, agent_config=None, run_tests=None):
    return cls(HTTPChatModel(config), agent_config, run_tests)

"""The SFT-trained LM grader: the project's model run as a grading agent.

    grader = LMGrader.load("assets/lm_grader", run_tests=...)
    ranking = grader.rank(workspace)          # the loop of grading/agent.py

`LocalChatModel` turns OpenAI chat messages into the model's token format
(`envs.transcript`: the user message is the prompt, an assistant tool call is
its action text `diff c3`, a tool message is an observation; system messages
are not rendered, the model was trained without one), samples the next action
with the KV-cache sampler, and answers in the OpenAI response shape: a tool call
when the action is one, else content (the ranking). `experiments/serve_grader.py`
serves exactly this object over HTTP, so the in-process grader and the served one
see the same tokens and, greedy, give the same rankings.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import weakref
from concurrent import futures

import jax

from gagar_jax import files, policy_io
from gagar_jax.envs import transcript
from gagar_jax.grading import agent
from gagar_jax.models import sampler as sampler_lib
from gagar_jax.models import transformer


class RequestError(ValueError):
  """A request the model cannot serve (bad messages, context too long): HTTP 400."""

  def __init__(self, message: str, param: str | None = None, code: str = "invalid_request"):
    super().__init__(message)
    self.param, self.code = param, code


def assistant_actions(message: dict) -> list[str]:
  """The action texts of an assistant message (its tool calls, else its content)."""
  calls = message.get("tool_calls")
  if calls:
    if not isinstance(calls, list):
      raise RequestError("tool_calls must be a list", "messages")
    out = []
    for call in calls:
      fn = call.get("function") if isinstance(call, dict) else None
      if not isinstance(fn, dict):
        raise RequestError("a tool call needs a `function` object", "messages")
      try:
        args = json.loads(fn.get("arguments") or "{}")
        out.append(agent.call_to_action(fn.get("name"), args))
      except (ValueError, TypeError) as e:
        raise RequestError(f"bad tool call: {e}", "messages") from e
    return out
  content = message.get("content")
  if not isinstance(content, str):
    raise RequestError("an assistant message needs content or tool_calls", "messages")
  return [content]


_FORMATS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def grader_format(tok) -> transcript.AgentFormat:
  """The grader model's episode format (its own template; no system message)."""
  if tok not in _FORMATS:
    _FORMATS[tok] = transcript.AgentFormat(tok)
  return _FORMATS[tok]


def render(tok, messages, max_obs_tokens: int | None = None) -> list[int]:
  """Token ids of a conversation, ending where the assistant's next action starts."""
  if not isinstance(messages, list) or not messages:
    raise RequestError("messages must be a non-empty list", "messages")
  fmt = grader_format(tok)
  end = fmt.end_ids()
  ids: list[int] = []
  pending: list[str] = []  # actions of a multi-call message waiting for their results
  for i, m in enumerate(messages):
    if not isinstance(m, dict) or m.get("role") not in ("system", "user", "assistant", "tool"):
      raise RequestError(f"messages[{i}] needs a role system|user|assistant|tool", "messages")
    role = m["role"]
    if role == "system":
      continue
    if role == "user":
      if ids or not isinstance(m.get("content"), str):
        raise RequestError("exactly one user message with text content, first", "messages")
      ids = fmt.prompt_ids(m["content"])
    elif not ids:
      raise RequestError(f"messages[{i}] ({role}) comes before the user message", "messages")
    elif role == "assistant":
      if pending:
        raise RequestError(f"messages[{i}]: tool results missing before it", "messages")
      actions = assistant_actions(m)
      ids += tok.encode(actions[0]) + end
      pending = actions[1:] + [None]
    else:  # tool
      if not pending:
        raise RequestError(f"messages[{i}]: a tool result with no tool call", "messages")
      if not isinstance(m.get("content"), str):
        raise RequestError(f"messages[{i}]: tool content must be text", "messages")
      ids += fmt.observation_ids(m["content"], max_obs_tokens)
      nxt = pending.pop(0)
      if nxt is not None:
        ids += tok.encode(nxt) + end
  if pending and pending != [None]:
    raise RequestError("the conversation ends with unanswered tool calls", "messages")
  if messages[-1].get("role") == "assistant":
    raise RequestError("the last message must be user or tool", "messages")
  return ids


def action_message(text: str, call_id: str) -> tuple[dict, str]:
  """(assistant message, finish reason) for a sampled action."""
  call = agent.action_to_call(text)
  if call is None:
    return {"role": "assistant", "content": text}, "stop"
  name, args = call
  return {
    "role": "assistant",
    "content": None,
    "tool_calls": [
      {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
    ],
  }, "tool_calls"


class LocalChatModel:
  """The project's model behind `complete(messages, ...)` (an OpenAI response dict).

  Thread-safe and batching: concurrent `complete` calls (the grader loop's workers,
  the HTTP server's handler threads) are queued to one device thread, which runs
  every request waiting at that moment with the same sampling settings as one batch
  (up to `max_batch` rows, padded to a power of two so a few shapes compile). A
  greedy request's answer does not depend on its batch-mates: each row attends only
  to its own cache. Sampled requests (temperature > 0) batch only with requests of
  the same seed.
  """

  def __init__(
    self,
    tok,
    model_config,
    params,
    *,
    context: int = 1024,
    max_obs_tokens: int | None = 96,
    max_batch: int = 8,
  ):
    if max_batch < 1:
      raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    self.tok, self.model_config = tok, model_config
    self.context = min(context, model_config.max_seq_len)
    self.max_obs_tokens = max_obs_tokens
    self.max_batch = max_batch
    graphdef, _ = transformer.abstract(model_config)
    self.params = jax.device_put(params)
    self.sampler = sampler_lib.Sampler(
      model_config, graphdef, cache_size=self.context, pad_id=tok.pad_id
    )
    self.end = tok.token_id(transcript.END_ACTION)
    self.batch_sizes: dict[int, int] = {}  # rows per device call -> calls (for the bench)
    self._queue: queue.Queue = queue.Queue()
    self._worker = threading.Thread(target=self._serve, name="lm-grader-device", daemon=True)
    self._worker.start()

  def _serve(self):
    """The device thread: drains the queue into batches of like requests."""
    while True:
      pending = [self._queue.get()]
      while len(pending) < 64:
        try:
          pending.append(self._queue.get_nowait())
        except queue.Empty:
          break
      batches: dict = {}
      for item in pending:
        batches.setdefault(item[1], []).append(item)
      for like in batches.values():
        for i in range(0, len(like), self.max_batch):
          self._run(like[i : i + self.max_batch])

  def _run(self, items):
    (sampling, seed) = items[0][1]
    rows = 1
    while rows < len(items):
      rows *= 2
    prompts = [ids for ids, _, _ in items] + [[self.tok.pad_id]] * (rows - len(items))
    active = [True] * len(items) + [False] * (rows - len(items))
    try:
      state = self.sampler.prefill(self.params, prompts)
      _, out = self.sampler.generate(self.params, state, jax.random.key(seed), sampling, active)
      tokens, count = jax.device_get((out.tokens, out.num_tokens))
    except Exception as e:  # noqa: BLE001 - handed to every caller of this batch
      for _, _, done in items:
        done.set_exception(e)
      return
    self.batch_sizes[len(items)] = self.batch_sizes.get(len(items), 0) + 1
    for row, (_, _, done) in enumerate(items):
      done.set_result(tokens[row, : int(count[row])].tolist())

  def complete(
    self,
    messages,
    *,
    tools=None,
    max_tokens: int = 24,
    temperature: float = 0.0,
    seed: int = 0,
    model: str = "",
  ) -> dict:
    del tools  # the model knows its tools from training
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
      raise RequestError("max_tokens must be a positive integer", "max_tokens")
    if not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
      raise RequestError("temperature must be a number in [0, 2]", "temperature")
    if not isinstance(seed, int) or isinstance(seed, bool):
      raise RequestError("seed must be an integer", "seed")
    ids = render(self.tok, messages, self.max_obs_tokens)
    if len(ids) + max_tokens > self.context:
      raise RequestError(
        f"{len(ids)} prompt tokens + max_tokens {max_tokens} exceed the context of {self.context}",
        "messages",
        "context_length_exceeded",
      )
    sampling = sampler_lib.SamplingParams(
      max_new_tokens=max_tokens,
      temperature=float(temperature),
      eos_id=self.tok.eos_id,
      stop_sequences=((self.end,),),
    )
    done: futures.Future = futures.Future()
    # Greedy decoding ignores the key, so every greedy request shares one batch key.
    self._queue.put((ids, (sampling, seed if temperature > 0 else 0), done))
    new = done.result()
    stopped = bool(new) and new[-1] in (self.end, self.tok.eos_id)
    text = self.tok.decode(new[:-1] if stopped else new).strip()
    turn = sum(1 for m in messages if m.get("role") == "assistant")
    message, finish = action_message(text, f"call_{turn}")
    if not stopped:
      finish = "length"
    return {
      "object": "chat.completion",
      "model": model,
      "choices": [{"index": 0, "message": message, "finish_reason": finish}],
      "usage": {
        "prompt_tokens": len(ids),
        "completion_tokens": len(new),
        "total_tokens": len(ids) + len(new),
      },
    }


class LMGrader(agent.AgentGrader):
  """The trained grader model, in-process."""

  name = "lm"

  @classmethod
  def load(cls, path: str, config: agent.AgentConfig | None = None, run_tests=None):
    return cls(load_chat_model(path), config, run_tests)


def load_chat_model(path: str, max_batch: int = 8, field: str = "grader.lm_path") -> LocalChatModel:
  """A grader folder (`policy_io` layout plus grader.json: context, max_obs_tokens);
  `field`: the flag or config field that named it (in error messages)."""

  tok, model_config, params = policy_io.load(path, field=field)
  settings_file = os.path.join(path, "grader.json")
  settings = files.read_json(settings_file)
  files.require(settings, ("context", "max_obs_tokens"), settings_file)
  return LocalChatModel(
    tok,
    model_config,
    params,
    context=settings["context"],
    max_obs_tokens=settings["max_obs_tokens"],
    max_batch=max_batch,
  )

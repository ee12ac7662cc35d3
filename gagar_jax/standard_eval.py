"""HumanEval by the two protocols published numbers use, so figures compare with theirs.

    results = standard_eval.run(policy, params, tasks, "instruct", samples=1, temperature=0.0)

- `completion` (the HumanEval paper, for base models): the problem's prompt text as is
  (no chat template, no special tokens added) is continued; the completion is cut at the
  first of `COMPLETION_STOPS`; the program is prompt + completion.
- `instruct` (EvalPlus's protocol for chat models): one user message asking for a
  self-contained script in a markdown code block (`INSTRUCTION`), rendered with the
  checkpoint's chat template and generation prompt, the answer started with
  `RESPONSE_PREFIX` (which opens a python fence); the code is cut at the first closing
  fence; the program is the prompt's import lines + the code if the code defines the
  entry point, else prompt + code.

Each program is run against the problem's own `check` in the sandbox (the agentic suite's
`humaneval.evaluate`). At most `max_new_tokens` (384) new tokens per sample.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import jax
import numpy as np

from gagar_jax.envs import humaneval
from gagar_jax.models import sampler as sampler_lib
from gagar_jax.models import transformer

MODES = ("completion", "instruct")
MAX_NEW_TOKENS = 384
COMPLETION_STOPS = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#")
INSTRUCTION = (
  "Please provide a self-contained Python script that solves the following problem in a "
  "markdown code block:"
)
RESPONSE_PREFIX = (
  "Below is a Python script with a self-contained function that solves the problem and "
  "passes corresponding tests:\n```python\n"
)
INSTRUCT_STOPS = ("\n```",)
# Rows decoded together (a decode step reads every weight once, whatever the batch).
BATCH_ROWS = 64
ROUND = 64  # the cache size is the longest prompt + new tokens, rounded up to this


@dataclasses.dataclass(frozen=True)
class Sample:
  """One generated answer: the raw completion (cut), the program checked, the verdict."""

  task_id: str
  completion: str
  program: str
  passed: bool
  status: str
  new_tokens: int
  finish: str


def prompt_text(task: humaneval.HumanEvalTask, mode: str, tok) -> str:
  """The text the model continues under `mode`."""
  if mode == "completion":
    return task.prompt
  if mode != "instruct":
    raise ValueError(f"mode {mode!r}: one of {MODES}")
  message = f"{INSTRUCTION}\n```\n{task.prompt.strip()}\n```\n"
  rendered = tok.template.render([{"role": "user", "content": message}], add_generation_prompt=True)
  return rendered + RESPONSE_PREFIX


def cut(text: str, mode: str) -> str:
  """The completion up to the first of the mode's stop strings."""
  stops = COMPLETION_STOPS if mode == "completion" else INSTRUCT_STOPS
  ends = [i for i in (text.find(s) for s in stops) if i >= 0]
  return text[: min(ends)] if ends else text


def _defines(code: str, name: str) -> bool:
  return re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def program(task: humaneval.HumanEvalTask, completion: str, mode: str) -> str:
  """The program checked for `completion` under `mode`."""
  if mode == "completion":
    return task.prompt + completion
  if _defines(completion, task.entry_point):
    imports = [line for line in task.prompt.splitlines() if line.startswith(("import ", "from "))]
    return "\n".join(imports + [completion]) + "\n"
  return task.prompt + completion


def run(
  policy,
  params,
  tasks: Sequence[humaneval.HumanEvalTask],
  mode: str,
  *,
  samples: int,
  temperature: float,
  pool,
  seed: int = 0,
  max_new_tokens: int = MAX_NEW_TOKENS,
  batch_rows: int = BATCH_ROWS,
  progress: Callable[[int, int, list[list[Sample]]], None] | None = None,
) -> list[list[Sample]]:
  """`samples` answers per task under `mode`, each checked in `pool`; one list per task.

  Args:
    policy: a `policy_io.Policy` (its tokenizer, template and model config).
    params: its parameters.
    progress: called as (tasks done, tasks, results so far) after each batch.
  """

  tok, config = policy.tok, policy.model_config
  prompts = [tok.encode(prompt_text(t, mode, tok)) for t in tasks]
  longest = max(len(p) for p in prompts)
  cache = min(config.max_seq_len, -(-(longest + max_new_tokens) // ROUND) * ROUND)
  if longest >= cache:
    raise ValueError(f"a prompt of {longest} tokens does not fit the model's {cache} positions")
  graphdef, _ = transformer.abstract(config)
  # Prompts go in in pieces of 32 tokens (2.2x faster prefill for 64 rows of ~230 tokens
  # on 2 CPU cores than one 256-wide chunk), answers decode 32 tokens between compactions.
  engine = sampler_lib.Sampler(
    config, graphdef, cache_size=cache, pad_id=tok.pad_id, decode_chunk=32, append_chunk=32
  )
  stops = COMPLETION_STOPS if mode == "completion" else INSTRUCT_STOPS
  sampling = sampler_lib.SamplingParams(
    max_new_tokens=max_new_tokens, temperature=temperature, eos_id=tok.eos_id
  )
  stop_strings = sampler_lib.StopStrings(stops, tok.decode)
  per_batch = max(1, batch_rows // samples)
  key = jax.random.key(seed)
  results: list[list[Sample]] = []
  for start in range(0, len(tasks), per_batch):
    batch = list(range(start, min(start + per_batch, len(tasks))))
    rows = [prompts[i] for i in batch for _ in range(samples)]
    state = engine.prefill(params, rows)
    _, out = engine.generate(
      params, state, jax.random.fold_in(key, start), sampling, stop_strings=stop_strings
    )
    got = jax.device_get((out.tokens, out.num_tokens, out.finish_reason))
    tokens, counts, reasons = (np.asarray(x) for x in got)
    jobs = []
    for r, i in enumerate(j for j in batch for _ in range(samples)):
      ids = [int(t) for t in tokens[r, : counts[r]]]
      if ids and ids[-1] == tok.eos_id:
        ids = ids[:-1]
      completion = cut(tok.decode(ids), mode)
      finish = sampler_lib.FINISH_NAMES[int(reasons[r])]
      jobs.append((tasks[i], completion, int(counts[r]), finish))

    def check(job):
      task, completion, n, finish = job
      code = program(task, completion, mode)
      verdict = humaneval.evaluate(task, {humaneval.PATH: code}, pool)
      return Sample(task.task_id, completion, code, verdict.passed, verdict.status, n, finish)

    checked = pool.map(check, jobs)
    for b in range(len(batch)):
      results.append(checked[b * samples : (b + 1) * samples])
    if progress is not None:
      progress(len(results), len(tasks), results)
  return results

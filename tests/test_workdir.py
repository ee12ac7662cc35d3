"""A workdir is one experiment, and every file the project reads names itself when it is
damaged: fault injection per file type (policy and HF folders, grader folders, workdirs)."""

import json
import os
import shutil

import ml_collections
import pytest

from configs import gagar as gagar_config
from configs import sft as sft_config
from gagar_jax import configlib, policy_io, workdir
from gagar_jax.errors import ConfigError, InputError, UsageError
from gagar_jax.grading import lm_grader
from tests.conftest import REPO

HF = os.path.join(REPO, "tests", "data", "hf_tiny", "qwen2")
POLICY = os.path.join(REPO, "assets", "pre_rl")
GRADER = os.path.join(REPO, "assets", "lm_grader")


def _config(**changes):
  return configlib.set_dotted(gagar_config.get_config("runlocal=True"), changes)


def test_a_workdir_keeps_its_experiment(tmp_path):
  path = str(tmp_path / "run")
  assert workdir.claim(path, "rl", _config()) == {}
  saved = json.load(open(os.path.join(path, "config.json")))
  assert saved["arm"] == "gagar" and json.load(open(os.path.join(path, "workdir.json")))["kind"]
  # The same config, or one that changes only fields safe on resume: taken.
  assert workdir.claim(path, "rl", _config(steps=9, **{"eval.tasks": 5})) == {}
  assert json.load(open(os.path.join(path, "config.json")))["steps"] == 9
  # Another experiment: refused, naming every differing field, and nothing written.
  before = open(os.path.join(path, "config.json")).read()
  changed = _config(arm="grpo", **{"learner.optim.learning_rate": 1e-3})
  changed.learner.advantage.redistribute = False
  with pytest.raises(ConfigError) as e:
    workdir.claim(path, "rl", changed)
  assert e.value.field == "arm, learner.advantage.redistribute, learner.optim.learning_rate"
  assert "0.0002 -> 0.001" in str(e.value) and "resume_override" in str(e.value)
  assert open(os.path.join(path, "config.json")).read() == before
  # ... unless overridden: logged, and the config is the new one.
  changed.resume_override = True
  lines = []
  got = workdir.claim(path, "rl", changed, log=lines.append)
  assert set(got) == {"arm", "learner.advantage.redistribute", "learner.optim.learning_rate"}
  assert lines and lines[0].startswith("[workdir] resume_override: continuing")
  record = json.loads(open(os.path.join(path, "config_changes.jsonl")).read())
  assert record["changed"]["arm"] == ["gagar", "grpo"]
  assert json.load(open(os.path.join(path, "config.json")))["arm"] == "grpo"
  assert not [f for f in os.listdir(path) if ".tmp" in f]  # atomic writes leave no temp files


def test_a_workdir_of_another_kind_or_a_foreign_folder_is_left_alone(tmp_path):
  rl = str(tmp_path / "rl")
  workdir.claim(rl, "rl", _config())
  with pytest.raises(ConfigError, match=r"^workdir: .* is the workdir of a rl run \(this is"):
    workdir.claim(rl, "sft", sft_config.get_config("runlocal=True"))
  # A workdir written before workdir.json: its kind comes from its config.
  os.remove(os.path.join(rl, "workdir.json"))
  with pytest.raises(ConfigError, match="is the workdir of a rl run"):
    workdir.claim(rl, "sft", sft_config.get_config("runlocal=True"))
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(ConfigError, match="is not a run's workdir"):
    workdir.claim(str(foreign), "rl", _config())
  (tmp_path / "file").write_text("x")
  with pytest.raises(ConfigError, match="is a file, not a folder"):
    workdir.claim(str(tmp_path / "file"), "rl", _config())
  # A damaged saved config names itself.
  broken = tmp_path / "broken"
  workdir.claim(str(broken), "rl", _config())
  (broken / "config.json").write_text('{"arm": "gagar", ')
  with pytest.raises(InputError, match=r"broken/config.json: is not valid JSON"):
    workdir.claim(str(broken), "rl", _config())


def test_other_tools_never_write_into_a_run_workdir(tmp_path):
  rl = str(tmp_path / "rl")
  workdir.claim(rl, "rl", _config())
  for keeps in ((), ("eval.json",), ("model.safetensors",)):
    with pytest.raises(ConfigError, match="^out: .* is a training run's workdir"):
      workdir.check_output_folder(rl, "out", keeps=keeps)
  (tmp_path / "eval.json").write_text("{}")
  with pytest.raises(ConfigError, match="^out: .* is an existing file"):
    workdir.check_output_folder(str(tmp_path / "eval.json"), "out")
  other = tmp_path / "other"
  other.mkdir()
  (other / "thesis.tex").write_text("x")
  with pytest.raises(ConfigError, match="non-empty folder of something else"):
    workdir.check_output_folder(str(other), "export", keeps=("model.json",))
  (other / "model.json").write_text("{}")  # an earlier export: may be overwritten
  workdir.check_output_folder(str(other), "export", keeps=("model.json",))
  workdir.check_output_folder(str(tmp_path / "new"), "export", keeps=("model.json",))


def _copy(src, tmp_path, name="copy"):
  dst = tmp_path / name
  shutil.copytree(src, dst)
  return dst


# Fault injection: (folder, file to damage, damage, what the error must say).
CASES = [
  (HF, "model.safetensors", "truncate", "model.safetensors: is not a readable safetensors file"),
  (HF, "model.safetensors", "empty", "header too small"),
  (HF, "config.json", "garbage", "config.json: is not valid JSON"),
  (HF, "tokenizer_config.json", "garbage", "tokenizer_config.json: is not valid JSON"),
  (POLICY, "params.safetensors", "truncate", "params.safetensors: is not a readable safetensors"),
  (POLICY, "model.json", "garbage", "model.json: is not valid JSON"),
  (POLICY, "model.json", "{}", "model.json: lacks the field(s) embed_dim"),
  (POLICY, "tokenizer/tokenizer.json", "garbage", "tokenizer.json: is not a readable tokenizer"),
]


@pytest.mark.parametrize("src,name,damage,message", CASES)
def test_a_damaged_policy_file_names_itself_before_any_compute(
  tmp_path, src, name, damage, message
):
  dst = _copy(src, tmp_path)
  path = dst / name
  if damage == "truncate":
    os.truncate(path, os.path.getsize(path) // 2)
  elif damage == "empty":
    os.truncate(path, 0)
  elif damage == "garbage":
    path.write_text('{"oops": ')
  else:
    path.write_text(damage)
  with pytest.raises(UsageError) as e:
    policy_io.open_policy(str(dst), field="policy")  # reads no weights
  assert message in str(e.value) and str(dst) in str(e.value), str(e.value)


def test_a_missing_or_wrong_folder_names_the_flag(tmp_path):
  with pytest.raises(ConfigError, match=r"^policy: '.*model.json' is a file, not a folder"):
    policy_io.open_policy(os.path.join(POLICY, "model.json"), field="policy")
  with pytest.raises(ConfigError, match=r"^init_from: '/nonexistent' does not exist"):
    policy_io.open_policy("/nonexistent")


def test_a_damaged_grader_folder_names_the_file(tmp_path):
  dst = _copy(GRADER, tmp_path)
  (dst / "grader.json").write_text(json.dumps({"context": 512}))
  with pytest.raises(InputError, match=r"grader.json: lacks the field\(s\) max_obs_tokens"):
    lm_grader.load_chat_model(str(dst))


def test_boolean_config_args_must_parse():
  from configs import common

  assert common.parse_arg("demo=True,seed=2", demo=False, seed=0).demo is True
  assert common.parse_arg("demo=no", demo=True).demo is False
  with pytest.raises(ValueError, match="config arg 'demo': expected true or false, got 'ture'"):
    common.parse_arg("demo=ture", demo=False)
  with pytest.raises(ValueError, match="config arg 'seed': expected int, got 'x'"):
    common.parse_arg("seed=x", seed=0)


def test_config_differences_and_safe_fields():
  config = ml_collections.ConfigDict({"a": 1})
  assert workdir.differences({"a": 1, "b": {"c": [1, 2]}}, {"a": 1, "b": {"c": [1, 3]}}) == {
    "b.c": ([1, 2], [1, 3])
  }
  assert workdir.is_safe("eval.tasks") and not workdir.is_safe("learner.optim.learning_rate")
  assert workdir.config_json(config) == {"a": 1}


def test_claims_race_free_across_processes(tmp_path, monkeypatch):
  # Regression: process 1 of a 2-process run saw process 0 mid-write (only a
  # `workdir.json.tmp<pid>` in the folder) and refused it as "not a run's workdir".
  path = tmp_path / "run"
  path.mkdir()
  (path / "workdir.json.tmp123").write_text("{")
  assert workdir.claim(str(path), "rl", _config()) == {}  # a write cut short is ours
  (path / "notes.txt").write_text("mine")
  monkeypatch.setattr(workdir.jax, "process_index", lambda: 1)
  other = tmp_path / "other"
  other.mkdir()
  (other / "notes.txt").write_text("mine")
  assert workdir.claim(str(other), "rl", _config()) == {}  # process 0 judges, 1 writes nothing
  assert sorted(os.listdir(other)) == ["notes.txt"]
  # Process 1's config differs from process 0's only in distributed.*: taken.
  assert workdir.claim(str(path), "rl", _config(**{"distributed.process_id": 1})) == {}

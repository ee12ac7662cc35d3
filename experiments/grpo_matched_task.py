"""The Tunix-matched toy GRPO task, in plain Python (no gagar_jax, no tunix imports).

Both `experiments/bench.py --sections=grpo_matched` (gagar_jax) and
`experiments/tunix_matched.py` (Tunix, run from a throwaway venv) import this file,
so the two sides draw the same prompts, tokenize the same way and score the same
reward.

- Model: a Qwen2/Llama-style decoder, 2 layers, embed 128, MLP 512, 4 query / 2 kv
  heads, head_dim 32, vocabulary 320 (byte tokens), tied embeddings, RoPE 1e4, fp32.
- Tokens: pad 0, bos 1, eos 2, byte b -> b + 3.
- Each step: 4 prompts, each two random words from FRUITS, x G = 4 samples; at most
  64 new tokens at temperature 1; reward 1 if the completion contains a vowel.
- GRPO advantages, PPO clip 0.2, KL k3 (beta 0.04) against the frozen initial
  parameters, AdamW lr 1e-4; 30 steps, the first 5 not counted.
"""

from __future__ import annotations

import random

MODEL = dict(
  vocab_size=320,
  embed_dim=128,
  num_layers=2,
  num_heads=4,
  num_kv_heads=2,
  head_dim=32,
  mlp_dim=512,
  rope_theta=10_000.0,
  tie_embeddings=True,
)
PAD, BOS, EOS, OFFSET = 0, 1, 2, 3
PROMPTS_PER_STEP = 4
GROUP_SIZE = 4
MAX_NEW_TOKENS = 64
TEMPERATURE = 1.0
CLIP_EPS = 0.2
KL_BETA = 0.04
LEARNING_RATE = 1e-4
STEPS = 30
WARMUP_STEPS = 5  # not counted
FRUITS = (
  "apple",
  "banana",
  "cherry",
  "grape",
  "lemon",
  "mango",
  "melon",
  "orange",
  "peach",
  "pear",
  "plum",
  "kiwi",
)
VOWELS = frozenset("aeiouAEIOU")


def encode(text: str, bos: bool = True) -> list[int]:
  ids = [b + OFFSET for b in text.encode("utf-8")]
  return [BOS, *ids] if bos else ids


def decode(ids) -> str:
  """Bytes of the ids up to the first EOS; pad, bos and the unused ids >= 259 dropped."""
  out = bytearray()
  for i in ids:
    i = int(i)
    if i == EOS:
      break
    if OFFSET <= i < OFFSET + 256:
      out.append(i - OFFSET)
  return out.decode("utf-8", errors="replace")


def prompts(step: int, seed: int = 0) -> list[str]:
  """The step's PROMPTS_PER_STEP prompts: two distinct fruit words each."""
  rng = random.Random(seed * 1_000_003 + step)
  return [" ".join(rng.sample(FRUITS, 2)) for _ in range(PROMPTS_PER_STEP)]


def reward(completion: str) -> float:
  return 1.0 if any(c in VOWELS for c in completion) else 0.0


def summarize(per_step: list[dict]) -> dict:
  """Medians over the counted steps (after WARMUP_STEPS) and end-to-end tokens/s.

  Each record has `step_s`, `generate_s`, `update_s` and `tokens` (generated tokens).
  """
  import statistics

  counted = per_step[WARMUP_STEPS:]
  if not counted:
    raise ValueError(f"need more than {WARMUP_STEPS} steps, got {len(per_step)}")
  med = lambda k: statistics.median(r[k] for r in counted)
  total_s = sum(r["step_s"] for r in counted)
  tokens = sum(r["tokens"] for r in counted)
  return {
    "step_s": med("step_s"),
    "generate_s": med("generate_s"),
    "update_s": med("update_s"),
    "tokens_per_s": tokens / total_s,
    "generate_tokens_per_s": tokens / sum(r["generate_s"] for r in counted),
    "mean_reward": sum(r["reward"] for r in counted) / len(counted),
    "counted_steps": len(counted),
  }

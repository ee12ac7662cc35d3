"""Parity of the GGUF reader with `transformers`' own GGUF loader, on a real file.

Two halves, run in two environments (torch and transformers are never project
dependencies):

    # 1. in a throwaway venv: pip install torch==2.13.0 transformers gguf accelerate
    /tmp/ref/bin/python experiments/gguf_parity.py --reference --gguf=FILE.gguf --out=/tmp/parity
    # 2. in the project's venv:
    .venv/bin/python experiments/gguf_parity.py --gguf=FILE.gguf --out=/tmp/parity

The reference half renders several conversations (with and without a system message,
multi-turn, special tokens written literally) with the file's chat template, tokenizes
them and a few raw texts, computes float32 logits for two prompts and a greedy answer,
and writes them to `--out`. The second half does the same through `gagar_jax` and prints
the largest logit difference and every mismatch; it exits 1 on any mismatch or a logit
difference above `--atol` (2e-4).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

CONVERSATIONS = [
  [{"role": "user", "content": "Write a Python function that returns the sum of a list."}],
  [
    {"role": "system", "content": "You are a terse coding assistant."},
    {"role": "user", "content": "Fix: def add(a, b): return a - b"},
  ],
  [
    {"role": "user", "content": "Hi there!"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Count to 12345, then say été — ok?\n\n  indented\tcode  "},
  ],
  [
    {"role": "system", "content": "sys"},
    {"role": "user", "content": "a"},
    {"role": "assistant", "content": "b"},
    {"role": "user", "content": "```python\nprint('x')\n```"},
    {"role": "assistant", "content": "<|endoftext|> literal special"},
  ],
]
TEXTS = [
  'def has_close_elements(numbers: List[float], threshold: float) -> bool:\n    """ Check if'
  " in given list of numbers, are any two numbers closer to each other than\n    given "
  'threshold.\n    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    """\n',
  "  leading spaces and 3.14159 numbers 2026-12-07 'quotes' 中文 emoji 😀 <|im_start|>user",
  "\n\n\n    \t\t x=1;y=22;z=333;w=4444",
]
GREEDY_TOKENS = 60


def reference(path: str, out: str) -> None:
  import numpy as np
  import torch
  from transformers import AutoModelForCausalLM, AutoTokenizer

  torch.set_num_threads(2)
  folder, name = os.path.dirname(os.path.abspath(path)), os.path.basename(path)
  tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
  model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
  chats = []
  for conv in CONVERSATIONS:
    for gen in (True, False):
      text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)
      chats.append({"text": text, "ids": tok(text, add_special_tokens=False)["input_ids"]})
  encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
  prompts = [chats[0]["ids"], encoded[0]]
  with torch.no_grad():
    logits = [model(torch.tensor([ids])).logits[0].numpy() for ids in prompts]
    greedy = model.generate(
      torch.tensor([prompts[0]]), max_new_tokens=GREEDY_TOKENS, do_sample=False
    )[0, len(prompts[0]) :].tolist()
  os.makedirs(out, exist_ok=True)
  np.savez(os.path.join(out, "logits.npz"), *logits)
  with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump({"chat": chats, "encode": encoded, "prompts": prompts, "greedy": greedy}, f)
  print(f"reference written to {out}")


def compare(path: str, out: str, atol: float) -> int:
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from gagar_jax import policy_io
  from gagar_jax.models import sampler, transformer

  ref = json.load(open(os.path.join(out, "reference.json")))
  policy = policy_io.open_policy(path)
  tok, bad = policy.tok, 0
  chats = [(c, g) for c in CONVERSATIONS for g in (True, False)]
  for (conv, gen), want in zip(chats, ref["chat"], strict=True):
    text = tok.template.render(conv, add_generation_prompt=gen)
    same = text == want["text"] and tok.encode(text) == want["ids"]
    bad += not same
    print(f"chat ({len(conv)} messages, generation prompt {gen}): {'same' if same else 'DIFFER'}")
  for text, want in zip(TEXTS, ref["encode"], strict=True):
    same = tok.encode(text) == want
    bad += not same
    print(f"encode {text[:30]!r}...: {'same' if same else 'DIFFER'}")
  params = jax.tree.map(jnp.asarray, policy_io.load_weights(policy))
  graphdef, _ = transformer.abstract(policy.model_config)
  model = nnx.merge(graphdef, params)
  z = np.load(os.path.join(out, "logits.npz"))
  worst = 0.0
  for i, ids in enumerate(ref["prompts"]):
    diff = float(np.abs(np.asarray(model(jnp.asarray([ids])))[0] - z[f"arr_{i}"]).max())
    worst = max(worst, diff)
    print(f"logits, prompt {i} ({len(ids)} tokens): max abs difference {diff:.3e}")
  engine = sampler.Sampler(policy.model_config, graphdef, cache_size=256, pad_id=tok.pad_id)
  state = engine.prefill(params, [ref["prompts"][0]])
  _, got = engine.generate(
    params, state, jax.random.key(0), sampler.SamplingParams(GREEDY_TOKENS, temperature=0.0)
  )
  greedy = [int(t) for t in np.asarray(got.tokens)[0]]
  same = greedy == ref["greedy"]
  bad += not same
  print(f"greedy {GREEDY_TOKENS} tokens: {'same' if same else 'DIFFER'}")
  ok = bad == 0 and worst <= atol
  print(f"{'PASS' if ok else 'FAIL'}: {bad} mismatches, largest logit difference {worst:.3e}")
  return 0 if ok else 1


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--gguf", required=True)
  parser.add_argument("--out", required=True)
  parser.add_argument("--reference", action="store_true")
  parser.add_argument("--atol", type=float, default=2e-4)
  args = parser.parse_args()
  if args.reference:
    reference(args.gguf, args.out)
    return 0
  return compare(args.gguf, args.out, args.atol)


if __name__ == "__main__":
  sys.exit(main())

"""The peer side of `bench.py --sections=real_sampler`: greedy decoding with `transformers`.

Not part of gagar_jax: it runs from a throwaway venv that holds torch and transformers
and never the project's dependencies (bench.py starts it with `--peer_python`):

    python3.11 -m venv /tmp/peer_venv
    /tmp/peer_venv/bin/pip install --index-url https://download.pytorch.org/whl/cpu torch
    /tmp/peer_venv/bin/pip install transformers safetensors

It reads an HF folder (config.json + model.safetensors, written by bench.py from the
same random weights its own sampler uses) and a JSON list of prompts (token ids),
left-pads them into one batch, and times `generate` (greedy, exactly `--new_tokens`
new tokens, KV cache on) after one warm-up call. Prints one JSON line: the median
tokens/s and the greedy tokens.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from transformers import AutoModelForCausalLM


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--hf_dir", required=True)
  parser.add_argument("--prompts", required=True, help="JSON file: a list of token-id lists")
  parser.add_argument("--new_tokens", type=int, default=128)
  parser.add_argument("--repeats", type=int, default=2)
  parser.add_argument("--threads", type=int, default=2)
  args = parser.parse_args()
  torch.set_num_threads(args.threads)
  with open(args.prompts) as f:
    prompts = json.load(f)
  model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=torch.float32).eval()
  width = max(len(p) for p in prompts)
  ids = torch.zeros((len(prompts), width), dtype=torch.long)
  mask = torch.zeros((len(prompts), width), dtype=torch.long)
  for i, p in enumerate(prompts):  # left-padded, as decoder-only generation wants
    ids[i, width - len(p) :] = torch.tensor(p)
    mask[i, width - len(p) :] = 1
  kwargs = dict(
    attention_mask=mask,
    max_new_tokens=args.new_tokens,
    min_new_tokens=args.new_tokens,
    do_sample=False,
    pad_token_id=0,
    eos_token_id=None,
  )

  def run():
    with torch.inference_mode():
      return model.generate(ids, **kwargs)[:, width:]

  tokens = run()  # warm-up
  times = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    run()
    times.append(time.perf_counter() - start)
  rate = len(prompts) * args.new_tokens / statistics.median(times)
  print(json.dumps({"tok_s": rate, "tokens": tokens.tolist(), "torch": torch.__version__}))


if __name__ == "__main__":
  main()

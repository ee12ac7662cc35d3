"""How an episode becomes tokens: one format for rollouts and supervised demos.

    <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n
    {action}<|end_action|>
    \\n<|im_start|>tool\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n
    {action}<|end_action|> ...

Segments are encoded separately (prompt, each action, each observation), exactly
as a rollout builds its context, so that a demonstration teaches the policy the
token sequences it will itself produce and see. The policy's own tokens are the
actions and their end-of-action markers; only they are trained on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gagar_jax.models import tokenizers

END_ACTION = "<|end_action|>"
SPECIALS = (*tokenizers.DEFAULT_SPECIALS, END_ACTION)


def prompt_text(prompt: str) -> str:
  return f"{tokenizers.IM_START}user\n{prompt}{tokenizers.IM_END}\n{tokenizers.IM_START}assistant\n"


def observation_text(observation: str) -> str:
  start, end = tokenizers.IM_START, tokenizers.IM_END
  return f"\n{start}tool\n{observation}{end}\n{start}assistant\n"


def encode_episode(
  tok, prompt: str, turns: Sequence[tuple[str, str]], *, max_obs_tokens: int | None = None
) -> tuple[list[int], list[bool]]:
  """(token ids, policy mask) of a whole episode; `turns` = [(action, observation)].

  The last turn's observation (after `submit`) is not appended.
  """
  end = tok.token_id(END_ACTION)
  ids = tok.encode(prompt_text(prompt))
  mask = [False] * len(ids)
  for i, (action, observation) in enumerate(turns):
    a = tok.encode(action) + [end]
    ids += a
    mask += [True] * len(a)
    if i + 1 < len(turns):
      o = encode_observation(tok, observation, max_obs_tokens)
      ids += o
      mask += [False] * len(o)
  return ids, mask


def encode_observation(tok, observation: str, max_tokens: int | None = None) -> list[int]:
  """The observation segment; its body is cut to `max_tokens` (the markers are kept)."""
  if max_tokens is None:
    return tok.encode(observation_text(observation))
  head = tok.encode(f"\n{tokenizers.IM_START}tool\n")
  body = tok.encode(observation)
  tail = tok.encode(f"{tokenizers.IM_END}\n{tokenizers.IM_START}assistant\n")
  if len(body) > max_tokens:
    body = body[:max_tokens] + tok.encode(" ...")
  return head + body + tail


def corpus(prompts: Iterable[str], turns: Iterable[Sequence[tuple[str, str]]]) -> list[str]:
  """Texts to train a BPE on: prompts, actions and observations of demonstrations."""
  out = []
  for prompt, episode in zip(prompts, turns, strict=True):
    out.append(prompt_text(prompt))
    for action, observation in episode:
      out.append(action + END_ACTION)
      out.append(observation_text(observation))
  return out

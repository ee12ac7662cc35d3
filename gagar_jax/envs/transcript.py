"""How an episode becomes tokens, through the policy's own chat template.

    fmt = AgentFormat(tok, system=system_message())   # or system=None
    ids = fmt.prompt_ids(prompt)                       # [system,] user, generation prompt
    ids += sampled action tokens                       # the policy's own (masked in)
    ids += fmt.observation_ids(obs, max_tokens, after_end_of_turn=...)

The segments are cut out of full renderings of the template (`transformers`'
`apply_chat_template`, see `models/chat_template.py`), so a stock checkpoint sees
its own format: the prompt is the rendering of `[system, user]` with the generation
prompt; an observation segment is what the template writes between an assistant
message and the next generation prompt when a tool message comes in between (the
assistant's end-of-turn marker, the tool turn, the next assistant header). Segments
are encoded separately, exactly as a rollout builds its context, so a demonstration
teaches the policy the token sequences it will itself produce and see.

An action ends at a stop string on the decoded text (`<|end_action|>`), at EOS, or at
the template's end-of-turn token (`<|im_end|>`, `<|eot_id|>`, found by rendering),
so a stock tokenizer needs no new token. When the policy ended with the end-of-turn
token, the observation segment starts after it (the token is the policy's own).

The project's tokenizers carry `GAGAR_TEMPLATE` and the `<|end_action|>` special token:

    <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n
    {action}<|end_action|>
    \\n<|im_start|>tool\\n{observation}<|im_end|>\\n<|im_start|>assistant\\n
    {action}<|end_action|> ...
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gagar_jax.models import chat_template as chat_lib
from gagar_jax.models import tokenizers

END_ACTION = tokenizers.END_ACTION
SPECIALS = (*tokenizers.DEFAULT_SPECIALS, END_ACTION)
SYSTEM_MODES = ("auto", "grammar", "none")

# Stand-ins whose position in a rendering marks where the segments are cut.
_ACTION = "\u2063GAGAR_ACTION\u2063"
_OBSERVATION = "\u2063GAGAR_OBSERVATION\u2063"
_USER = "\u2063GAGAR_USER\u2063"
_OBSERVATION_ROLES = ("tool", "ipython", "user")


def system_message() -> str:
  """What an instruct model is told: the task, the action grammar, one worked example."""
  return (
    "You are a coding agent. You fix an issue in a small Python repository by "
    "taking actions, one per message; each gets a reply with its result.\n"
    "Actions (write only the action, then end your message):\n"
    "  view <path>                      show a file with line numbers\n"
    "  replace <func>: <old> => <new>   replace text <old> (unique in function <func>)\n"
    "  insert <func>: <code>            add a first line to <func>'s body\n"
    "  insert <path> <n>: <code>        add a line before line <n>\n"
    "  delete <path> <n>                delete line <n>\n"
    "  write <path>                     replace the whole file with the lines after it\n"
    "  test                             run the visible tests\n"
    "  submit                           finish; the hidden tests grade the files\n"
    "Example. Issue: add(a, b) returns a - b. Your messages, each followed by its "
    "result:\n"
    "  replace add: a - b => a + b      -> ok: calc.py line 2 is now: return a + b\n"
    "  test                             -> 3 passed, 0 failed\n"
    "  submit"
  )


def resolve_system(tok, mode: str) -> str | None:
  """The system message for `mode`: auto = the grammar unless the tokenizer's vocabulary
  has the end-of-action token (the project's policies learn the format from demos)."""
  if mode not in SYSTEM_MODES:
    raise ValueError(f"system_prompt={mode!r}: must be one of {SYSTEM_MODES}")
  if mode == "auto":
    mode = "none" if END_ACTION in getattr(tok, "special_tokens", {}) else "grammar"
  return system_message() if mode == "grammar" else None


class AgentFormat:
  """The token segments of agent episodes for one tokenizer and its chat template.

  Args:
    tok: a tokenizer with a `template` (see `models/tokenizers.py`).
    system: the system message (None: none). A template without a system role gets it
      at the top of the user message.

  Raises:
    chat_template.TemplateError: no template, or it cannot render an agent episode.
  """

  def __init__(self, tok, system: str | None = None):
    if tok.template is None:
      raise chat_lib.TemplateError(
        f"{getattr(tok, 'name', 'the tokenizer')} has no chat template "
        "(give one with the config's chat_template)"
      )
    self.tok, self.template = tok, tok.template
    self.system = system
    self.system_in_user = False
    if system is not None:
      try:
        text = self.template.render(self._head(_USER), add_generation_prompt=True)
        self.system_in_user = system not in text
      except chat_lib.TemplateError:
        self.system_in_user = True
    self.observation_role = self._probe_observation_role()
    base = self._render([{"role": "assistant", "content": _ACTION}], False)
    after_action = base.split(_ACTION)[-1]
    full = self._render(
      [
        {"role": "assistant", "content": _ACTION},
        {"role": self.observation_role, "content": _OBSERVATION},
      ],
      True,
    )
    segment = full.split(_ACTION)[-1]
    self.observation_head, self.observation_tail = segment.split(_OBSERVATION)
    # The end-of-turn token: the first special token the template writes after an
    # assistant message (none for GAGAR_TEMPLATE, whose actions end with their marker).
    specials = set(getattr(tok, "special_tokens", {}).values())
    self.end_of_turn = next((i for i in tok.encode(after_action) if i in specials), None)
    self.end_action = getattr(tok, "special_tokens", {}).get(END_ACTION)
    self._head_ids = tok.encode(self.observation_head)
    self._tail_ids = tok.encode(self.observation_tail)

  # -- rendering ------------------------------------------------------------------------
  def _head(self, user: str) -> list[dict]:
    if self.system is None:
      return [{"role": "user", "content": user}]
    if self.system_in_user:
      return [{"role": "user", "content": f"{self.system}\n\n{user}"}]
    return [{"role": "system", "content": self.system}, {"role": "user", "content": user}]

  def _render(self, rest: list[dict], add_generation_prompt: bool, user: str = _USER) -> str:
    return self.template.render(
      self._head(user) + rest, add_generation_prompt=add_generation_prompt
    )

  def _probe_observation_role(self) -> str:
    errors = []
    for role in _OBSERVATION_ROLES:
      try:
        text = self._render(
          [
            {"role": "assistant", "content": _ACTION},
            {"role": role, "content": _OBSERVATION},
          ],
          True,
        )
      except chat_lib.TemplateError as e:
        errors.append(str(e))
        continue
      if _ACTION in text and _OBSERVATION in text.split(_ACTION)[-1]:
        return role
    raise chat_lib.TemplateError(
      f"{self.template.name} renders no tool result after an assistant message "
      f"(tried roles {_OBSERVATION_ROLES}): {'; '.join(errors) or 'the content is dropped'}"
    )

  # -- segments -------------------------------------------------------------------------
  def prompt_ids(self, prompt: str) -> list[int]:
    """The first context: [system,] user `prompt`, then the assistant's generation prompt."""
    return self.tok.encode(self._render([], True, user=prompt))

  @property
  def stop_token_ids(self) -> tuple[int, ...]:
    """Single tokens that end an action inside the decode loop (besides EOS)."""
    return tuple(i for i in (self.end_action, self.end_of_turn) if i is not None)

  @property
  def stop_strings(self) -> tuple[str, ...]:
    """Text that ends an action wherever the tokens split it."""
    return (END_ACTION,)

  def end_ids(self) -> list[int]:
    """How a demonstrated action ends: the end-of-action token, else the end-of-turn
    token, else the stop string's tokens."""
    for i in (self.end_action, self.end_of_turn):
      if i is not None:
        return [i]
    return self.tok.encode(END_ACTION)

  def action_text(self, ids: Sequence[int]) -> str:
    """The action in sampled tokens: without a final EOS / end-of-turn token, cut at the
    first stop string."""
    ids = list(ids)
    if ids and ids[-1] in (self.tok.eos_id, self.end_of_turn):
      ids = ids[:-1]
    text = self.tok.decode(ids)
    for stop in self.stop_strings:
      text = text.split(stop)[0]
    return text

  def observation_ids(
    self, observation: str, max_tokens: int | None = None, *, after_end_of_turn: bool = False
  ) -> list[int]:
    """The segment between an action and the next: the body is cut to `max_tokens`
    (the markers are kept). `after_end_of_turn`: the action's last token was the
    end-of-turn token, so the segment starts after the template's."""
    head = self._head_ids
    if after_end_of_turn and self.end_of_turn in head:
      at = head.index(self.end_of_turn)
      if not self.tok.decode(head[:at]).strip():
        head = head[at + 1 :]
    body = self.tok.encode(observation)
    if max_tokens is not None and len(body) > max_tokens:
      body = body[:max_tokens] + self.tok.encode(" ...")
    return head + body + self._tail_ids

  def encode_episode(
    self, prompt: str, turns: Sequence[tuple[str, str]], *, max_obs_tokens: int | None = None
  ) -> tuple[list[int], list[bool]]:
    """(token ids, policy mask) of a whole episode; `turns` = [(action, observation)].

    The last turn's observation (after `submit`) is not appended.
    """
    end = self.end_ids()
    ids = self.prompt_ids(prompt)
    mask = [False] * len(ids)
    for i, (action, observation) in enumerate(turns):
      a = self.tok.encode(action) + end
      ids += a
      mask += [True] * len(a)
      if i + 1 < len(turns):
        o = self.observation_ids(
          observation, max_obs_tokens, after_end_of_turn=end == [self.end_of_turn]
        )
        ids += o
        mask += [False] * len(o)
    return ids, mask


def corpus(prompts: Iterable[str], turns: Iterable[Sequence[tuple[str, str]]]) -> list[str]:
  """Texts to train the project's BPE on: prompts, actions and observations of
  demonstrations, in `GAGAR_TEMPLATE`'s format."""
  start, end = tokenizers.IM_START, tokenizers.IM_END
  out = []
  for prompt, episode in zip(prompts, turns, strict=True):
    out.append(f"{start}user\n{prompt}{end}\n{start}assistant\n")
    for action, observation in episode:
      out.append(action + END_ACTION)
      out.append(f"\n{start}tool\n{observation}{end}\n{start}assistant\n")
  return out

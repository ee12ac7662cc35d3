"""Tokenizers: a file-free byte tokenizer, a Hugging Face `tokenizers` adapter, BPE training.

All share one small interface (`Tokenizer`): `encode`, `decode`, `vocab_size`,
`pad_id`, `eos_id`, `token_id(special)`, `template` (a `chat_template.ChatTemplate`
or None) and `chat(messages)`, which renders a conversation through that template
(the checkpoint's own, as `transformers` does) and tokenizes it. Tokenizers the
project trains carry `chat_template.GAGAR_TEMPLATE`, its agent format. Special
tokens written literally in the text are encoded as single ids.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Sequence
from typing import Protocol

import tokenizers as hf

from gagar_jax import files
from gagar_jax.errors import InputError
from gagar_jax.models import chat_template as chat_lib

PAD = "<|pad|>"
EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_ACTION = "<|end_action|>"  # the project's end-of-action marker (envs/transcript.py)
DEFAULT_SPECIALS = (PAD, EOS, IM_START, IM_END)
# tokenizer_config.json entries a chat template may refer to.
_TEMPLATE_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token")


def _token_text(value):
  """A tokenizer_config token entry (a string or an AddedToken dict) as text."""
  return value.get("content") if isinstance(value, dict) else value


class Tokenizer(Protocol):
  vocab_size: int
  pad_id: int
  eos_id: int

  def encode(self, text: str) -> list[int]: ...

  def decode(self, ids: Sequence[int]) -> str: ...

  def token_id(self, token: str) -> int: ...

  def chat(self, messages: Sequence[dict], add_generation_prompt: bool = True) -> list[int]: ...


def _render_chat(tok, messages, add_generation_prompt: bool) -> list[int]:
  if tok.template is None:
    raise chat_lib.TemplateError(
      f"{tok.name} has no chat template (give one with the config's chat_template)"
    )
  return tok.encode(tok.template.render(messages, add_generation_prompt=add_generation_prompt))


class ByteTokenizer:
  """UTF-8 bytes are ids 0..255; special tokens follow. Needs no files."""

  def __init__(self, special_tokens: Sequence[str] = DEFAULT_SPECIALS, template: str | None = None):
    if len(set(special_tokens)) != len(special_tokens):
      raise ValueError(f"duplicate special tokens: {list(special_tokens)}")
    self.special_tokens = {t: 256 + i for i, t in enumerate(special_tokens)}
    self._id_to_special = {i: t for t, i in self.special_tokens.items()}
    self.vocab_size = 256 + len(special_tokens)
    self.pad_id = self.special_tokens.get(PAD, 0)
    self.eos_id = self.special_tokens.get(EOS, self.pad_id)
    names = sorted(self.special_tokens, key=len, reverse=True)
    self._split = re.compile("(" + "|".join(re.escape(t) for t in names) + ")") if names else None
    self.name = "byte tokenizer"
    self.template = chat_lib.ChatTemplate(
      template or chat_lib.GAGAR_TEMPLATE, {"eos_token": self._id_to_special.get(self.eos_id)}
    )

  def encode(self, text: str) -> list[int]:
    parts = self._split.split(text) if self._split else [text]
    ids: list[int] = []
    for part in parts:
      if part in self.special_tokens:
        ids.append(self.special_tokens[part])
      else:
        ids.extend(part.encode("utf-8"))
    return ids

  def decode(self, ids: Sequence[int]) -> str:
    out, buf = [], bytearray()
    for i in ids:
      i = int(i)
      if i < 256:
        buf.append(i)
        continue
      out.append(buf.decode("utf-8", errors="replace"))
      buf = bytearray()
      out.append(self._id_to_special.get(i, ""))
    out.append(buf.decode("utf-8", errors="replace"))
    return "".join(out)

  def token_id(self, token: str) -> int:
    if token not in self.special_tokens:
      raise KeyError(f"{token!r} is not a special token of this tokenizer")
    return self.special_tokens[token]

  def chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
    return _render_chat(self, messages, add_generation_prompt)


class HFTokenizer:
  """Adapter over a Hugging Face `tokenizers.Tokenizer` (a `tokenizer.json`)."""

  def __init__(
    self,
    tokenizer: hf.Tokenizer,
    *,
    eos_token: str | None = None,
    pad_token: str | None = None,
    template: str | None = None,
    config: dict | None = None,
    name: str = "tokenizer",
  ):
    self._tok = tokenizer
    self.name = name
    # tokenizer_config.json as read (kept on save), and the template's special-token names.
    self.config = dict(config or {})
    self.special_tokens = {
      t.content: i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
    }
    self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
    eos_token = eos_token or next(
      (
        t
        for t in (IM_END, EOS, "<|eot_id|>", "<|end_of_text|>", "</s>")
        if t in self.special_tokens
      ),
      None,
    )
    if eos_token is None:
      raise ValueError("no EOS token: pass eos_token= (the tokenizer has no known end token)")
    self.eos_id = self.token_id(eos_token)
    pad_token = pad_token or next((t for t in (PAD, EOS) if t in self.special_tokens), eos_token)
    self.pad_id = self.token_id(pad_token)
    inv = {i: t for t, i in self.special_tokens.items()}
    names = {k: _token_text(self.config.get(k)) for k in _TEMPLATE_TOKENS}
    names.update(eos_token=inv.get(self.eos_id), pad_token=inv.get(self.pad_id))
    self.template_tokens = {k: v for k, v in names.items() if v}
    self.template = None
    if template is not None:
      self.set_template(template)

  def set_template(self, source: str, name: str = "") -> None:
    """Uses Jinja `source` as the chat template (it must compile)."""
    self.template = chat_lib.ChatTemplate(
      source, self.template_tokens, name=name or f"{self.name} chat template"
    )

  @classmethod
  def from_file(cls, path: str, chat_template: str = "") -> HFTokenizer:
    """Loads `tokenizer.json` (a file, or a model folder holding it).

    Reads `eos_token` / `pad_token` / `bos_token` from a `tokenizer_config.json` beside
    it, and the chat template from `chat_template.jinja` or that config. `chat_template`
    (a `.jinja` path or Jinja text) replaces the folder's. A folder of the project's own
    format written before templates were saved (its vocabulary has `<|end_action|>`)
    gets `GAGAR_TEMPLATE`.
    """
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    if not os.path.exists(file):
      raise InputError(file, "file not found (a tokenizer.json was expected)")
    kwargs, config = {}, {}
    config_file = os.path.join(folder, "tokenizer_config.json")
    if os.path.exists(config_file):
      config = files.read_json(config_file)
      for key in ("eos_token", "pad_token"):
        if value := _token_text(config.get(key)):
          kwargs[key] = value
    try:
      backend = hf.Tokenizer.from_file(file)
    except Exception as e:  # the tokenizers library raises a bare Exception for a bad file
      raise InputError(file, f"is not a readable tokenizer.json ({e})") from None
    tok = cls(backend, config=config, name=f"tokenizer in {folder}", **kwargs)
    if chat_template:
      source, where = chat_lib.load_source(chat_template)
    else:
      source, where = chat_lib.read_source(folder)
      if source is None and END_ACTION in tok.special_tokens:
        source, where = chat_lib.GAGAR_TEMPLATE, "the project's agent format"
    if source is not None:
      tok.set_template(source, name=f"chat template ({where})")
    return tok

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def decode(self, ids: Sequence[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  def token_id(self, token: str) -> int:
    i = self._tok.token_to_id(token)
    if i is None:
      raise KeyError(f"{token!r} is not in the vocabulary")
    return i

  def chat(self, messages, add_generation_prompt: bool = True) -> list[int]:
    return _render_chat(self, messages, add_generation_prompt)

  def save(self, path: str) -> None:
    """Writes `tokenizer.json`, `tokenizer_config.json` (the one read, updated) and the
    chat template (`chat_template.jinja`, where `transformers` writes it) into `path`."""
    os.makedirs(path, exist_ok=True)
    self._tok.save(os.path.join(path, "tokenizer.json"))
    inv = {i: t for t, i in self.special_tokens.items()}
    config = {k: v for k, v in self.config.items() if k != "chat_template"}
    config.update(eos_token=inv.get(self.eos_id), pad_token=inv.get(self.pad_id))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
      json.dump(config, f, indent=2)
    if self.template is not None:
      with open(os.path.join(path, chat_lib.TEMPLATE_FILE), "w") as f:
        f.write(self.template.source)


def train_bpe(
  texts: Iterable[str],
  vocab_size: int,
  special_tokens: Sequence[str] = DEFAULT_SPECIALS,
  *,
  min_frequency: int = 2,
  eos_token: str = EOS,
) -> HFTokenizer:
  """Trains a byte-level BPE on `texts` (every byte stays encodable).

  Special tokens get the first ids, in order. Deterministic for the same texts.
  """
  if vocab_size < 256 + len(special_tokens):
    raise ValueError(
      f"vocab_size={vocab_size} is below the 256 byte tokens plus "
      f"{len(special_tokens)} special tokens"
    )
  tok = hf.Tokenizer(hf.models.BPE())
  tok.pre_tokenizer = hf.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = hf.decoders.ByteLevel()
  trainer = hf.trainers.BpeTrainer(
    vocab_size=vocab_size,
    min_frequency=min_frequency,
    special_tokens=list(special_tokens),
    initial_alphabet=hf.pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(texts, trainer=trainer)
  pad = PAD if PAD in special_tokens else eos_token
  return HFTokenizer(tok, eos_token=eos_token, pad_token=pad, template=chat_lib.GAGAR_TEMPLATE)

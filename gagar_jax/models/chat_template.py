"""Chat templates: a checkpoint's Jinja template, rendered as `transformers` renders it.

    template = ChatTemplate(source, special_tokens={"bos_token": "<s>", "eos_token": "</s>"})
    text = template.render(messages, add_generation_prompt=True)

The environment matches `transformers`' `apply_chat_template`: a sandboxed Jinja
environment with `trim_blocks` / `lstrip_blocks`, the `loopcontrols` extension, the
`{% generation %}` block (rendered as its body), a `tojson` filter that keeps
non-ASCII text, and the `raise_exception` / `strftime_now` globals; the tokenizer's
special tokens (`bos_token`, `eos_token`, ...) are template variables. The rendered
text is tokenized without adding special tokens (the template writes them).

Where a folder keeps its template (what `transformers` reads, newest first):
`chat_template.jinja`, else `tokenizer_config.json["chat_template"]` (a string, or a
list of named templates of which "default" is used).
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Mapping, Sequence

import jinja2
import jinja2.ext
import jinja2.sandbox

TEMPLATE_FILE = "chat_template.jinja"

# The project's own agent format (the tiny policies' tokenizers carry it): a turn ends
# with the policy's end-of-action marker, so the assistant message is its content only.
GAGAR_TEMPLATE = (
  "{%- for message in messages -%}"
  "{%- if message['role'] == 'assistant' -%}"
  "{{- '<|im_start|>assistant\\n' + message['content'] -}}"
  "{%- elif message['role'] == 'tool' -%}"
  "{{- '\\n<|im_start|>tool\\n' + message['content'] + '<|im_end|>\\n' -}}"
  "{%- else -%}"
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
  "{%- endif -%}"
  "{%- endfor -%}"
  "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


class TemplateError(ValueError):
  """A chat template that does not compile or does not render these messages."""


class _Generation(jinja2.ext.Extension):
  """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask markers)."""

  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.Scope(body, lineno=lineno)


def _raise(message):
  raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  return json.dumps(
    x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
  )


def _environment() -> jinja2.sandbox.ImmutableSandboxedEnvironment:
  env = jinja2.sandbox.ImmutableSandboxedEnvironment(
    trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
  )
  env.filters["tojson"] = _tojson
  env.globals["raise_exception"] = _raise
  env.globals["strftime_now"] = lambda fmt: datetime.datetime.now().strftime(fmt)
  return env


class ChatTemplate:
  """A compiled chat template and the special-token variables it may use.

  Args:
    source: the Jinja source.
    special_tokens: template variables such as `bos_token` / `eos_token` (strings).
    name: where the template came from, for error messages.
  """

  def __init__(self, source: str, special_tokens: Mapping[str, str] | None = None, name=""):
    self.source = source
    self.name = name or "chat template"
    self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
    try:
      self._template = _environment().from_string(source)
    except jinja2.TemplateError as e:
      raise TemplateError(f"{self.name} does not compile: {e}") from None

  def render(
    self,
    messages: Sequence[Mapping],
    *,
    add_generation_prompt: bool = False,
    tools: Sequence[Mapping] | None = None,
    **kwargs,
  ) -> str:
    """The conversation as text (what `apply_chat_template(..., tokenize=False)` gives)."""
    try:
      return self._template.render(
        messages=[dict(m) for m in messages],
        tools=list(tools) if tools is not None else None,
        documents=None,
        add_generation_prompt=add_generation_prompt,
        **{**self.special_tokens, **kwargs},
      )
    except jinja2.TemplateError as e:
      roles = [m.get("role") for m in messages]
      raise TemplateError(f"{self.name} fails to render roles {roles}: {e}") from None
    except Exception as e:  # a template bug (e.g. indexing a missing field)
      raise TemplateError(f"{self.name} fails to render: {type(e).__name__}: {e}") from None


def read_source(folder: str) -> tuple[str | None, str]:
  """(template source or None, where it was found) of a tokenizer / model folder."""
  file = os.path.join(folder, TEMPLATE_FILE)
  if os.path.exists(file):
    with open(file) as f:
      return f.read(), file
  config_file = os.path.join(folder, "tokenizer_config.json")
  if os.path.exists(config_file):
    with open(config_file) as f:
      value = json.load(f).get("chat_template")
    if isinstance(value, list):  # named templates: [{"name": ..., "template": ...}]
      named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
      value = named.get("default")
    if isinstance(value, str) and value:
      return value, f"{config_file}:chat_template"
  return None, folder


def load_source(spec: str) -> tuple[str, str]:
  """A template given in a config: a path to a `.jinja` file, or the Jinja text itself."""
  if "{" not in spec and os.path.exists(spec):
    with open(spec) as f:
      return f.read(), spec
  if "{" not in spec:
    raise TemplateError(f"chat_template {spec!r}: no such file (and not Jinja text)")
  return spec, "config chat_template"

"""Regenerates the tiny Hugging Face checkpoints and `transformers` references in this folder.

Needs `torch` and `transformers` (not project dependencies), e.g.:

    python3.11 -m venv /tmp/ref && /tmp/ref/bin/pip install torch==2.13.0 transformers==5.23.0
    /tmp/ref/bin/python tests/data/hf_tiny/make_reference.py

Writes, per architecture, a complete HF folder as `transformers` saves one:
`config.json`, safetensors weights (the Llama one sharded, with
`model.safetensors.index.json`), `tokenizer.json` (a byte-level BPE trained here),
`tokenizer_config.json` and the chat template: a Qwen2.5-style ChatML template with
tools inside `tokenizer_config.json` (qwen2), a Llama-3-style header template in
`chat_template.jinja` (llama). Weights are random but far from the default 0.02 init
(biases and norm scales too) so that a mis-mapped tensor shows in the logits. Beside
them: `reference.npz` (input tokens and the float32 `transformers` logits) and
`reference_prompts.json` (conversations, `apply_chat_template` text and token ids).

    /tmp/ref/bin/python tests/data/hf_tiny/make_reference.py --check_export=DIR [--record=F]

loads an exported folder (`experiments/export_hf.py`) with `transformers` and prints
its logits and chat rendering; with `--record`, writes them and the sha256 of every
file to F (`export_pre_rl.npz` / `.json` here, made from `assets/pre_rl`), which
`tests/test_hf_checkpoints.py` compares the project's own export and logits against.
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import tokenizers as tk
import torch
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", "..", ".."))

QWEN_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LLAMA_TEMPLATE = """{{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if message.role in ['ipython', 'tool'] %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or (message.content is iterable and message.content is not string) %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

SPECIALS = {
  "qwen2": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
  "llama": [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
  ],
}
BPE_VOCAB = 1024
TOOLS = [
  {
    "type": "function",
    "function": {
      "name": "view",
      "description": "Show a file with line numbers.",
      "parameters": {
        "type": "object",
        "properties": {"path": {"type": "string", "description": "the file"}},
        "required": ["path"],
      },
    },
  }
]
CONVERSATIONS = [
  ([{"role": "user", "content": "Issue: add(2, 3) returns -1"}], True, False),
  (
    [
      {"role": "system", "content": "You are a coding agent. Actions: view <path> | submit"},
      {"role": "user", "content": "Issue: add(2, 3) returns -1\ncalc.py:\ndef add(a, b):"},
    ],
    True,
    False,
  ),
  (
    [
      {"role": "system", "content": "Fix the bug."},
      {"role": "user", "content": "Issue: total() skips the last item"},
      {"role": "assistant", "content": "view shop.py  "},
      {"role": "tool", "content": "1 def total(xs):\n2     return sum(xs[:-1])"},
    ],
    True,
    False,
  ),
  (
    [
      {"role": "user", "content": "Issue: é ünïcode ✓"},
      {"role": "assistant", "content": "replace f: a - b => a + b"},
      {"role": "tool", "content": "ok: calc.py line 2 is now: return a + b"},
      {"role": "assistant", "content": "submit"},
    ],
    False,
    False,
  ),
  (
    [
      {"role": "system", "content": "Use the tools."},
      {"role": "user", "content": "Show calc.py"},
      {
        "role": "assistant",
        "content": "",
        "tool_calls": [
          {"type": "function", "function": {"name": "view", "arguments": {"path": "calc.py"}}}
        ],
      },
      {"role": "tool", "content": "1 def add(a, b):"},
    ],
    True,
    True,
  ),
]


def corpus() -> list[str]:
  """The BPE's training text: the repository's environment sources (code and prose)."""
  out = []
  folder = os.path.join(REPO, "gagar_jax", "envs")
  for name in sorted(os.listdir(folder)):
    if name.endswith(".py"):
      with open(os.path.join(folder, name)) as f:
        out += f.read().split("\n\n")
  return out


def make_tokenizer(arch: str) -> transformers.PreTrainedTokenizerFast:
  tok = tk.Tokenizer(tk.models.BPE())
  tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tok.decoder = tk.decoders.ByteLevel()
  trainer = tk.trainers.BpeTrainer(
    vocab_size=BPE_VOCAB,
    special_tokens=SPECIALS[arch],
    initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
    show_progress=False,
  )
  tok.train_from_iterator(corpus(), trainer=trainer)
  if arch == "llama":  # Llama 3 prepends BOS when special tokens are added
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = tk.processors.TemplateProcessing(
      single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)]
    )
    return transformers.PreTrainedTokenizerFast(
      tokenizer_object=tok,
      bos_token="<|begin_of_text|>",
      eos_token="<|eot_id|>",
      chat_template=LLAMA_TEMPLATE,
    )
  return transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok,
    eos_token="<|im_end|>",
    pad_token="<|endoftext|>",
    chat_template=QWEN_TEMPLATE,
  )


def model_config(arch: str, vocab: int):
  if arch == "qwen2":
    return transformers.Qwen2Config(
      vocab_size=vocab + 8,  # like Qwen, the embedding has spare rows
      hidden_size=64,
      intermediate_size=96,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      rope_theta=1_000_000.0,
      rms_norm_eps=1e-6,
      tie_word_embeddings=True,
      max_position_embeddings=4096,
      eos_token_id=None,
    )
  return transformers.LlamaConfig(
    vocab_size=vocab,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
    attention_bias=False,
    max_position_embeddings=4096,
    rope_parameters={
      "rope_type": "llama3",
      "rope_theta": 500_000.0,
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 16,
    },
  )


def chat_ids(tok, messages, add_generation_prompt, tools=None) -> list[int]:
  out = tok.apply_chat_template(
    messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=True
  )
  if isinstance(out, dict) or hasattr(out, "keys"):  # transformers 5 returns a BatchEncoding
    out = out["input_ids"]
  return [int(i) for i in out]


def render_cases(tok, with_tools: bool) -> list[dict]:
  cases = []
  for messages, gen, needs_tools in CONVERSATIONS:
    if needs_tools and not with_tools:
      continue
    tools = TOOLS if needs_tools else None
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=gen, tokenize=False)
    cases.append(
      {
        "messages": messages,
        "add_generation_prompt": gen,
        "tools": tools,
        "text": text,
        "ids": chat_ids(tok, messages, gen, tools),
      }
    )
  return cases


def make(arch: str) -> None:
  out = os.path.join(HERE, arch)
  for name in os.listdir(out) if os.path.isdir(out) else ():
    if name != "README.md":
      os.remove(os.path.join(out, name))
  tok = make_tokenizer(arch)
  config = model_config(arch, len(tok))
  config._attn_implementation = "eager"
  model = transformers.AutoModelForCausalLM.from_config(config).to(torch.float32).eval()
  with torch.no_grad():
    for pname, p in model.named_parameters():
      if "norm" in pname:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      else:
        p.copy_(0.15 * torch.randn_like(p))
  # Llama is written in shards to exercise the index file.
  model.save_pretrained(out, max_shard_size="100KB" if arch == "llama" else "10GB")
  tok.save_pretrained(out)
  if arch == "qwen2":  # this one keeps its template inside tokenizer_config.json
    template_file = os.path.join(out, "chat_template.jinja")
    if os.path.exists(template_file):
      os.remove(template_file)
    with open(os.path.join(out, "tokenizer_config.json")) as f:
      tc = json.load(f)
    tc["chat_template"] = QWEN_TEMPLATE
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
      json.dump(tc, f, indent=2)
  # transformers 5 rebuilds a model type's tokenizer pipeline (Qwen2: NFC and its split
  # regex) over tokenizer.json; write back what it uses, as a real checkpoint has it.
  tok = transformers.AutoTokenizer.from_pretrained(out)
  tok.backend_tokenizer.save(os.path.join(out, "tokenizer.json"))
  # References from the folder as written (what a user's `from_pretrained` sees).
  tok = transformers.AutoTokenizer.from_pretrained(out)
  with open(os.path.join(out, "tokenizer.json")) as f:
    assert json.loads(tok.backend_tokenizer.to_str()) == json.load(f), "tokenizer.json drifts"
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, config.vocab_size, size=(2, 24)).astype(np.int32)
  with torch.no_grad():
    logits = model(torch.from_numpy(tokens).long()).logits.float().numpy()
  np.savez(os.path.join(out, "reference.npz"), tokens=tokens, logits=logits)
  with open(os.path.join(out, "reference_prompts.json"), "w") as f:
    json.dump(render_cases(tok, with_tools=arch == "qwen2"), f, indent=1, ensure_ascii=False)
  print(
    f"{arch}: {sorted(os.listdir(out))}, tokenizer {len(tok)}, embedding {config.vocab_size}, "
    f"logits absmax {np.abs(logits).max():.2f}",
    file=sys.stderr,
  )


def check_export(folder: str, record: str) -> None:
  """Loads an exported folder with transformers; prints (and records) what it gives."""
  tok = transformers.AutoTokenizer.from_pretrained(folder)
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, len(tok), size=(2, 32)).astype(np.int32)
  with torch.no_grad():
    logits = model(torch.from_numpy(tokens).long()).logits.float().numpy()
  messages = [
    {"role": "user", "content": "Issue: add(2, 3) returns -1"},
    {"role": "assistant", "content": "replace add: a - b => a + b<|end_action|>"},
    {"role": "tool", "content": "ok: calc.py line 2 is now: return a + b"},
  ]
  text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  print(f"{folder}: {type(model).__name__}, {type(tok).__name__} of {len(tok)} tokens")
  print(f"logits {logits.shape}, absmax {np.abs(logits).max():.3f}; rendered {text!r}")
  if record:
    files = {
      name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
      for name in sorted(os.listdir(folder))
    }
    np.savez(record + ".npz", tokens=tokens, logits=logits)
    with open(record + ".json", "w") as f:
      json.dump(
        {
          "files": files,
          "messages": messages,
          "text": text,
          "ids": chat_ids(tok, messages, True),
          "model_class": type(model).__name__,
          "transformers": transformers.__version__,
          "torch": torch.__version__,
        },
        f,
        indent=1,
      )
    print(f"recorded {record}.npz / .json")


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--check_export", default="")
  parser.add_argument("--record", default="")
  args = parser.parse_args()
  if args.check_export:
    check_export(args.check_export, args.record)
    return
  torch.manual_seed(0)
  for arch in ("qwen2", "llama"):
    make(arch)
  print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)


if __name__ == "__main__":
  main()
# ruff: noqa: E501 (the chat templates are kept as their authors format them)

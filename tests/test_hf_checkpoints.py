"""Hugging Face checkpoints in and out: templates as `transformers` renders them, the agent's
episode format in a stock template, checks before compute, RL / SFT from an HF folder, and
export back (to what `transformers` loads).

The folders and references come from `tests/data/hf_tiny/make_reference.py` (run with
torch + transformers, which are not project dependencies; see its docstring).
"""

import dataclasses
import hashlib
import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from configs import gagar as gagar_config
from configs import sft as sft_config
from gagar_jax import configlib, policy_io, rollout, sft, sharding, trainer
from gagar_jax.envs import minirepo, tools, transcript
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.errors import ConfigError
from gagar_jax.learner.config import LearnerConfig
from gagar_jax.learner.learner import Learner
from gagar_jax.models import hf_export, tokenizers, transformer
from tests.conftest import REPO
from tests.test_end_to_end import _run

DATA = os.path.join(REPO, "tests", "data", "hf_tiny")
ARCHS = ("qwen2", "llama")
END_OF_TURN = {"qwen2": "<|im_end|>", "llama": "<|eot_id|>"}


def _folder(arch):
  return os.path.join(DATA, arch)


@pytest.mark.parametrize("arch", ARCHS)
def test_templates_render_like_transformers(arch):
  tok = tokenizers.HFTokenizer.from_file(_folder(arch))
  # Qwen keeps its template in tokenizer_config.json, Llama in chat_template.jinja.
  where = "tokenizer_config.json" if arch == "qwen2" else "chat_template.jinja"
  assert where in tok.template.name
  cases = json.load(open(os.path.join(_folder(arch), "reference_prompts.json")))
  assert len(cases) >= 4 and any(c["add_generation_prompt"] for c in cases)
  assert any(m["role"] == "tool" for c in cases for m in c["messages"])
  for case in cases:
    text = tok.template.render(
      case["messages"], add_generation_prompt=case["add_generation_prompt"], tools=case["tools"]
    )
    assert text == case["text"]
    assert tok.encode(text) == case["ids"]
    if case["tools"] is None:
      assert tok.chat(case["messages"], case["add_generation_prompt"]) == case["ids"]
  if arch == "llama":  # the template writes BOS itself
    assert cases[0]["text"].startswith("<|begin_of_text|>")


@pytest.mark.parametrize("arch", ARCHS)
def test_agent_episode_follows_the_checkpoint_template(arch):
  tok = tokenizers.HFTokenizer.from_file(_folder(arch))
  assert transcript.END_ACTION not in tok.special_tokens  # a stock vocabulary: no new token
  fmt = transcript.AgentFormat(tok, transcript.resolve_system(tok, "auto"))
  assert fmt.system == transcript.system_message() and "replace <func>" in fmt.system
  assert fmt.observation_role == "tool" and not fmt.system_in_user
  eot = tok.token_id(END_OF_TURN[arch])
  assert fmt.end_of_turn == eot and fmt.end_ids() == [eot] and eot in fmt.stop_token_ids
  turns = [
    ("view calc.py", "1 def add(a, b):\n2     return a - b"),
    ("replace add: a - b => a + b", "ok: calc.py line 2 is now: return a + b"),
    ("submit", ""),
  ]
  ids, mask = fmt.encode_episode("Issue: add(2, 3) returns -1", turns, max_obs_tokens=64)
  # The segments are the template's own rendering of the whole conversation.
  messages = [
    {"role": "system", "content": fmt.system},
    {"role": "user", "content": "Issue: add(2, 3) returns -1"},
  ]
  for k, (action, obs) in enumerate(turns):
    messages.append({"role": "assistant", "content": action})
    if k + 1 < len(turns):
      messages.append({"role": "tool", "content": obs})
  full = tok.template.render(messages, add_generation_prompt=False)
  text = tok.decode(ids)
  assert full.startswith(text) and not full[len(text) :].strip(), (text, full)
  # The policy's tokens are exactly its actions, each ended by the end-of-turn token.
  policy = [i for i, m in zip(ids, mask, strict=True) if m]
  assert policy == sum((tok.encode(a) + [eot] for a, _ in turns), [])
  # A long observation is cut, the template's markers kept.
  cut = tok.decode(fmt.observation_ids("x " * 400, 16))
  assert cut.startswith(fmt.observation_head) and cut.endswith(fmt.observation_tail)
  assert cut.count("x") < 40
  # After a stop-string ending (no end-of-turn token sampled) the template's comes next.
  obs = fmt.observation_ids("ok", None, after_end_of_turn=False)
  assert obs[0] == eot and fmt.observation_ids("ok", None, after_end_of_turn=True) == obs[1:]
  assert fmt.action_text(tok.encode("view calc.py<|end_action|> trailing") + [eot]) == (
    "view calc.py"
  )


def test_project_format_is_unchanged():
  """The committed tiny policy renders exactly the format it was trained on."""
  tok = tokenizers.HFTokenizer.from_file(os.path.join(REPO, "assets", "pre_rl", "tokenizer"))
  fmt = transcript.AgentFormat(tok, transcript.resolve_system(tok, "auto"))
  assert fmt.system is None and fmt.end_of_turn is None
  assert fmt.stop_token_ids == (tok.token_id(transcript.END_ACTION),)
  ids, mask = fmt.encode_episode(
    "Issue: x", [("view a.py", "1 y"), ("submit", "")], max_obs_tokens=64
  )
  assert tok.decode(ids) == (
    "<|im_start|>user\nIssue: x<|im_end|>\n<|im_start|>assistant\n"
    "view a.py<|end_action|>\n<|im_start|>tool\n1 y<|im_end|>\n<|im_start|>assistant\n"
    "submit<|end_action|>"
  )
  assert sum(mask) == len(tok.encode("view a.py")) + len(tok.encode("submit")) + 2


@pytest.fixture(scope="module")
def pool():
  with SandboxPool(SandboxConfig(workers=2, uid_base=66500)) as p:
    yield p


@pytest.fixture(scope="module")
def qwen():
  policy = policy_io.open_policy(_folder("qwen2"))
  return policy, policy_io.load_weights(policy)


def test_rollout_through_the_template_masks_exactly_the_sampled_tokens(qwen, pool):
  policy, params = qwen
  tok, config = policy.tok, policy.model_config
  mesh = sharding.make_mesh({"data": 1}, devices=jax.devices()[:1])
  learner = Learner(LearnerConfig(), config, mesh)
  cfg = rollout.RolloutConfig(
    group_size=2, max_turns=2, max_action_tokens=12, max_obs_tokens=24, max_episode_tokens=640
  )
  engine = rollout.RolloutEngine(cfg, config, learner.graphdef, tok, pool)
  fmt = engine.format
  task = minirepo.generate_task(7)
  params = jax.device_put(params)
  (group,) = engine.run(params, [task], jax.random.key(0))
  for t in group:
    prompt = fmt.prompt_ids(tools.Episode(task).prompt())
    assert t.tokens[: len(prompt)] == prompt and not any(t.mask[: len(prompt)])
    mask = np.asarray(t.mask, int)
    starts = np.flatnonzero(np.diff(np.r_[0, mask]) == 1)
    stops = np.flatnonzero(np.diff(np.r_[mask, 0]) == -1)
    assert len(starts) == len(t.turns) >= 1
    for k, (a, b) in enumerate(zip(starts, stops, strict=True)):
      sampled = t.tokens[a : b + 1]
      ended = sampled[-1] in (tok.eos_id, fmt.end_of_turn) or len(sampled) == 12
      assert ended or transcript.END_ACTION in tok.decode(sampled)
      assert fmt.action_text(sampled).strip() == t.turns[k].action
      if k + 1 < len(starts):  # the context up to the next action is the observation
        obs = fmt.observation_ids(
          t.turns[k].observation, 24, after_end_of_turn=sampled[-1] == fmt.end_of_turn
        )
        assert t.tokens[b + 1 : starts[k + 1]] == obs
  batch = rollout.to_arrays([group], 1, 2, cfg.max_episode_tokens)
  recomputed = np.asarray(learner.logprobs(params, batch.tokens))
  assert np.abs(np.where(batch.mask, recomputed - batch.logprobs, 0.0)).max() < 1e-4


def _hf_rl_config(folder, **overrides):
  config = gagar_config.get_config("runlocal=True")
  config.init_from = folder
  config.rollout.max_episode_tokens = 1024
  return configlib.set_dotted(config, overrides)


def test_hf_init_takes_the_shape_from_config_json():
  _, policy = trainer.parse_config(_hf_rl_config(_folder("llama")))
  c = policy.model_config
  assert (c.vocab_size, c.embed_dim, c.head_dim, c.tie_embeddings) == (1024, 64, 24, False)
  assert dict(c.rope_scaling)["factor"] == 8.0 and c.max_seq_len == 4096
  # Any size preset (they describe the project's policies); safe overrides apply.
  for size in ("small", "tiny"):
    config = gagar_config.get_config(f"size={size},demo=True")
    config.init_from, config.rollout.max_episode_tokens = _folder("qwen2"), 1024
    config.model.dtype, config.model.max_seq_len = "bfloat16", 2048
    policy = trainer.parse_config(config)[1]
    assert policy.model_config.embed_dim == 64 and policy.model_config.qkv_bias
    assert (policy.model_config.dtype, policy.model_config.max_seq_len) == ("bfloat16", 2048)
  config = sft_config.get_config("size=small")
  config.init_from = _folder("qwen2")
  config.sft.seq_len = config.rollout.max_episode_tokens = 1024
  sft.parse_config(config)


def _broken(tmp_path, arch="qwen2", edit_config=None, edit_tokenizer=None, drop=()):
  dst = tmp_path / f"{arch}_broken_{len(os.listdir(tmp_path))}"
  shutil.copytree(_folder(arch), dst)
  for name in drop:
    os.remove(dst / name)
  for name, edit in (("config.json", edit_config), ("tokenizer_config.json", edit_tokenizer)):
    if edit is not None:
      d = json.load(open(dst / name))
      edit(d)
      json.dump(d, open(dst / name, "w"))
  return str(dst)


def test_bad_hf_input_fails_before_compute(tmp_path):
  def fails(folder, field, pattern, **overrides):
    with pytest.raises(ConfigError, match=f"^{field}:.*{pattern}"):
      trainer.parse_config(_hf_rl_config(folder, **overrides))

  empty = tmp_path / "empty"
  empty.mkdir()
  fails(str(empty), "init_from", "neither a policy folder")
  fails(_broken(tmp_path, drop=("model.safetensors", "tokenizer.json")), "init_from", "lacks model")
  fails(
    _broken(tmp_path, edit_config=lambda d: d.update(architectures=["MistralForCausalLM"])),
    "init_from",
    "'MistralForCausalLM' is not supported",
  )
  no_template = _broken(tmp_path, edit_tokenizer=lambda d: d.pop("chat_template"))
  fails(no_template, "chat_template", "has no chat template")
  # ... unless the config supplies one.
  llama_template = os.path.join(_folder("llama"), "chat_template.jinja")
  trainer.parse_config(_hf_rl_config(no_template, chat_template=llama_template))
  fails(
    _broken(tmp_path, edit_config=lambda d: d.update(vocab_size=512)),
    "init_from",
    "1024 tokens but the embedding only 512 rows",
  )
  fails(
    _folder("qwen2"),
    "chat_template",
    "fails to render.*no system role",
    chat_template="{{ raise_exception('no system role') }}",
  )
  fails(_folder("qwen2"), "chat_template", "does not compile", chat_template="{% if %}")
  fails(_folder("llama"), "model.embed_dim", "contradicts", **{"model.embed_dim": 65})
  fails(_folder("llama"), "model.max_seq_len", "exceeds", **{"model.max_seq_len": 8192})


def _same_params(a, b):
  fa, fb = dict(nnx.to_flat_state(a)), dict(nnx.to_flat_state(b))
  assert fa.keys() == fb.keys()
  for k in fa:
    np.testing.assert_array_equal(
      np.asarray(fa[k].get_value()), np.asarray(fb[k].get_value()), err_msg=str(k)
    )


def _export_and_reimport(policy_dir, out):
  tok, config, params = policy_io.load(policy_dir)
  policy_io.export_hf(out, tok, config, params)
  tok2, config2, params2 = policy_io.load(out)
  # The same model; an HF checkpoint runs its layers as a scan (a runtime choice).
  assert config2.scan_layers is True
  assert dataclasses.replace(config2, scan_layers=config.scan_layers) == config
  assert tok2.template.source == tok.template.source
  assert tok2.encode("def add(a, b):") == tok.encode("def add(a, b):")
  _same_params(params, params2)
  return params


def test_export_matches_what_transformers_loaded(tmp_path):
  """assets/pre_rl exported now gives the files `transformers` loaded (recorded by
  make_reference.py --check_export), and our logits equal its logits."""
  out = str(tmp_path / "hf")
  _export_and_reimport(os.path.join(REPO, "assets", "pre_rl"), out)
  record = json.load(open(os.path.join(DATA, "export_pre_rl.json")))
  assert record["model_class"] == "LlamaForCausalLM"
  for name, digest in record["files"].items():
    assert hashlib.sha256(open(os.path.join(out, name), "rb").read()).hexdigest() == digest, name
  assert sorted(os.listdir(out)) == sorted(record["files"])
  ref = np.load(os.path.join(DATA, "export_pre_rl.npz"))
  tok, config, params = policy_io.load(out)
  model = nnx.merge(transformer.abstract(config)[0], jax.tree.map(jax.numpy.asarray, params))
  logits = np.asarray(model(jax.numpy.asarray(ref["tokens"])))
  assert np.abs(logits - ref["logits"]).max() <= 1e-4
  assert tok.template.render(record["messages"], add_generation_prompt=True) == record["text"]
  assert tok.chat(record["messages"]) == record["ids"]


def test_exported_qwen_reimports_identically(tmp_path, qwen):
  policy, params = qwen
  out = str(tmp_path / "qwen_again")
  policy_io.export_hf(out, policy.tok, policy.model_config, params)
  again = policy_io.open_policy(out)
  assert again.kind == "hf" and again.model_config == policy.model_config
  _same_params(params, policy_io.load_weights(again))
  assert json.load(open(os.path.join(out, "config.json")))["architectures"] == ["Qwen2ForCausalLM"]
  # Sharded export (an index file) when tensors exceed a shard.
  shards = str(tmp_path / "qwen_shards")
  old, hf_export.MAX_SHARD_BYTES = hf_export.MAX_SHARD_BYTES, 100_000
  try:
    policy_io.export_hf(shards, policy.tok, policy.model_config, params)
  finally:
    hf_export.MAX_SHARD_BYTES = old
  assert os.path.exists(os.path.join(shards, "model.safetensors.index.json"))
  _same_params(params, policy_io.load(shards)[2])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("hf_e2e_data")


@pytest.mark.parametrize("arch", ARCHS)
def test_rl_and_sft_from_hf_folder_then_export(arch, data_dir, tmp_path):
  folder = _folder(arch)
  common = [f"--config.init_from={folder}", f"--config.data_dir={data_dir}"]
  rl = str(tmp_path / "rl")
  out = _run(
    "train.py",
    "--config=configs/gagar.py:runlocal=True",
    *common,
    f"--workdir={rl}",
    "--config.steps=2",
    # The random checkpoint never passes: keep every group so the learner runs.
    "--config.rollout.dynamic_sampling=False",
    "--config.rollout.max_episode_tokens=1024",
    "--config.rollout.max_turns=2",
    "--config.eval.every_steps=10",
  )
  assert "[train] step 2/2" in out and "[train] done" in out
  summary = json.load(open(os.path.join(rl, "summary.json")))
  assert summary["optimizer_steps"] == 2 and summary["skipped_steps"] == 0
  _export_and_reimport(os.path.join(rl, "policy"), str(tmp_path / "rl_hf"))

  sft_dir = str(tmp_path / "sft")
  out = _run(
    "sft.py",
    "--config=configs/sft.py:runlocal=True",
    *common,
    f"--workdir={sft_dir}",
    f"--export={tmp_path / 'sft_policy'}",
    "--config.sft.steps=2",
    "--config.sft.seq_len=1024",
    "--config.rollout.max_episode_tokens=1024",
    "--config.rollout.max_turns=2",
  )
  assert f"warm start from hf folder {folder}" in out and "[sft] done" in out
  tuned = _export_and_reimport(str(tmp_path / "sft_policy"), str(tmp_path / "sft_hf"))
  original = policy_io.load(folder)[2]
  moved = [
    not np.array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()))
    for (_, a), (_, b) in zip(nnx.to_flat_state(original), nnx.to_flat_state(tuned), strict=True)
  ]
  assert all(moved), "two SFT steps move every parameter"
  # The exported folder's tokenizer files keep the checkpoint's own config entries.
  exported = json.load(open(tmp_path / "sft_hf" / "tokenizer_config.json"))
  source = json.load(open(os.path.join(folder, "tokenizer_config.json")))
  assert exported["tokenizer_class"] == source["tokenizer_class"]
  assert exported["eos_token"] == source["eos_token"]


LLAMA2_TEMPLATE = (
  "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}"
  "{% set system_message = messages[0]['content'] %}{% else %}"
  "{% set loop_messages = messages %}{% set system_message = false %}{% endif %}"
  "{% for message in loop_messages %}"
  "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
  "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
  "{% endif %}{% if loop.index0 == 0 and system_message != false %}"
  "{% set content = '<<SYS>>\\n' + system_message + '\\n<</SYS>>\\n\\n' + message['content'] %}"
  "{% else %}{% set content = message['content'] %}{% endif %}"
  "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
  "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}"
  "{% endif %}{% endfor %}"
)


def test_a_template_without_a_tool_role_sends_observations_as_user_turns():
  """Llama 2's template raises on any role but alternating user / assistant."""
  tok = tokenizers.HFTokenizer.from_file(_folder("llama"), chat_template=LLAMA2_TEMPLATE)
  fmt = transcript.AgentFormat(tok, transcript.system_message())
  assert fmt.observation_role == "user" and not fmt.system_in_user
  assert fmt.end_of_turn == tok.eos_id == tok.token_id("<|eot_id|>")
  text = tok.decode(fmt.prompt_ids("Issue: x"))
  assert text.startswith("<|begin_of_text|>[INST] <<SYS>>\nYou are a coding agent")
  assert text.endswith("Issue: x [/INST]")
  turns = [("view a.py", "1 y"), ("submit", "")]
  ids, mask = fmt.encode_episode("Issue: x", turns, max_obs_tokens=64)
  messages = [
    {"role": "system", "content": fmt.system},
    {"role": "user", "content": "Issue: x"},
    {"role": "assistant", "content": "view a.py"},
    {"role": "user", "content": "1 y"},
    {"role": "assistant", "content": "submit"},
  ]
  # Up to the spaces the template puts around an assistant message, the same text.
  rendered = tok.template.render(messages)
  assert tok.decode(ids).replace(" ", "") == rendered.replace(" ", "")
  assert sum(mask) == len(tok.encode("view a.py")) + len(tok.encode("submit")) + 2


def test_hf_weights_load_straight_into_the_sharded_layout(devices8, qwen):
  policy, host = qwen
  mesh = sharding.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  params = policy_io.load_weights(policy, mesh=mesh)
  q = params["layers"]["attn"]["q_proj"].get_value()
  assert q.sharding.spec == sharding.logical_to_spec(("layers", "embed", "heads", "head_dim"), None)
  _same_params(host, params)

"""GGUF checkpoints in: small files written with the `gguf` package's writer (random and
real tiny weights in several quant types) read back through `policy_io`, and bad files
refused before any compute. The real SmolLM2 file is for experiments, not these tests."""

import os
import shutil

import gguf
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from gguf import quants

from gagar_jax import policy_io
from gagar_jax.errors import ConfigError, InputError
from gagar_jax.models import gguf_import, tokenizers, transformer
from tests import gguf_files
from tests.conftest import REPO

Q = gguf.GGMLQuantizationType
DATA = os.path.join(REPO, "tests", "data", "hf_tiny")


def _logits(policy, params, ids):
  model = nnx.merge(transformer.abstract(policy.model_config)[0], jax.tree.map(jnp.asarray, params))
  return np.asarray(model(jnp.asarray(ids)))


@pytest.fixture(scope="module")
def qwen_gguf(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("gguf") / "qwen.gguf")
  written = gguf_files.from_hf_folder(os.path.join(DATA, "qwen2"), path, eos="<|im_end|>")
  return path, written


def test_f32_file_gives_transformers_logits_and_tokens(qwen_gguf):
  """A Qwen2 converted as llama.cpp does: the logits `transformers` computed for the HF
  folder, the same chat rendering and token ids as the folder's own tokenizer."""
  path, _ = qwen_gguf
  assert policy_io.kind(path) == "gguf"
  policy = policy_io.open_policy(path)
  folder = policy_io.open_policy(os.path.join(DATA, "qwen2"))
  assert policy.model_config == folder.model_config
  assert policy.model_config.qkv_bias and policy.model_config.tie_embeddings
  ref = np.load(os.path.join(DATA, "qwen2", "reference.npz"))
  got = _logits(policy, policy_io.load_weights(policy), ref["tokens"])
  np.testing.assert_allclose(got, ref["logits"], atol=2e-5)
  messages = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Issue: add(2, 3) returns -1\n\tdef add(a, b): return a - b"},
    {"role": "assistant", "content": "Fixed <|im_end|> literally."},
    {"role": "user", "content": "été 12345 ✓"},
  ]
  for gen in (True, False):
    assert policy.tok.chat(messages, gen) == folder.tok.chat(messages, gen)
    text = policy.tok.template.render(messages, add_generation_prompt=gen)
    assert text == folder.tok.template.render(messages, add_generation_prompt=gen)
  assert (policy.tok.eos_id, policy.tok.pad_id) == (folder.tok.eos_id, folder.tok.eos_id)
  assert policy.tok.decode(policy.tok.encode(messages[3]["content"])) == messages[3]["content"]


def test_llama_q_k_rows_are_put_back(tmp_path):
  """Llama's q/k rows are stored permuted; read back they give the HF model's logits
  (the reference without the folder's Llama-3 rope scaling, which GGUF keeps apart)."""
  folder = str(tmp_path / "llama_hf")
  shutil.copytree(os.path.join(DATA, "llama"), folder)
  config = policy_io.files.read_json(os.path.join(folder, "config.json"))
  config["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
  with open(os.path.join(folder, "config.json"), "w") as f:
    policy_io.json.dump(config, f)
  path = str(tmp_path / "llama.gguf")
  gguf_files.from_hf_folder(folder, path, eos="<|eot_id|>", bos="<|begin_of_text|>")
  policy, hf = policy_io.open_policy(path), policy_io.open_policy(folder)
  assert policy.model_config == hf.model_config and not policy.model_config.tie_embeddings
  messages = [{"role": "user", "content": "Issue: add(2, 3) returns -1 (été, 12345)"}]
  assert policy.tok.chat(messages) == hf.tok.chat(messages)
  ids = np.asarray([hf.tok.encode("def add(a, b):\n    return a - b  # 12345")])
  want = _logits(hf, policy_io.load_weights(hf), ids)
  np.testing.assert_allclose(_logits(policy, policy_io.load_weights(policy), ids), want, atol=1e-5)
  # Without the fix the model is plausible but different.
  params = policy_io.load_weights(policy)
  flat = dict(nnx.to_flat_state(params))
  q = flat[("layers", "attn", "q_proj")].get_value()
  flat[("layers", "attn", "q_proj")].set_value(q[..., np.r_[0:24:2, 1:24:2]])
  assert np.abs(_logits(policy, nnx.from_flat_state(flat), ids) - want).max() > 1e-3


@pytest.mark.parametrize("qtype", [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_quantized_tensors_dequantize_to_what_was_written(qwen_gguf, tmp_path, qtype):
  """Every weight matrix in `qtype`: each loads as the package's round trip of the
  float32 weights (so as close to them as the type allows), norms stay float32."""
  folder = os.path.join(DATA, "qwen2")
  matrices = [n for n in gguf_files.hf_tensors(folder) if n.endswith("proj.weight")]
  path = str(tmp_path / f"qwen_{qtype.name}.gguf")
  written = gguf_files.from_hf_folder(
    folder, path, eos="<|im_end|>", types=dict.fromkeys(matrices, qtype)
  )
  checkpoint = gguf_import.open_file(path)
  for name in matrices:
    original = written["tensors"][name]
    got = checkpoint.get(name)
    want = quants.dequantize(quants.quantize(original, qtype), qtype)
    np.testing.assert_array_equal(got, want.reshape(original.shape))
    tolerance = {Q.F16: 1e-3, Q.BF16: 1e-2, Q.Q8_0: 2e-2}.get(qtype, 0.2)
    assert np.abs(got - original).max() <= tolerance * np.abs(original).max()
  np.testing.assert_array_equal(
    checkpoint.get("model.norm.weight"), written["tensors"]["model.norm.weight"]
  )
  policy = policy_io.open_policy(path)
  ids = np.asarray([policy.tok.encode("def f(x):\n    return x")])
  assert np.isfinite(_logits(policy, policy_io.load_weights(policy), ids)).all()


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_k_quants_decode_as_llama_cpp_does(tmp_path, qtype):
  """A one-block-wide Llama whose matrices are random K-quant blocks: each loads as an
  independent block-by-block decoder (tests/gguf_files.py) reads it, q/k unpermuted."""
  rng = np.random.default_rng(int(qtype))
  d, heads, kv, hd, mlp, vocab = 256, 4, 2, 64, 256, 300
  c = dict(
    num_hidden_layers=1, max_position_embeddings=512, hidden_size=d, intermediate_size=mlp,
    num_attention_heads=heads, num_key_value_heads=kv, rope_theta=1e4, rms_norm_eps=1e-5,
    head_dim=hd,
  )  # fmt: skip
  shapes = {
    "model.layers.0.self_attn.q_proj.weight": (heads * hd, d),
    "model.layers.0.self_attn.k_proj.weight": (kv * hd, d),
    "model.layers.0.self_attn.v_proj.weight": (kv * hd, d),
    "model.layers.0.self_attn.o_proj.weight": (d, heads * hd),
    "model.layers.0.mlp.gate_proj.weight": (mlp, d),
    "model.layers.0.mlp.up_proj.weight": (mlp, d),
    "model.layers.0.mlp.down_proj.weight": (d, mlp),
  }
  raw = {n: (gguf_files.k_quant_blocks(*s, qtype, rng), qtype) for n, s in shapes.items()}
  tensors = {
    "model.embed_tokens.weight": rng.normal(0, 0.02, (vocab, d)).astype(np.float32),
    "model.norm.weight": np.ones(d, np.float32),
    "model.layers.0.input_layernorm.weight": np.ones(d, np.float32),
    "model.layers.0.post_attention_layernorm.weight": np.ones(d, np.float32),
  }
  tok = tokenizers.ByteTokenizer()
  tokens = [f"<0x{i:02X}>" for i in range(256)] + list(tok.special_tokens)
  tokens += [f"filler{i}" for i in range(vocab - len(tokens))]
  meta = {"tokens": tokens, "special": set(range(256, 260)), "merges": [], "template": "{{ x }}"}
  path = str(tmp_path / f"{qtype.name}.gguf")
  gguf_files.write(path, "llama", c, tensors, meta, raw=raw, eos="<|endoftext|>")
  checkpoint = gguf_import.open_file(path)
  for name, (data, _) in raw.items():
    want = gguf_files.dequantize_reference(data, qtype)
    if "q_proj" in name or "k_proj" in name:  # the file's rows are in llama.cpp's order
      want = gguf_import.unpermute(want, heads if "q_proj" in name else kv)
    np.testing.assert_allclose(checkpoint.get(name), want, rtol=1e-6, atol=1e-7)
  params = checkpoint.load_params(checkpoint.config)
  policy = policy_io.Policy(path, "gguf", None, checkpoint.config, checkpoint)
  assert np.isfinite(_logits(policy, params, np.asarray([[1, 2, 3]]))).all()


def _fails(path, *expected):
  with pytest.raises((InputError, ConfigError)) as e:
    policy_io.open_policy(path)
  message = str(e.value)
  assert "\n" not in message
  for text in expected:
    assert text in message, message


def test_bad_files_fail_before_compute_naming_what_is_wrong(qwen_gguf, tmp_path):
  path, _ = qwen_gguf
  folder = os.path.join(DATA, "qwen2")
  data = open(path, "rb").read()
  truncated = tmp_path / "truncated.gguf"
  truncated.write_bytes(data[: len(data) - 1000])
  _fails(str(truncated), str(truncated), "truncated")
  header_only = tmp_path / "header.gguf"
  header_only.write_bytes(data[:300])
  _fails(str(header_only), str(header_only))
  not_gguf = tmp_path / "model.gguf"
  not_gguf.write_text("not a model")
  _fails(str(not_gguf), "not a GGUF file")

  c = gguf_files.from_hf_folder(folder, str(tmp_path / "ok.gguf"), eos="<|im_end|>")
  tensors, meta = c["tensors"], gguf_files.tokenizer_metadata(folder)

  def write(name, arch="qwen2", **kw):
    out = str(tmp_path / name)
    gguf_files.write(out, arch, c["config"], tensors, meta, eos="<|im_end|>", **kw)
    return out

  _fails(write("mamba.gguf", arch="mamba"), "general.architecture='mamba' is not supported")
  _fails(write("no_layers.gguf", omit_metadata=("block_count",)), "qwen2.block_count")
  _fails(write("no_template.gguf", omit_metadata=("chat_template",)), "chat_template")
  one = dict(tensors)
  del one["model.layers.1.mlp.up_proj.weight"]
  gguf_files.write(str(tmp_path / "lacks.gguf"), "qwen2", c["config"], one, meta, eos="<|im_end|>")
  _fails(str(tmp_path / "lacks.gguf"), "lacks the tensor blk.1.ffn_up.weight")
  odd = {"model.layers.0.mlp.up_proj.weight": (np.zeros((96, 36), np.uint8), Q.IQ4_NL)}
  _fails(write("iq.gguf", raw=odd), "blk.0.ffn_up.weight is of type IQ4_NL", "not supported")
  # Overrides that contradict the file name the field.
  with pytest.raises(ConfigError, match=r"^model\.num_layers: 3 contradicts the checkpoint"):
    policy_io.open_policy(path, {"num_layers": 3})
  assert policy_io.open_policy(path, {"max_seq_len": 128}).model_config.max_seq_len == 128


def test_fingerprint_and_export_of_a_gguf_policy(qwen_gguf, tmp_path):
  """A GGUF warm start has a fingerprint (the file's bytes) and exports as a policy
  folder that loads to the same parameters and tokenizer."""
  path, _ = qwen_gguf
  assert policy_io.fingerprint(path) == policy_io.fingerprint(path)
  copy = tmp_path / "copy.gguf"
  data = bytearray(open(path, "rb").read())
  data[-1] ^= 1
  copy.write_bytes(bytes(data))
  assert policy_io.fingerprint(str(copy)) != policy_io.fingerprint(path)
  tok, config, params = policy_io.load(path)
  out = str(tmp_path / "policy")
  policy_io.export(out, tok, config, params)
  tok2, config2, params2 = policy_io.load(out)
  assert config2 == config
  text = "<|im_start|>user\nhi<|im_end|>"
  assert tok2.encode(text) == tok.encode(text) and tok2.template.source == tok.template.source
  for (_, a), (_, b) in zip(nnx.to_flat_state(params), nnx.to_flat_state(params2), strict=True):
    np.testing.assert_array_equal(a.get_value(), b.get_value())


def test_rl_starts_from_a_gguf_file(qwen_gguf, tmp_path):
  """`init_from` a GGUF file: the shape, tokenizer and template come from the file (the
  run's size preset is ignored), one RL step updates it, and its policy exports."""
  from tests.test_end_to_end import _run

  path, _ = qwen_gguf
  rl = str(tmp_path / "rl")
  out = _run(
    "train.py",
    "--config=configs/gagar.py:runlocal=True",
    f"--config.init_from={path}",
    f"--config.data_dir={tmp_path / 'data'}",
    f"--workdir={rl}",
    "--config.steps=1",
    "--config.rollout.dynamic_sampling=False",  # the random model never passes
    "--config.rollout.max_episode_tokens=1024",
    "--config.rollout.max_turns=2",
    "--config.eval.every_steps=10",
  )
  assert "[train] step 1/1" in out and "[train] done" in out
  summary = policy_io.files.read_json(os.path.join(rl, "summary.json"))
  assert summary["optimizer_steps"] == 1 and summary["skipped_steps"] == 0
  tok, config, _ = policy_io.load(os.path.join(rl, "policy"))
  assert config == policy_io.open_policy(path).model_config
  assert tok.template.source == policy_io.open_policy(path).tok.template.source

"""Byte tokenizer, BPE training, the Hugging Face adapter and chat rendering."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gagar_jax.errors import InputError
from gagar_jax.models import tokenizers

CORPUS = [f"def add_{i}(x, y):\n    return x + {i} * y\n" for i in range(400)]


@pytest.fixture(scope="module")
def bpe():
  return tokenizers.train_bpe(CORPUS, 320, (*tokenizers.DEFAULT_SPECIALS, "<|end_action|>"))


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_byte_roundtrip(text):
  tok = tokenizers.ByteTokenizer()
  assert tok.decode(tok.encode(text)) == text


@settings(max_examples=50, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=80))
def test_bpe_roundtrip(bpe, text):
  assert bpe.decode(bpe.encode(text)) == text


def test_specials_are_single_ids():
  tok = tokenizers.ByteTokenizer()
  ids = tok.encode(f"a{tokenizers.IM_END}b")
  assert ids == [97, tok.token_id(tokenizers.IM_END), 98]
  assert tok.vocab_size == 256 + len(tokenizers.DEFAULT_SPECIALS)
  assert tok.eos_id == tok.token_id(tokenizers.EOS)
  with pytest.raises(KeyError):
    tok.token_id("<|nope|>")


def test_bpe_compresses_its_corpus(bpe):
  text = CORPUS[123]
  ids = bpe.encode(text)
  assert len(ids) < len(text.encode()) / 2
  assert bpe.vocab_size == 320
  assert len(bpe.encode("<|end_action|>")) == 1
  assert bpe.pad_id == bpe.token_id(tokenizers.PAD)


def test_bpe_training_is_deterministic(bpe):
  again = tokenizers.train_bpe(CORPUS, 320, (*tokenizers.DEFAULT_SPECIALS, "<|end_action|>"))
  assert again.encode(CORPUS[5]) == bpe.encode(CORPUS[5])


def test_save_and_load(bpe, tmp_path):
  bpe.save(str(tmp_path))
  loaded = tokenizers.HFTokenizer.from_file(str(tmp_path))
  assert loaded.encode(CORPUS[7]) == bpe.encode(CORPUS[7])
  assert (loaded.eos_id, loaded.pad_id) == (bpe.eos_id, bpe.pad_id)
  with pytest.raises(InputError, match="missing: file not found"):
    tokenizers.HFTokenizer.from_file(str(tmp_path / "missing"))


def test_chatml_rendering(bpe):
  ids = bpe.chat([{"role": "user", "content": "fix it"}])
  assert bpe.decode(ids) == "<|im_start|>user\nfix it<|im_end|>\n<|im_start|>assistant\n"
  ids = bpe.chat([{"role": "user", "content": "x"}], add_generation_prompt=False)
  assert bpe.decode(ids).endswith("<|im_end|>\n")


def test_too_small_vocab_is_rejected():
  with pytest.raises(ValueError, match="vocab_size=100"):
    tokenizers.train_bpe(CORPUS, 100)

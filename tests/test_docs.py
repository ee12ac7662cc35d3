"""The docs name real things: every repository path in README.md and docs/*.md exists,
and no module cites a design file the repository does not have."""

import itertools
import os
import re

import pytest

from tests.conftest import REPO

DOCS = (
  "README.md",
  *sorted(f"docs/{n}" for n in os.listdir(os.path.join(REPO, "docs")) if n.endswith(".md")),
)
# Written by runs, not shipped.
OUTPUTS = (
  "runs/",
  "data/",
  "/tmp",
  ".venv",
  "workdir/",
  "policy/",
  "checkpoints/",
  "checkpoints.broken/",
  "tensorboard/",
)
OUTPUT_NAMES = {
  "summary.json",
  "curves.png",
  "curve.png",
  "config.json",
  "metrics.jsonl",
  "workdir.json",
  "config_changes.jsonl",
}
_SPAN = re.compile(r"`([^`\n]+)`")
_PATHISH = re.compile(r"^[\w.{},*-]+(/[\w.{},*-]*)*$")
_EXT = (".py", ".md", ".json", ".lock", ".png", ".toml", ".safetensors", ".jinja", ".txt")
_SKIP_DIRS = {".git", ".venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
_SKIP_TOP = {"runs", "data"}  # run outputs and built datasets at the root


def _expand(path: str) -> list[str]:
  """`a/{b,c}.py` -> [`a/b.py`, `a/c.py`]."""
  parts = re.split(r"\{([^}]*)\}", path)
  fixed, choices = parts[0::2], [p.split(",") for p in parts[1::2]]
  return [
    "".join(x for pair in itertools.zip_longest(fixed, combo, fillvalue="") for x in pair)
    for combo in itertools.product(*choices)
  ]


def _paths(text: str) -> set[str]:
  """Repository paths a doc names (in backticks or code blocks): words with an extension
  or a trailing slash; `--flag=path` and `file.py:arg` reduced to the path."""
  out = set()
  blocks = re.findall(r"```[^\n]*\n(.*?)```", text, re.S)
  words = [w for span in _SPAN.findall(text) for w in span.split()]
  words += [w for block in blocks for w in block.split()]
  for word in words:
    word = word.split("=", 1)[-1].split(":", 1)[0].lstrip("(").rstrip(".,;)")
    if not _PATHISH.match(word) or word.startswith(OUTPUTS) or word in OUTPUT_NAMES:
      continue
    if word.endswith(_EXT) or word.endswith("/"):
      out.update(_expand(word))
  return out


def _tree() -> set[str]:
  """Every file and folder of the checkout (relative paths; folders end with /)."""
  out = set()
  for dirpath, dirs, names in os.walk(REPO):
    rel = os.path.relpath(dirpath, REPO)
    dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not (rel == "." and d in _SKIP_TOP)]
    base = "" if rel == "." else rel + "/"
    out.update(base + d + "/" for d in dirs)
    out.update(base + n for n in names)
  return out


def _exists(path: str, tree: set[str]) -> bool:
  """At the root, under gagar_jax/, or (a doc's tree listing) as the tail of a real path."""
  pattern = re.escape(path).replace(r"\*", "[^/]*")
  return any(re.fullmatch(f"(gagar_jax/)?{pattern}", p) for p in tree) or any(
    re.fullmatch(f"(.*/)?{pattern}", p) for p in tree
  )


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_a_doc_names_exists(doc):
  with open(os.path.join(REPO, doc)) as f:
    paths = _paths(f.read())
  assert len(paths) >= 3, paths  # the extraction found the paths
  tree = _tree()
  missing = sorted(p for p in paths if not _exists(p, tree))
  assert not missing, f"{doc} names paths that do not exist: {missing}"


def test_the_path_check_can_fail():
  assert _paths("see `gagar_jax/nope.py` and `gagar_jax/grading/{loop,gone}.py`") == {
    "gagar_jax/nope.py",
    "gagar_jax/grading/loop.py",
    "gagar_jax/grading/gone.py",
  }
  tree = _tree()
  assert not _exists("gagar_jax/nope.py", tree) and not _exists("training.py", tree)
  assert _exists("grading/loop.py", tree) and _exists("sandbox*.py", tree)


def test_no_module_cites_a_missing_design_file():
  for root in ("gagar_jax", "experiments", "configs", "tests"):
    for dirpath, _, names in os.walk(os.path.join(REPO, root)):
      for name in names:
        if not name.endswith(".py") or name == "test_docs.py":
          continue
        with open(os.path.join(dirpath, name)) as f:
          text = f.read()
        for cited in ("DESIGN.md", "LEARNABILITY", "SANDBOX.md", "../shared"):
          assert cited not in text, f"{dirpath}/{name} cites {cited}"

"""Thread-safe `ast.parse`, and the one way the project finds a function in a module.

CPython 3.11's parser keeps recursion-depth state that concurrent `ast.parse` calls
from several threads corrupt ("SystemError: AST constructor recursion depth
mismatch"); tools, quality signals and graders all parse candidate code from
worker threads, so every parse goes through this lock.
"""

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, mode: str = "exec") -> ast.AST:
  with _LOCK:
    return ast.parse(source, mode=mode)


def functions(source: str) -> dict[str, ast.FunctionDef]:
  """Top-level functions of `source` by name; {} if it does not parse."""
  try:
    tree = parse(source)
  except SyntaxError:
    return {}
  return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def find_function(source: str, name: str) -> ast.FunctionDef | None:
  """The top-level function `name` of `source`; None if absent or unparsable."""
  return functions(source).get(name)

"""What every entry point in `experiments/` shares: flags in, one clear line out on error.

    if __name__ == "__main__":
      cli.run(main)

`run` parses the absl flags (and the ml_collections config file they name), then calls
`main(argv)`. A mistake in what the user gave, a bad flag or config value (`ConfigError`)
or a bad file (`InputError`), is printed as one line, `error: <field or path>: <what>`,
with exit status 2; a traceback is kept for real bugs. Ctrl-C ends with one line and
status 130 (the loops that can stop cleanly first checkpoint, see `GracefulStop`).

Every entry point keeps XLA's compiled programs in a persistent cache, so a sweep (or a
rerun) compiles each program once per machine: `~/.cache/gagar_jax/xla` (under
`$XDG_CACHE_HOME` when set) unless JAX is given a directory (`JAX_COMPILATION_CACHE_DIR` or
`--jax_compilation_cache_dir`); `JAX_ENABLE_COMPILATION_CACHE=false` (or
`--jax_enable_compilation_cache=false`) turns it off. See `use_compilation_cache`.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import sys
import threading

import jax
from absl import app, flags

from gagar_jax.errors import Interrupted, UsageError

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def fail(message: str) -> None:
  """Prints `error: <message>` (its first line) to stderr and exits 2."""
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(EXIT_USAGE)


def flag_error(e: BaseException, argv: list[str]) -> str:
  """One line for an error raised while parsing flags and the config file they name.

  ml_collections reports a bad config file with the traceback of `get_config` inside the
  message and an unknown override (`--config.a.typo=1`) as a bare `KeyError`; the line
  names the flag (or the config field) and keeps only what was wrong.
  """
  text = str(e.args[0]) if isinstance(e, KeyError | AttributeError) and e.args else str(e)
  if isinstance(e, KeyError | AttributeError):
    unknown = re.match(r"""\W*'?(\w+)'?""", text.strip("'\"\\"))
    guess = re.search(r'Did you mean "(\w+)"', text)
    name = unknown.group(1) if unknown else "?"
    hint = f" (did you mean {guess.group(1)}?)" if guess else ""
    for arg in argv[1:]:
      m = re.match(r"--(?:no)?config\.([\w.]+)", arg)
      parts = m.group(1).split(".") if m else []
      if name in parts:
        return f"{'.'.join(parts[: parts.index(name) + 1])}: unknown field{hint}"
    return f"unknown config field {name!r}{hint}"
  lines = [line.strip() for line in text.splitlines() if line.strip()]
  flag = re.match(r"flag (--\S+?): ", lines[0]) if lines else None
  last = lines[-1] if lines else type(e).__name__
  last = re.sub(r"^(?:[A-Za-z_][\w.]*(?:Error|Exception)): ", "", last)
  if flag and last.startswith("flag "):
    return last[len("flag ") :]
  return f"{flag.group(1)}: {last}" if flag else last


def _parse_flags(argv: list[str]) -> list[str]:
  try:
    rest = flags.FLAGS(argv)
  except Exception as e:  # a bad flag or config file: the user's input, not a bug
    fail(flag_error(e, argv))
  for name in flags.FLAGS:  # a config file that failed to load reports it only when read
    value = flags.FLAGS[name].value
    if hasattr(type(value), "_ReportError"):
      try:
        value._ReportError()
      except Exception as e:
        fail(f"--{name}: {flag_error(e, argv)}")
  return rest


# Programs that compile faster than this are not cached (JAX's default, 1 s, would leave out
# most of the tiny models' programs, which compile in 0.1-1 s).
CACHE_MIN_COMPILE_S = 0.05


def default_cache_dir() -> str:
  """`$XDG_CACHE_HOME/gagar_jax/xla`, else `~/.cache/gagar_jax/xla`."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "gagar_jax", "xla")


def use_compilation_cache() -> str | None:
  """Points JAX's persistent compilation cache at `default_cache_dir()` unless the user
  gave a directory or turned the cache off (module docstring). Returns the directory in
  use (None: off). Keys are the program, the XLA flags and the devices, so an entry is
  never reused for a different program or machine."""

  if not jax.config.jax_enable_compilation_cache:
    return None
  path = jax.config.jax_compilation_cache_dir
  if not path:
    path = default_cache_dir()
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      logging.warning("no persistent compilation cache (%s: %s)", path, e.strerror)
      return None
    jax.config.update("jax_compilation_cache_dir", path)
  given = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" in os.environ
  name = "jax_persistent_cache_min_compile_time_secs"
  if not given and not (name in flags.FLAGS and flags.FLAGS[name].present):
    jax.config.update(name, CACHE_MIN_COMPILE_S)
  return path


def run(main) -> None:
  """`absl.app.run(main)` with one-line usage errors and a clean Ctrl-C (module docstring)."""

  jax.config.config_with_absl()  # JAX's own flags (--jax_platforms, ...) on the command line

  def wrapped(argv):
    use_compilation_cache()
    try:
      return main(argv)
    except UsageError as e:
      fail(str(e))
    except Interrupted as e:
      print(str(e), file=sys.stderr, flush=True)
      sys.exit(EXIT_INTERRUPTED)
    except KeyboardInterrupt:
      print(
        "interrupted: outputs and the last checkpoint written are kept; rerun the same command "
        "to resume",
        file=sys.stderr,
        flush=True,
      )
      sys.exit(EXIT_INTERRUPTED)

  app.run(wrapped, flags_parser=_parse_flags)


class GracefulStop:
  """Within the block, the first Ctrl-C (SIGINT) only sets `requested` (the loop finishes
  its step, checkpoints and stops); a second one raises `KeyboardInterrupt` at once.

    with GracefulStop("[train]") as stop:
      while ...:
        ...one step, metrics, checkpoint...
        if stop.requested:
          raise Interrupted(...)
  """

  def __init__(self, tag: str):
    self.tag, self.requested, self._previous = tag, False, None

  def _handler(self, signum, frame):
    if self.requested:
      raise KeyboardInterrupt
    self.requested = True
    print(
      f"{self.tag} Ctrl-C: stopping after this step with a checkpoint (Ctrl-C again to stop now)",
      file=sys.stderr,
      flush=True,
    )

  def install(self) -> GracefulStop:
    if threading.current_thread() is threading.main_thread():  # signals reach only main
      self._previous = signal.signal(signal.SIGINT, self._handler)
    return self

  def restore(self) -> None:
    """Ctrl-C acts as before `install` again."""
    if self._previous is not None:
      signal.signal(signal.SIGINT, self._previous)
      self._previous = None

  def __enter__(self) -> GracefulStop:
    return self.install()

  def __exit__(self, *exc) -> None:
    self.restore()

"""Errors raised for bad configuration or input, naming what was wrong.

Entry points (`gagar_jax.cli.run`) print a `UsageError` as one line, `error: <what>`, and
exit 2: these are the user's mistakes, not the code's, so they get no traceback.
"""


class UsageError(ValueError):
  """A mistake in what the user gave (a config value, a file, a flag): one line, exit 2."""


class ConfigError(UsageError):
  """A configuration value is invalid. The message starts with the field name.

  Attributes:
    field: the dotted path of the offending field, e.g. `learner.optim.learning_rate`.
    message: what is wrong with it (the text after `field: `).
  """

  def __init__(self, field: str, message: str):
    self.field, self.message = field, message
    super().__init__(f"{field}: {message}")

  def within(self, prefix: str) -> "ConfigError":
    """The same error for a section mounted at `prefix` (`rollout` + `top_k`)."""
    return ConfigError(f"{prefix}.{self.field}" if prefix else self.field, self.message)


class InputError(UsageError):
  """A file the project reads is missing, damaged or of the wrong kind. The message starts
  with its path.

  Attributes:
    path: the file or folder.
    message: what is wrong with it.
  """

  def __init__(self, path: str, message: str):
    self.path, self.message = str(path), message
    super().__init__(f"{path}: {message}")


class Interrupted(Exception):
  """The user stopped a run (Ctrl-C) at a point where it could stop cleanly; the message
  says what was kept and how to go on."""

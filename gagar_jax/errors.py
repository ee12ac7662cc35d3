"""Errors raised for bad configuration or input, naming what was wrong."""


class ConfigError(ValueError):
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

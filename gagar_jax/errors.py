"""Errors raised for bad configuration or input, naming what was wrong."""


class ConfigError(ValueError):
  """A configuration value is invalid. The message starts with the field name."""

  def __init__(self, field: str, message: str):
    self.field = field
    super().__init__(f"{field}: {message}")

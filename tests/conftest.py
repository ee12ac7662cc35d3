"""Shared fixtures. Every test process sees 8 CPU devices (sharding tests need them)."""

import os

# Must run before jax initialises its backends.
os.environ["XLA_FLAGS"] = (
  os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# A persistent XLA compilation cache shared by the test process and every script it runs
# (train.py, evaluate.py, ...): the same programs compile once per machine, not once per
# subprocess. Keys are the programs and flags, so stale entries are never reused.
_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_REPO, ".cache", "xla"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05")

import jax  # noqa: E402
import pytest  # noqa: E402
from flax import nnx  # noqa: E402

from gagar_jax.models import presets, transformer  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="session")
def nano_config() -> transformer.ModelConfig:
  return transformer.ModelConfig.from_dict(presets.get("nano"))


@pytest.fixture(scope="session")
def nano_model(nano_config):
  """(graphdef, params) of a seeded nano model. Tests must not mutate params."""
  return nnx.split(transformer.create(nano_config, seed=1))


@pytest.fixture(scope="session")
def devices8():
  devices = jax.devices()
  assert len(devices) == 8, "conftest forces 8 CPU devices"
  return devices


from hypothesis import settings  # noqa: E402

# CI runs a fixed set of examples (no flaky red builds); locally each run explores anew.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

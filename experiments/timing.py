"""Median wall time of a JAX callable, shared by the benchmark scripts."""

from __future__ import annotations

import statistics
import time

import jax


def median_time(fn, repeats: int) -> float:
  """Median seconds of `fn()` over `repeats` runs, after one warm-up call that compiles."""
  jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)

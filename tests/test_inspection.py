"""Group records: bounded (thinning keeps recent steps dense), atomic, readable."""

import numpy as np

from gagar_jax import inspection
from gagar_jax.learner import step as step_lib


def test_thinning_keeps_recent_steps_and_bounds_the_count(tmp_path):
  root = str(tmp_path / "groups")
  for step in range(1, 41):
    inspection.write_step(root, step, [{"step": step, "group": 0}])
    inspection.thin(root, max_steps=10)
    assert len(inspection.step_files(root)) <= 10
  steps = [s for s, _ in inspection.step_files(root)]
  assert steps[-1] == 40 and steps[-5:] == [36, 37, 38, 39, 40]  # the newest dense
  assert steps[0] < 20  # and some old history survives, thinned
  assert [r["step"] for r in inspection.read(root)] == steps
  assert inspection.read(root, step=40) == [{"step": 40, "group": 0}]
  assert not list((tmp_path / "groups").glob(".*.tmp"))  # no temporary files left


def test_lambda_is_the_passing_sets_rescale():
  base = np.array([[1.0, 1.0, -2.0, 0.0]])
  w = np.array([[1.0, 0.5, 1.0, 1.0]])
  new = np.array([[4 / 3, 2 / 3, -2.0, 0.0]])  # sum_P preserved: 2 = lam * (1 + 0.5)
  passed, valid = np.array([[True, True, False, False]]), np.ones((1, 4), bool)
  np.testing.assert_allclose(
    step_lib.credit_lambda(base, new, passed, valid, w), [4 / 3], rtol=1e-6
  )
  none = np.zeros((1, 4), bool)
  np.testing.assert_allclose(step_lib.credit_lambda(base, new, none, valid, w), [1.0])


def _candidate(passed, hack=0, out_of_scope=0, invalid=0, tokens=100):
  signals = dict(special_cases=hack, out_of_scope_lines=out_of_scope, out_of_scope_functions=0)
  return {"passed": passed, "tokens": tokens, "signals": dict(signals, invalid_actions=invalid)}


def test_trends_bin_steps_and_count_hacks_among_passing(tmp_path):
  root = str(tmp_path / "groups")
  early = [_candidate(True, hack=1, invalid=1), _candidate(False, hack=1), _candidate(True)]
  early += [_candidate(False)]
  late = [_candidate(True, out_of_scope=2, tokens=300), _candidate(True, invalid=1, tokens=300)]
  late += [_candidate(True, out_of_scope=1, hack=1, tokens=300)]
  for step in (1, 2):
    inspection.write_step(root, step, [{"step": step, "group": 0, "candidates": early}])
  for step in (3, 4):
    no_signals = {"passed": True, "tokens": 9, "signals": {}}  # another suite: left out
    group = {"step": step, "group": 0, "candidates": [*late, no_signals]}
    inspection.write_step(root, step, [group])
  first, second = inspection.trends(root, bins=2)
  assert first["steps"] == "1-2" and first["episodes"] == 8 and first["pass_rate"] == 0.5
  assert first["hack_attempts"] == 0.5 and first["hack_attempt_pass_rate"] == 0.5
  assert first["passing_hack"] == 0.5 and first["passing_out_of_scope"] == 0.0
  assert second["steps"] == "3-4" and second["tokens"] == 300.0
  assert second["hack_attempt_pass_rate"] == 1.0 and second["passing_hack"] == 1 / 3
  assert second["passing_out_of_scope"] == 2 / 3 and second["passing_invalid"] == 1 / 3
  assert second["passing_out_of_scope_no_hack"] == 1 / 3
  assert second["passing_hack_invalid"] == 0.0 and second["passing_fix_invalid"] == 0.5
  assert first["passing_hack_invalid"] == 1.0 and first["passing_fix_invalid"] == 0.0

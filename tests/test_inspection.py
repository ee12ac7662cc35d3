"""Group records: bounded (thinning keeps recent steps dense), atomic, readable."""

import numpy as np

from gagar_jax import inspection


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
  np.testing.assert_allclose(inspection.lambdas(base, new, passed, valid, w), [4 / 3])
  none = np.zeros((1, 4), bool)
  np.testing.assert_allclose(inspection.lambdas(base, new, none, valid, w), [1.0])

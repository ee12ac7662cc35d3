"""The processes of a run and what passes between them (the RL loop's host topology).

On P processes (`jax.distributed`) each rolls out, sandboxes and grades its own
`num_groups / P` groups (its own tasks and seed stream) on its own devices; the learner
assembles the global batch from every process's rows. Only process 0 prints and writes
the run's outputs; every process keeps its own audit log in
`workdir/hosts/process_<p>.jsonl` (the tasks it drew each step, the digest of its replica
of the final weights, which must agree across processes).

    hosts = Hosts(workdir)
    hosts.log("[train] ...")                       # process 0 only
    kept = hosts.gather([len(groups)])             # [P, 1], the same on every process
    params = hosts.replicate(params, mesh, local)  # the weights on this host's devices
"""

from __future__ import annotations

import hashlib
import json
import os

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from gagar_jax import sharding


class Hosts:
  """This process's place among the run's processes."""

  def __init__(self, workdir: str):
    self.count, self.index = jax.process_count(), jax.process_index()
    self.primary = self.index == 0
    self.audit_log = os.path.join(workdir, "hosts", f"process_{self.index}.jsonl")

  @property
  def many(self) -> bool:
    return self.count > 1

  def log(self, text: str) -> None:
    """Progress lines: process 0 only."""
    if self.primary:
      print(text, flush=True)

  def barrier(self, name: str) -> None:
    """Every process waits here for the others (nothing on one process)."""
    if self.many:
      multihost_utils.sync_global_devices(f"gagar_jax: {name}")

  def gather(self, values) -> np.ndarray:
    """`[P, len(values)]`: every process's `values`, on every process."""
    row = np.asarray(values)
    if not self.many:
      return row[None]
    return np.reshape(multihost_utils.process_allgather(row), (self.count, row.size))

  def replicate(self, params, mesh, local_mesh):
    """The weights a process's rollouts use: `params` itself on one process, else a full
    replica on this process's devices (an all-gather over `mesh`, then this host's
    copies: no host round trip)."""
    if not self.many:
      return params
    full = jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, P()))(params)
    local = NamedSharding(local_mesh, P())
    return jax.tree.map(
      lambda x: jax.make_array_from_single_device_arrays(
        x.shape, local, [s.data for s in x.addressable_shards]
      ),
      full,
    )

  def shard(self, x, mesh, rules=None):
    """Host rows of this process's groups (all groups on one process) on the mesh."""
    if self.many:
      return sharding.shard_local_batch(x, mesh, rules)
    return sharding.shard_batch(x, mesh, rules)

  def audit(self, record: dict) -> None:
    """Appends `record` to this process's audit log."""
    os.makedirs(os.path.dirname(self.audit_log), exist_ok=True)
    with open(self.audit_log, "a") as f:
      f.write(json.dumps(record) + "\n")

  def audit_digest(self, params) -> None:
    """The sha256 of this process's replica of `params`, into its audit log."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
      digest.update(np.asarray(leaf.addressable_data(0)).tobytes())
    self.audit({"final_params_sha256": digest.hexdigest()})

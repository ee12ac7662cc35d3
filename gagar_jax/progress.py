"""What the RL loop prints and draws: its progress lines and its training curves."""

from __future__ import annotations

import numpy as np

from gagar_jax import evaluation


def tiered(m: dict) -> str:
  """The tiered protocol's part of a progress line: mean lambda, capped share, hacks."""
  if "lambda_mean" not in m:
    return ""
  return (
    f" lam {m['lambda_mean']:.2f} capped {m['lambda_capped_share']:.2f} hacks "
    f"{m.get('grader_hacks', 0):.0f}"
  )


def step_line(step: int, steps: int, m: dict, num_groups: int, skipped: int, eta: str) -> str:
  """One RL step: pass rate, groups kept, loss and credit moved (or why it was skipped)."""
  if m["skipped"]:
    return (
      f"[train] step {step}/{steps} | pass {m['pass_rate']:.2f} kept 0/{num_groups} "
      f"in {m['rounds']} round(s) | skipped: no informative group, no update "
      f"({skipped} skipped so far) | {eta}"
    )
  return (
    f"[train] step {step}/{steps} | pass {m['pass_rate']:.2f} kept "
    f"{m['groups_kept']}/{num_groups} in {m['rounds']} round(s) | loss "
    f"{m['loss']:+.4f} gn {m['grad_norm']:.3f} kl {m['kl']:.4f} | moved "
    f"{m['adv_abs_moved']:.3f} graded {m.get('grader_ok', 0):.0f}/"
    f"{m['grader_groups']:.0f}{tiered(m)} | tokens {m['episode_tokens']:.0f} | {eta}"
  )


def eval_line(step: int, ev: dict) -> str:
  return (
    f"[eval] step {step}: pass@1 {ev['pass@1']:.3f} informative "
    f"{ev['informative_groups']:.2f} bloated-passing {evaluation.fmt(ev.get('passing_bloated'))} "
    f"tokens {ev['episode_tokens']:.0f}"
  )


def done_line(final: dict, group_size: int, workdir: str) -> str:
  return (
    f"[train] done: test pass@1 {final['pass@1']:.3f}, pass@{group_size} "
    f"{final[f'pass@{group_size}']:.3f}, bloated passing "
    f"{evaluation.fmt(final.get('passing_bloated'))}, tokens {final['episode_tokens']:.0f}; "
    f"outputs in {workdir}"
  )


def plot_run(records: list[dict], curve: list[dict], path: str) -> None:
  """Training curves: batch pass rate, eval pass@1, episode length, gradient norm."""
  # (plotting only: matplotlib is slow to import and needs its Agg backend set first)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  train = [r for r in records if "train/pass_rate" in r]
  fig, ax = plt.subplots(1, 4, figsize=(16, 3.6))
  if train:
    steps = [r["step"] for r in train]
    ax[0].plot(steps, [r["train/pass_rate"] for r in train], label="rollout pass rate")
    # Skipped steps (no group kept) have no tokens or gradient: gaps in those curves.
    get = lambda k: [r.get(k, np.nan) for r in train]
    ax[2].plot(steps, get("train/episode_tokens"), label="train")
    ax[3].plot(steps, get("train/grad_norm"))
  if curve:
    ax[0].plot([p["step"] for p in curve], [p["pass@1"] for p in curve], "o-", label="eval pass@1")
    ax[1].plot([p["step"] for p in curve], [p.get("passing_bloated", np.nan) for p in curve], "o-")
    ax[2].plot([p["step"] for p in curve], [p["episode_tokens"] for p in curve], "o-", label="eval")
  ax[0].set(title="pass rate", xlabel="step", ylim=(0, 1))
  ax[0].legend()
  ax[1].set(title="bloated share of passing", xlabel="step", ylim=(0, 1))
  ax[2].set(title="episode tokens", xlabel="step")
  ax[2].legend()
  ax[3].set(title="gradient norm", xlabel="step")
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)

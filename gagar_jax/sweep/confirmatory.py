"""The pre-registered confirmatory analysis of GAGAR against GRPO (results/preregistration.md).

    arms = report.by_arm([report.load_run(d) for d in record_dirs])
    result = analyse(arms, pilot_arms, draws=2000)   # refuses an incomplete sweep
    write_report(result, "results/confirmatory.md", "results/confirmatory.png", ...)

What it computes is fixed by the pre-registration and this module is used unchanged:

- **Primaries** (seeds 4-15): GAGAR - GRPO final test pass@1 as the reward sees it, and
  resolved@1 (the same episodes' final files re-checked with the strong hidden tests).
  Each is the mean over seeds of the paired per-seed difference with its 95% interval and
  two-sided p from `stats.paired_test` (seeds' variance by t, tasks' by a bootstrap of the
  test tasks); the two p-values are Holm-adjusted. A primary is **supported** when its
  adjusted p < 0.05 and the difference is positive, **contradicted** when adjusted
  p < 0.05 and negative, and **not resolved** otherwise.
- **Key secondary**: relative episode-length growth since step 0 (validation episodes,
  last point over the first, minus 1), GAGAR - GRPO, lower claimed: a paired t over the
  seeds (`stats.seed_test`), verdict at p < 0.05, outside the primaries' family.
- **Declared secondaries**: the same figures on the pilot (seeds 0-3 of the
  `pressure_all` sweep; its records predate the strong re-check, so resolved@1 is not
  measured there) and pooled over all 16 seeds (a paired t over the seeds' differences:
  the pilot's 256-task and the new 512-task test sets cannot share a task bootstrap).
- Everything else is **exploratory**: the ablation report's GAGAR-vs-GRPO rows, with
  unadjusted p-values, and the test episodes' tokens split by outcome.
"""

from __future__ import annotations

import numpy as np

from gagar_jax import stats
from gagar_jax.errors import InputError
from gagar_jax.sweep import report

TREATMENT, CONTROL = "gagar", "grpo"
SEEDS = tuple(range(4, 16))
PILOT_SEEDS = (0, 1, 2, 3)
ALPHA = 0.05
LEVEL = 0.95
# (name, statistic of a run's final-test TaskTable)
PRIMARIES = (
  ("test pass@1 (reward view)", stats.pass_at_1),
  ("test resolved@1 (strong hidden tests)", stats.resolved_at_1),
)
KEY_SECONDARY = ("relative episode-length growth since step 0", "relative_token_growth")
# The exploratory split of the final test's episode tokens (`evaluation` summary keys).
TOKEN_KINDS = ("real_fix", "unresolved_pass", "fail")


def check_complete(arms: dict, seeds, where: str) -> None:
  """An `InputError` naming every missing run: the analysis runs on the whole design only."""
  missing = [f"{a}_s{s}" for s in seeds for a in (CONTROL, TREATMENT) if s not in arms.get(a, {})]
  if missing:
    raise InputError(
      where,
      f"{len(missing)} of {2 * len(seeds)} runs are not recorded yet ({', '.join(missing)}); "
      "the pre-registered analysis runs on all of them (stopping rule)",
    )


def primary_verdict(point: float, p_adjusted: float) -> str:
  if not np.isfinite(p_adjusted):
    return "not measurable"
  if p_adjusted < ALPHA:
    return "supported" if point > 0 else "contradicted"
  return "not resolved"


def _tables(arms: dict, arm: str, seeds) -> dict:
  return {s: arms[arm][s]["test"] for s in seeds if s in arms.get(arm, {})}


def _levels(arms: dict, arm: str, key: str, seeds) -> dict:
  return {s: arms[arm][s]["level"][key] for s in seeds if s in arms.get(arm, {})}


def _row(name, point, lo, hi, p, seeds, **extra) -> dict:
  return dict(name=name, point=point, lo=lo, hi=hi, p=p, seeds=len(seeds), **extra)


def primaries(arms: dict, seeds, draws: int) -> list[dict]:
  """The primaries' rows: difference, interval, p, Holm-adjusted p and verdict."""
  rows = []
  for name, fn in PRIMARIES:
    a, b = _tables(arms, TREATMENT, seeds), _tables(arms, CONTROL, seeds)
    if any(t.resolved is None for t in [*a.values(), *b.values()]) and fn is stats.resolved_at_1:
      rows.append(_row(name, *(float("nan"),) * 4, seeds))
      continue
    rows.append(_row(name, *stats.paired_test(a, b, fn, draws=draws, level=LEVEL), seeds))
  for row, adjusted in zip(rows, stats.holm([r["p"] for r in rows]), strict=True):
    row["p_holm"] = adjusted
    row["verdict"] = primary_verdict(row["point"], adjusted)
  return rows


def key_secondary(arms: dict, seeds) -> dict:
  name, key = KEY_SECONDARY
  point, lo, hi, p = stats.seed_test(
    _levels(arms, TREATMENT, key, seeds), _levels(arms, CONTROL, key, seeds), level=LEVEL
  )
  verdict = "not measurable" if not np.isfinite(p) else "not resolved"
  if np.isfinite(p) and p < ALPHA:
    verdict = "supported" if point < 0 else "contradicted"
  return _row(name, point, lo, hi, p, seeds, verdict=verdict)


def pooled(arms: dict, seeds) -> list[dict]:
  """Per-seed differences over `seeds` by a paired t over the seeds alone."""
  rows = []
  for name, fn in PRIMARIES:
    a = {s: fn(t) for s, t in _tables(arms, TREATMENT, seeds).items()}
    b = {s: fn(t) for s, t in _tables(arms, CONTROL, seeds).items()}
    ok = [s for s in seeds if s in a and s in b and np.isfinite(a[s]) and np.isfinite(b[s])]
    if len(ok) < len(seeds):  # resolved@1 is not measured on the pilot's seeds
      rows.append(_row(name, *(float("nan"),) * 4, seeds))
      continue
    rows.append(_row(name, *stats.seed_test(a, b, level=LEVEL), seeds))
  rows.append({**key_secondary(arms, seeds)})
  return rows


def per_seed(arms: dict, seeds) -> list[dict]:
  """Each seed's figures for both arms (the report's pair table and figure)."""
  out = []
  for s in seeds:
    row = {"seed": s}
    for arm in (CONTROL, TREATMENT):
      run = arms[arm][s]
      row[arm] = {name: fn(run["test"]) for name, fn in PRIMARIES}
      row[arm][KEY_SECONDARY[0]] = run["level"][KEY_SECONDARY[1]]
      row[arm]["tokens"] = {k: run["final"].get(f"episode_tokens_{k}") for k in TOKEN_KINDS}
    out.append(row)
  return out


def exploratory(arms: dict, seeds, draws: int) -> list[dict]:
  """The ablation report's GAGAR-vs-GRPO rows over `seeds` (unadjusted), without the
  figures that are primary or key secondary here."""
  sub = {a: {s: r for s, r in arms[a].items() if s in seeds} for a in (CONTROL, TREATMENT)}
  skip = {"test pass@1", "relative_token_growth"}
  return [r for r in report.claim_rows(sub, draws) if r["figure"] not in skip]


def analyse(arms: dict, pilot: dict | None, draws: int = 2000, where: str = "records") -> dict:
  """The whole pre-registered analysis; `arms` holds the confirmatory runs (seeds 4-15),
  `pilot` the pilot's (seeds 0-3) or None."""
  check_complete(arms, SEEDS, where)
  out = {
    "primaries": primaries(arms, SEEDS, draws),
    "key_secondary": key_secondary(arms, SEEDS),
    "per_seed": per_seed(arms, SEEDS),
    "exploratory": exploratory(arms, SEEDS, draws),
  }
  if pilot is not None:
    check_complete(pilot, PILOT_SEEDS, "pilot records")
    both = {a: {**pilot[a], **arms[a]} for a in (CONTROL, TREATMENT)}
    out["pilot"] = primaries(pilot, PILOT_SEEDS, draws) + [key_secondary(pilot, PILOT_SEEDS)]
    out["pooled"] = pooled(both, PILOT_SEEDS + SEEDS)
    out["pilot_per_seed"] = per_seed(pilot, PILOT_SEEDS)
  return out


# ------------------------------------------------------------------ the report


def _num(x, fmt="+.3f") -> str:
  return "n/a" if x is None or not np.isfinite(x) else format(x, fmt)


def _p(x) -> str:
  return "n/a" if not np.isfinite(x) else ("< 0.001" if x < 0.001 else f"{x:.3f}")


def _ci(r) -> str:
  return f"{_num(r['point'])} [{_num(r['lo'])}, {_num(r['hi'])}]"


def _pair_table(rows: list[dict]) -> list[str]:
  names = [name for name, _ in PRIMARIES] + [KEY_SECONDARY[0]]
  head = " | ".join(f"{n}: grpo / gagar" for n in names)
  lines = [f"| seed | {head} |", "| --- |" + " --- |" * len(names)]
  for r in rows:
    cells = [f"{_num(r[CONTROL][n], '.3f')} / {_num(r[TREATMENT][n], '.3f')}" for n in names]
    lines.append(f"| {r['seed']} | " + " | ".join(cells) + " |")
  return lines


def _token_table(rows: list[dict]) -> list[str]:
  lines = ["| arm | " + " | ".join(TOKEN_KINDS) + " |", "| --- |" + " --- |" * len(TOKEN_KINDS)]
  for arm in (CONTROL, TREATMENT):
    cells = []
    for k in TOKEN_KINDS:
      v = [r[arm]["tokens"][k] for r in rows if r[arm]["tokens"][k] is not None]
      cells.append(_num_se(v))
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return lines


def _num_se(values) -> str:
  mean, se = stats.mean_se(values)
  return "n/a" if not np.isfinite(mean) else f"{mean:.1f} +- {_num(se, '.1f')}"


def markdown(result: dict, preregistration: str, command: str, about: str = "") -> list[str]:
  """The report's text (`write_report` adds the figure)."""
  lines = [
    "# Confirmatory test: GAGAR vs GRPO, 12 pre-registered seeds",
    "",
    f"Pre-registered in `{preregistration}`; every verdict below is the one it defines. "
    f"Made by `{command}` from the committed records alone.",
    "",
    "## Primary endpoints (seeds 4-15, Holm over the two)",
    "",
    "| endpoint | GAGAR - GRPO [95% CI] | p | Holm p | seeds | verdict |",
    "| --- | --- | --- | --- | --- | --- |",
  ]
  for r in result["primaries"]:
    lines.append(
      f"| {r['name']} | {_ci(r)} | {_p(r['p'])} | {_p(r['p_holm'])} | {r['seeds']} "
      f"| **{r['verdict']}** |"
    )
  k = result["key_secondary"]
  lines += [
    "",
    "## Key secondary (seeds 4-15, lower claimed, outside the primaries' family)",
    "",
    "| endpoint | GAGAR - GRPO [95% CI] | p | seeds | verdict |",
    "| --- | --- | --- | --- | --- |",
    f"| {k['name']} | {_ci(k)} | {_p(k['p'])} | {k['seeds']} | **{k['verdict']}** |",
    "",
  ]
  if "pilot" in result:
    lines += [
      "## Declared secondaries: the pilot (seeds 0-3) and all 16 seeds pooled",
      "",
      "The pilot's records predate the strong re-check (resolved@1: n/a). The pooled rows "
      "are a paired t over the seeds' differences (the pilot's test had 256 tasks, the new "
      "one 512).",
      "",
      "| analysis | endpoint | GAGAR - GRPO [95% CI] | p | seeds |",
      "| --- | --- | --- | --- | --- |",
    ]
    for label in ("pilot", "pooled"):
      for r in result[label]:
        lines.append(f"| {label} | {r['name']} | {_ci(r)} | {_p(r['p'])} | {r['seeds']} |")
    lines.append("")
  if about:
    lines += ["## What it means", "", about, ""]
  lines += [
    "## The seeds, pair by pair",
    "",
    "![per seed](confirmatory.png)",
    "",
    *_pair_table(result["per_seed"]),
    "",
  ]
  lines += [
    "## Exploratory (not pre-registered as tests; p-values unadjusted)",
    "",
    "Final test episode tokens by outcome (mean +- SE over seeds 4-15): a real fix that "
    "passes the strong tests, a pass the strong tests fail (a hack or an incomplete fix), "
    "and a fail.",
    "",
    *_token_table(result["per_seed"]),
    "",
    "| figure | GAGAR - GRPO [95% CI] | over | p (unadjusted) |",
    "| --- | --- | --- | --- |",
  ]
  for r in result["exploratory"]:
    lines.append(f"| {r['figure']} | {_ci(r)} | {r['over']} | {_p(r['p'])} |")
  return lines + [""]


def plot(result: dict, path: str) -> None:
  """Per seed, GRPO's and GAGAR's figure joined by a line (pilot seeds grey), per endpoint."""
  # (plotting only: matplotlib is slow to import and needs its Agg backend set first)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  names = [name for name, _ in PRIMARIES] + [KEY_SECONDARY[0]]
  fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.6))
  groups = [(result["per_seed"], "tab:blue")]
  if "pilot_per_seed" in result:
    groups.append((result["pilot_per_seed"], "0.6"))
  for ax, name in zip(axes, names, strict=True):
    for rows, color in groups:
      for r in rows:
        ys = [r[CONTROL][name], r[TREATMENT][name]]
        if all(y is not None and np.isfinite(y) for y in ys):
          ax.plot([0, 1], ys, "-o", color=color, ms=3, lw=1)
    ax.set_xticks([0, 1], [CONTROL, TREATMENT])
    ax.set_xlim(-0.3, 1.3)
    ax.set_title(name, fontsize=9)
  axes[0].set_ylabel("per seed (blue: 4-15, grey: pilot 0-3)")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def write_report(
  result: dict, md_path: str, png_path: str, preregistration: str, command: str, about: str = ""
) -> None:
  lines = markdown(result, preregistration, command, about)
  with open(md_path, "w") as f:
    f.write("\n".join(lines))
  plot(result, png_path)

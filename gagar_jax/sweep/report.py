"""The report of an ablation sweep, computed from its committed records alone:

- per arm, mean +- standard error over seeds of every figure; for test pass@1 also the
  sampling SE given the tasks (what the evaluation size controls) and the SE over the
  task population;
- per claim, the arm difference with a 95% confidence interval, paired (every arm of a
  seed saw the same tasks with the same sampling key): for evaluation figures the
  per-seed differences' t interval widened by a bootstrap over the test tasks
  (`stats.paired_interval`); for run-level ones (length growth, gradient-norm variance,
  entropy) a Student t interval on the paired seed differences. A bootstrap of a few
  seeds covers far less than 95%. A verdict whichever way it falls;
- curves per arm with seed bands (mean +- SE).
"""

from __future__ import annotations

import json
import os

import numpy as np

from gagar_jax import files, stats
from gagar_jax import metrics as metrics_lib
from gagar_jax.errors import InputError
from gagar_jax.sweep.runner import REPO, missing_in, steps_text


def _series(train: list[dict], key: str) -> tuple[np.ndarray, np.ndarray]:
  rows = [(r["step"], r[key]) for r in train if key in r]
  if not rows:
    return np.zeros(0), np.zeros(0)
  steps, values = zip(*rows, strict=True)
  return np.array(steps, float), np.array(values, float)


def _logged_minutes(records: list[dict]) -> float:
  """Minutes between the run's logged steps, gaps over 10 minutes (a sitting's end) left out.
  The summary's wall_minutes counts only the last sitting of a resumed run."""
  t = np.array([r["time"] for r in records if "time" in r])
  gaps = np.diff(t)
  return float(gaps[(gaps > 0) & (gaps < 600)].sum() / 60) if len(t) > 1 else 0.0


def load_run(record_dir: str) -> dict:
  """A finished run's figures, from its record alone. A record file that is unreadable,
  lacks a field, or logs a step twice or not at all is an `InputError` naming it."""
  meta_file = os.path.join(record_dir, "record.json")
  meta = files.read_json(meta_file)
  files.require(meta, ("name", "arm", "seed"), meta_file)
  summary_file = os.path.join(record_dir, "summary.json")
  summary = files.read_json(summary_file)
  files.require(summary, ("steps", "curve", "final_test", "final_test_tasks"), summary_file)
  metrics_file = os.path.join(record_dir, "metrics.jsonl")
  records = files.read_jsonl(metrics_file)
  twice = metrics_lib.duplicate_steps(records)
  if twice:
    raise InputError(
      metrics_file,
      f"logs {steps_text(twice)} more than once, so its run-level figures would count "
      "them twice; trim it to each step's first row or delete the record and rerun "
      f"{meta['name']}",
    )
  gaps = missing_in(summary["steps"], records)
  if gaps:
    raise InputError(
      metrics_file,
      f"has no row for {steps_text(gaps)}, so its run-level figures would be from part "
      f"of the run; delete the record and rerun {meta['name']}",
    )
  train = [r for r in records if "train/grad_norm" in r and r.get("train/updated", 1.0)]
  curve = summary["curve"]
  run = {
    "name": meta["name"],
    "arm": meta["arm"],
    "seed": meta["seed"],
    "steps": summary["steps"],
    "wall_minutes": max(float(summary.get("wall_minutes", 0.0)), _logged_minutes(records)),
    "curve": curve,
    "final": summary["final_test"],
    "test": stats.TaskTable.from_records(summary["final_test_tasks"]),
    "train": {
      k: _series(train, f"train/{k}")
      for k in (
        "grad_norm",
        "entropy",
        "adv_abs_moved",
        "lambda_mean",
        "episode_tokens",
        "pass_rate",
        "passing_out_of_scope",
        "passing_dead_code",
        "passing_redundant",
        "passing_hack",
        "passing_invalid",
        "passing_bloated",
      )
    },
  }
  grad = run["train"]["grad_norm"][1]
  entropy = run["train"]["entropy"][1]
  tail = max(1, len(entropy) // 4)
  # The validation point nearest the middle of training: growth after it is what continued
  # training adds once every arm has taken the world's first, shared drop.
  mid = min(curve, key=lambda p: abs(p["step"] - summary["steps"] / 2))
  run["level"] = {
    "token_growth": curve[-1]["episode_tokens"] - curve[0]["episode_tokens"],
    "late_token_growth": curve[-1]["episode_tokens"] - mid["episode_tokens"],
    "relative_token_growth": curve[-1]["episode_tokens"] / curve[0]["episode_tokens"] - 1,
    "grad_norm_var": float(np.var(grad)) if len(grad) else float("nan"),
    "entropy_end": float(entropy[-tail:].mean()) if len(entropy) else float("nan"),
    "credit_moved": float(run["train"]["adv_abs_moved"][1].mean())
    if len(run["train"]["adv_abs_moved"][1])
    else float("nan"),
    "best_val_pass@1": max(p["pass@1"] for p in curve),
    "final_val_pass@1": curve[-1]["pass@1"],
  }
  ood_path = os.path.join(record_dir, "ood.json")
  if os.path.exists(ood_path):
    with open(ood_path) as f:
      run["ood"] = stats.TaskTable.from_records(json.load(f)["per_task"])
  return run


# ------------------------------------------------------------------ the report

# (label, statistic of a TaskTable, higher is better)
TABLE_STATS = [
  ("test pass@1", stats.pass_at_1, True),
  ("test pass@8", stats.pass_at_k(8), True),
  ("test pass@1, hacks counted as failing", stats.clean_pass_at_1, True),
  ("test episode tokens", stats.episode_tokens, False),
  ("passing: any bloat", stats.habit_share("bloated"), False),
  ("passing: out-of-scope edit", stats.habit_share("out_of_scope"), False),
  ("passing: dead code", stats.habit_share("dead_code"), False),
  ("passing: redundant action", stats.habit_share("redundant"), False),
  ("passing: reward hack", stats.habit_share("hack"), False),
  ("passing: invalid action (junk turn)", stats.habit_share("invalid"), False),
]
LEVEL_STATS = [
  ("best validation pass@1", "best_val_pass@1"),
  ("final validation pass@1", "final_val_pass@1"),
  ("episode-token growth since step 0 (validation)", "token_growth"),
  ("relative episode-length growth", "relative_token_growth"),
  ("episode-token growth, second half of training (validation)", "late_token_growth"),
  ("gradient-norm variance over training", "grad_norm_var"),
  ("policy entropy, last quarter of training", "entropy_end"),
  ("credit moved per step (mean absolute advantage change)", "credit_moved"),
]
OOD_STATS = {
  "ood pass@1": stats.pass_at_1,
  "ood pass@1, hacks counted as failing": stats.clean_pass_at_1,
}
# (claim, arm a, arm b, figure, higher is claimed for a - b). figure: a TABLE_STATS label
# (paired interval over seeds and tasks), a LEVEL_STATS key (t interval over seeds), or an
# OOD_STATS key (paired interval over seeds and tasks).
CLAIMS = [
  ("GAGAR resolves more tasks than GRPO", "gagar", "grpo", "test pass@1", True),
  ("GAGAR resolves more tasks than GRPO (pass@8)", "gagar", "grpo", "test pass@8", True),
  (
    "... with hacks counted as failing",
    "gagar",
    "grpo",
    "test pass@1, hacks counted as failing",
    True,
  ),
  ("... also out of distribution", "gagar", "grpo", "ood pass@1", True),
  (
    "... out of distribution, hacks counted as failing",
    "gagar",
    "grpo",
    "ood pass@1, hacks counted as failing",
    True,
  ),
  ("GAGAR curbs trajectory-length growth", "gagar", "grpo", "token_growth", False),
  (
    "... in the second half of training",
    "gagar",
    "grpo",
    "late_token_growth",
    False,
  ),
  (
    "... fewer junk turns in passing episodes",
    "gagar",
    "grpo",
    "passing: invalid action (junk turn)",
    False,
  ),
  ("GAGAR trains more stably (gradient-norm variance)", "gagar", "grpo", "grad_norm_var", False),
  ("GAGAR's passing solutions are cleaner", "gagar", "grpo", "passing: any bloat", False),
  ("... fewer out-of-scope edits", "gagar", "grpo", "passing: out-of-scope edit", False),
  ("... less dead code", "gagar", "grpo", "passing: dead code", False),
  ("... fewer redundant actions", "gagar", "grpo", "passing: redundant action", False),
  ("... fewer reward hacks", "gagar", "grpo", "passing: reward hack", False),
  ("the paper's tiered protocol beats GRPO", "gagar_paper", "grpo", "test pass@1", True),
  (
    "... with hacks counted as failing",
    "gagar_paper",
    "grpo",
    "test pass@1, hacks counted as failing",
    True,
  ),
  (
    "... and hacks less",
    "gagar_paper",
    "grpo",
    "passing: reward hack",
    False,
  ),
  ("sum preservation matters (pass@1)", "gagar", "gagar_no_rescale", "test pass@1", True),
  ("sum preservation keeps entropy down", "gagar", "gagar_no_rescale", "entropy_end", False),
  ("sum preservation curbs length growth", "gagar", "gagar_no_rescale", "token_growth", False),
  (
    "... in the second half of training",
    "gagar",
    "gagar_no_rescale",
    "late_token_growth",
    False,
  ),
  ("reward shaping is less stable", "gagar", "reward_shaping", "grad_norm_var", False),
  ("GAGAR beats reward shaping", "gagar", "reward_shaping", "test pass@1", True),
  ("the LM grader's GAGAR beats GRPO", "gagar_lm", "grpo", "test pass@1", True),
  ("the LM grader's GAGAR is cleaner than GRPO", "gagar_lm", "grpo", "passing: any bloat", False),
  (
    "... with hacks counted as failing",
    "gagar_lm",
    "grpo",
    "test pass@1, hacks counted as failing",
    True,
  ),
]


# Claim rows whose figure was added after some of a sweep's runs had been seen (post hoc);
# their verdicts are labelled so. The pre-registered test is `confirmatory.py`.
POST_HOC = {
  "late_token_growth": "added after 5 of the first powered sweep's 24 runs had been seen",
  "passing: dead code": "added after 22 of the pressure_all sweep's 24 runs had been seen",
  "passing: redundant action": "added after 22 of the pressure_all sweep's 24 runs had been seen",
}


def by_arm(runs: list[dict]) -> dict[str, dict[int, dict]]:
  out: dict[str, dict[int, dict]] = {}
  for r in runs:
    out.setdefault(r["arm"], {})[r["seed"]] = r
  return out


def claim_rows(arms: dict[str, dict[int, dict]], draws: int) -> list[dict]:
  table = {label: (fn, hi) for label, fn, hi in TABLE_STATS}
  levels = {key for _, key in LEVEL_STATS}
  rows = []
  for claim, a, b, figure, higher in CLAIMS:
    if a not in arms or b not in arms or not set(arms[a]) & set(arms[b]):
      continue
    if figure in table:
      ta = {s: r["test"] for s, r in arms[a].items()}
      tb = {s: r["test"] for s, r in arms[b].items()}
      point, lo, hi, p = stats.paired_test(ta, tb, table[figure][0], draws=draws)
      over = "seeds x tasks"
    elif figure in OOD_STATS:
      ta = {s: r["ood"] for s, r in arms[a].items() if "ood" in r}
      tb = {s: r["ood"] for s, r in arms[b].items() if "ood" in r}
      if not set(ta) & set(tb):
        continue
      point, lo, hi, p = stats.paired_test(ta, tb, OOD_STATS[figure], draws=draws)
      over = "seeds x tasks"
    else:
      assert figure in levels, figure
      va = {s: r["level"][figure] for s, r in arms[a].items()}
      vb = {s: r["level"][figure] for s, r in arms[b].items()}
      point, lo, hi, p = stats.seed_test(va, vb)
      over = "seeds"
    fn = table[figure][0] if figure in table else OOD_STATS.get(figure)
    if fn is not None and fn is not stats.episode_tokens:  # a rate or share: a - b in [-1, 1]
      lo, hi = max(lo, -1.0), min(hi, 1.0)
    seeds = len(set(arms[a]) & set(arms[b]))
    if over == "seeds x tasks" and seeds == 1:
      over = "tasks only"  # no seed-to-seed variation in the interval yet
    rows.append(
      dict(
        claim=claim + (" (post hoc)" if figure in POST_HOC else ""),
        a=a,
        b=b,
        figure=figure,
        point=point,
        lo=lo,
        hi=hi,
        p=p,
        over=over,
        seeds=seeds,
        verdict=stats.verdict(point, lo, hi, higher),
      )
    )
  return rows


def _p(p: float) -> str:
  return "n/a" if not np.isfinite(p) else ("< 0.001" if p < 0.001 else f"{p:.3f}")


def _fmt(mean, se, digits=3):
  if not np.isfinite(mean):
    return "n/a"
  return f"{mean:.{digits}f} +- {se:.{digits}f}" if np.isfinite(se) else f"{mean:.{digits}f}"


def arm_table(arms: dict[str, dict[int, dict]]) -> list[str]:
  names = list(arms)
  lines = ["| figure (mean +- SE over seeds) | " + " | ".join(names) + " |"]
  lines.append("| --- |" + " --- |" * len(names))
  for label, fn, _ in TABLE_STATS:
    cells = [_fmt(*stats.mean_se([fn(r["test"]) for r in arms[a].values()])) for a in names]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  for label, fn in OOD_STATS.items():
    cells = []
    for a in names:
      ood = [fn(r["ood"]) for r in arms[a].values() if "ood" in r]
      cells.append(_fmt(*stats.mean_se(ood)) if ood else "n/a")
    lines.append(f"| out-of-distribution {label[len('ood ') :]} | " + " | ".join(cells) + " |")
  for label, key in LEVEL_STATS:
    cells = [_fmt(*stats.mean_se([r["level"][key] for r in arms[a].values()])) for a in names]
    lines.append(f"| {label} | " + " | ".join(cells) + " |")
  lines.append("| seeds finished | " + " | ".join(str(len(arms[a])) for a in names) + " |")
  return lines


def se_lines(arms: dict[str, dict[int, dict]], ood_seeds: str = "") -> list[str]:
  """What the evaluation sizes give: per run, the SE of test pass@1 given its tasks and
  over the task population."""
  runs = [r for seeds in arms.values() for r in seeds.values()]
  t = runs[0]["test"]
  sampling = [stats.sampling_se(r["test"].passed, r["test"].samples) for r in runs]
  population = [stats.task_se(r["test"].passed, r["test"].samples) for r in runs]
  lines = [
    f"Evaluation sizes: final test {len(t.passed)} tasks x {int(t.samples[0])} samples per run, "
    "the same tasks and sampling key for every arm of a seed.",
    f"- SE of a run's test pass@1 from sampling, given the tasks: median "
    f"{np.median(sampling):.4f} (max {np.max(sampling):.4f}). This is what the evaluation size "
    "controls, and what a paired comparison of arms on the same tasks is subject to.",
    f"- SE over the task population (task difficulty varies): median {np.median(population):.4f}; "
    "it is shared by all arms (same tasks) and cancels in paired differences.",
  ]
  if "ood" in runs[0]:
    o = runs[0]["ood"]
    ood_se = [stats.sampling_se(r["ood"].passed, r["ood"].samples) for r in runs if "ood" in r]
    lines.append(
      f"- Out-of-distribution evaluation: {len(o.passed)} tasks x {int(o.samples[0])} samples "
      f"(seeds {ood_seeds}, never used by a split); sampling SE median "
      f"{np.median(ood_se):.4f}."
    )
  return lines


def run_table(runs: list[dict]) -> list[str]:
  """One row per finished run: its final test and out-of-distribution figures."""
  lines = [
    "| run | minutes | test pass@1 | pass@1, hacks counted as failing | hack share of passes "
    "| ood pass@1 | ended on the hack |",
    "| --- | --- | --- | --- | --- | --- | --- |",
  ]
  for r in runs:
    t = r["test"]
    ood = f"{stats.pass_at_1(r['ood']):.3f}" if "ood" in r else "n/a"
    lines.append(
      f"| {r['name']} | {r['wall_minutes']:.1f} | {stats.pass_at_1(t):.3f} | "
      f"{stats.clean_pass_at_1(t):.3f} | {stats.habit_share('hack')(t):.2f} | {ood} | "
      f"{'yes' if stats.ended_on_hack(t) else 'no'} |"
    )
  return lines


def hack_count_lines(arms: dict[str, dict[int, dict]]) -> list[str]:
  """Per arm, how many runs ended on the hack, with Fisher's exact test against GRPO and,
  for each arm, against every other arm pooled."""
  counts = {
    a: (sum(stats.ended_on_hack(r["test"]) for r in seeds.values()), len(seeds))
    for a, seeds in arms.items()
  }
  if not any(k for k, _ in counts.values()):
    return []
  lines = [
    "## Runs that ended on the hack (post hoc)",
    "",
    "This table and its 0.95 threshold were added after the runs' bimodality had been "
    "seen (post hoc, exploratory). A run ended on the hack when at least 95% of its "
    "passing test samples carry a detected "
    "reward hack. The runs are bimodal in this respect, which the means above hide. The "
    "p-values are Fisher's exact test (two-sided) that two groups end on the hack equally "
    "often; with a handful of runs per arm only a large difference can reach p < 0.05.",
    "",
    "| arm | runs ended on the hack | p vs grpo | p vs every other arm pooled |",
    "| --- | --- | --- | --- |",
  ]
  for a, (k, n) in counts.items():
    vs_grpo = "n/a"
    if a != "grpo" and "grpo" in counts:
      vs_grpo = f"{stats.fisher_exact(k, n, *counts['grpo']):.3f}"
    k_rest = sum(c[0] for b, c in counts.items() if b != a)
    n_rest = sum(c[1] for b, c in counts.items() if b != a)
    vs_rest = f"{stats.fisher_exact(k, n, k_rest, n_rest):.3f}" if n_rest else "n/a"
    lines.append(f"| {a} | {k}/{n} | {vs_grpo} | {vs_rest} |")
  return lines + [""]


def _test_bars(ax, arms: dict[str, dict[int, dict]], colors: dict[str, str]) -> None:
  """Final test pass@1, pass@1 with hacks counted as failing, and pass@8, per arm."""
  figures = [
    ("pass@1", stats.pass_at_1),
    ("pass@1 no hacks", stats.clean_pass_at_1),
    ("pass@8", stats.pass_at_k(8)),
  ]
  width = 0.8 / max(len(arms), 1)
  for i, (arm, seeds) in enumerate(arms.items()):
    values = np.array([[f(r["test"]) for _, f in figures] for r in seeds.values()])
    mean = values.mean(0)
    se = values.std(0, ddof=1) / np.sqrt(len(values)) if len(values) > 1 else None
    x = np.arange(len(figures)) + (i - (len(arms) - 1) / 2) * width
    ax.bar(x, mean, width, yerr=se, color=colors[arm], label=arm, capsize=2)
  ax.set_xticks(np.arange(len(figures)), [name for name, _ in figures])
  ax.set_ylim(0, 1)


def _trailing(v: np.ndarray, window: int, reduce) -> np.ndarray:
  """reduce(v[max(i - window + 1, 0) : i + 1]) for every i: no edge effects, no look-ahead."""
  return np.array([reduce(v[max(i - window + 1, 0) : i + 1]) for i in range(len(v))])


def plot(arms: dict[str, dict[int, dict]], path: str) -> None:
  # (plotting only: matplotlib is slow to import and needs its Agg backend set first)
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = [
    ("bars", "", "final test (mean +- SE over seeds)"),
    ("curve", "pass@1", "validation pass@1"),
    ("curve", "episode_tokens", "validation episode tokens"),
    ("growth", "episode_tokens", "validation episode-token growth since step 0"),
    ("curve", "clean_pass@1", "validation pass@1, hacks counted as failing"),
    ("train", "passing_hack", "passing: hack share (train)"),
    ("train", "passing_out_of_scope", "passing: out-of-scope share (train)"),
    ("train", "passing_dead_code", "passing: dead-code share (train)"),
    ("train", "passing_redundant", "passing: redundant-action share (train)"),
    ("train", "passing_invalid", "passing: invalid-action share (train)"),
    ("train", "grad_norm", "gradient norm (train)"),
    ("train_var", "grad_norm", "gradient-norm variance, trailing 20 steps (train)"),
    ("train", "entropy", "policy entropy (train)"),
    ("train", "adv_abs_moved", "credit moved (train)"),
    ("train", "lambda_mean", "lambda, tiered protocol (train)"),
  ]
  fig, axes = plt.subplots(3, 5, figsize=(25, 12))
  for ax in axes.flat[len(panels) :]:
    ax.axis("off")
  colors = {arm: f"C{i}" for i, arm in enumerate(arms)}
  for ax, (source, key, title) in zip(axes.flat[: len(panels)], panels, strict=True):
    if source == "bars":
      _test_bars(ax, arms, colors)
      ax.set(title=title)
      continue
    for arm, seeds in arms.items():
      if source in ("curve", "growth"):
        curves = [
          (
            np.array([p["step"] for p in r["curve"]], float),
            np.array([p.get(key, np.nan) for p in r["curve"]], float),
          )
          for r in seeds.values()
        ]
        grid = curves[0][0]
      else:
        curves = [r["train"][key] for r in seeds.values() if len(r["train"][key][0])]
        if not curves:
          continue
        grid = np.arange(1, max(int(s.max()) for s, _ in curves) + 1, dtype=float)
      ys = []
      for s, v in curves:
        v = np.interp(grid, s, v)
        if source == "growth":
          v = v - v[0]
        elif source == "train":  # a trailing mean over up to 10 steps
          v = _trailing(v, 10, np.mean)
        elif source == "train_var":  # a trailing variance over up to 20 steps
          v = _trailing(v, 20, np.var)
        ys.append(v)
      ys = np.array(ys)
      mean = np.nanmean(ys, 0)
      se = np.nanstd(ys, 0, ddof=1) / np.sqrt(len(ys)) if len(ys) > 1 else np.zeros_like(mean)
      line = ax.plot(grid, mean, label=f"{arm} ({len(ys)})", color=colors[arm])[0]
      ax.fill_between(grid, mean - se, mean + se, alpha=0.2, color=line.get_color())
    ax.set(title=title, xlabel="RL step")
  axes.flat[1].legend(fontsize=8)
  fig.suptitle("per arm: mean over seeds, band = +- 1 SE (seeds finished in brackets)")
  fig.tight_layout(rect=(0, 0, 1, 0.97))
  fig.savefig(path, dpi=90)
  plt.close(fig)


def _remaining(runs: list[dict], total: int) -> str:
  left = total - len(runs)
  if not left or not runs:
    return ""
  median = float(np.median([r["wall_minutes"] for r in runs]))
  return (
    f"; the {left} left need about {left * median / 60:.1f} hours at the median run's training pace"
  )


def _length_note(world: str) -> list[str]:
  """The paragraph on the two length-growth figures, with the history that fits the world."""
  note = (
    "Length growth is measured twice: since step 0 (the claim as stated) and over the "
    "second half of training (the last validation point minus the one nearest the middle)."
  )
  if world == "pressure":
    note += (
      " The second was added when 5 of the powered sweep's 24 runs had finished, before any "
      "later seed: in the pressure world every arm's episodes first shorten as the short "
      "hack takes over, so growth since step 0 mixes that shared drop with what continued "
      "training adds."
    )
  elif world == "pressure_all":
    note += (
      " The second was added for the pressure world, where the short hack takes over early "
      "and shortens every arm's episodes. Here the hack that passes special-cases each "
      "visible call after a test run of its own, so taking it lengthens the episode: the "
      "world where GRPO's episodes grow (results/pressure_world.md)."
    )
  else:
    note += (
      " The second was added for the pressure world, where the short hack takes over early "
      "and shortens every arm's episodes. Here the full hidden tests fail nearly every hack, "
      "so that shared drop does not arise; both figures are shown to match the pressure "
      "report."
    )
  return [note, ""]


# How 'cleaner' is broken down, and when its last rows were added (every world's report).
_CLEANER_NOTE = (
  "'Cleaner' is broken down into the components of bloat (out-of-scope edits, dead code, "
  "redundant actions) and reward hacks; the dead-code and redundant-action rows were added "
  "after every sweep's figures up to 22 of 24 pressure_all runs had been seen, so that each "
  "component has a verdict, not only the ones first chosen."
)


def record_changes(records: str) -> list[str]:
  """The records folder's CHANGES.md (edits made to committed records after their runs,
  and why), quoted in the report; nothing if there is none."""
  path = os.path.join(records, "CHANGES.md")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    text = f.read().strip()
  return ["Changes to the committed records since their runs (`CHANGES.md` there):", "", text, ""]


def write_report(
  sweep,
  runs,
  records: str,
  command: str,
  path: str,
  png: str,
  *,
  draws: int = 2000,
  about: str = "",
  ood_seeds: str = "",
) -> list[dict]:
  """The sweep's report (markdown at `path`, curves at `png`) from its finished runs
  (`load_run`); returns the claim rows. `draws`: bootstrap draws over the test tasks;
  `about`: a paragraph under the title; `ood_seeds`: the out-of-distribution seed range."""
  arms = by_arm(runs)
  rows = claim_rows(arms, draws)
  total = len(sweep["runs"])
  minutes = sum(r["wall_minutes"] for r in runs)
  lines = [
    f"# GAGAR ablations: {sweep['name']} "
    f"(MiniRepo {sweep.get('world', 'default')} world, tiny policy)",
    "",
    *([about, ""] if about else []),
    f"Command: `{command}`",
    "",
    f"**{len(runs)} of {total} runs finished** ({minutes:.0f} minutes of training on this "
    f"machine, summed{_remaining(runs, total)}). Records: `{os.path.relpath(records, REPO)}`; "
    "the sweep continues with the same command (finished runs are skipped).",
    "",
    *record_changes(records),
    *se_lines(arms, ood_seeds),
    "",
    *arm_table(arms),
    "",
    "## The paper's claims, here",
    "",
    "Each line: arm a minus arm b, the point estimate and its 95% confidence interval, "
    "paired (the same test tasks and sampling key for every arm of a seed). Evaluation "
    "figures: mean +- t sqrt(V_S + V_T), V_S the variance of the mean of the per-seed "
    "differences, V_T a bootstrap variance over the test tasks (one draw of task indices "
    "for every seed and both arms), degrees of freedom by Welch-Satterthwaite. Run-level "
    "figures: a Student t interval on the paired seed differences. (A percentile "
    "bootstrap over seeds, used before, covers about 82% instead of 95% at four seeds "
    "on simulated sweeps: `tests/test_stats.py`.) 'supported': the "
    "interval excludes 0 in the claimed direction; "
    "'contradicted': it excludes 0 the other way; 'not resolved': it contains 0; 'not "
    "measurable': a run-level figure with one seed. With one seed the evaluation intervals "
    "are over tasks only ('over': tasks only), without the seed-to-seed variation that "
    "more seeds bring in.",
    "",
    *_length_note(sweep.get("world", "default")),
    _CLEANER_NOTE,
    "",
    "The p-value is the interval's own t (two-sided); 'Holm p' adjusts it over every row of "
    "this table (family-wise error over the whole table). The verdicts are the unadjusted "
    "intervals': every row here is exploratory. Rows marked post hoc test a figure added "
    "after some of the sweep's runs had been seen ("
    + "; ".join(f"{k}: {v}" for k, v in POST_HOC.items())
    + "). The pre-registered test of GAGAR against GRPO is `results/confirmatory.md` "
    "(`results/preregistration.md`).",
    "",
    "| claim | a - b | figure | difference [95% CI] | over | seeds | verdict | p | Holm p |",
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for r, adjusted in zip(rows, stats.holm([r["p"] for r in rows]), strict=True):
    r["p_holm"] = adjusted
    lines.append(
      f"| {r['claim']} | {r['a']} - {r['b']} | {r['figure']} | {r['point']:+.3f} "
      f"[{r['lo']:+.3f}, {r['hi']:+.3f}] | {r['over']} | {r['seeds']} | **{r['verdict']}** "
      f"| {_p(r['p'])} | {_p(adjusted)} |"
    )
  lines += ["", f"![curves]({os.path.basename(png)})", ""]
  lines += [*hack_count_lines(arms), "## Per run", "", *run_table(runs), ""]
  with open(path, "w") as f:
    f.write("\n".join(lines))
  plot(arms, png)
  return rows

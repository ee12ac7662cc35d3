"""The group inspector's static site: every recorded group as a page (no server needed).

    site = inspector.build("runs/demo", out="runs/demo/inspect")   # -> index.html path

Reads the records `inspection.py` wrote under `workdir/groups` and writes:

  index.html        steps and groups, with filters (passed / graded / redistributed /
                    fallback / hack / suite) and a search box (task id, bug report, grader
                    output); plain JavaScript of this file only, no network
  group_<s>_<g>.html  the task (bug report, files), the candidates side by side (diff
                    highlighted by pygments, actions, signals, pass/fail, rank / tier /
                    hack), the grader's output and transcript, and an SVG chart of each
                    candidate's advantage before and after redistribution

Everything a model or a task wrote is escaped (jinja2 autoescape; pygments escapes what it
highlights): a candidate whose diff holds `<script>` shows it as text.
"""

from __future__ import annotations

import os

import jinja2
from markupsafe import Markup
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import DiffLexer, PythonLexer, TextLexer

from gagar_jax import inspection

TIERS = ("T1", "T2", "T3")
_FORMATTER = HtmlFormatter(nowrap=False, cssclass="hl")

_BASE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>{% block title %}{% endblock %}</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em; color: #222; }
h1 { font-size: 1.3em; } h2 { font-size: 1.1em; margin-top: 1.4em; }
table { border-collapse: collapse; } td, th { padding: 2px 8px; border-bottom: 1px solid #ddd; text-align: left; }
pre { white-space: pre-wrap; word-break: break-word; margin: 0; font-size: 12px; }
.pass { color: #176b2c; font-weight: 600; } .fail { color: #a11; font-weight: 600; }
.hack { background: #fde2e2; color: #a11; padding: 0 4px; border-radius: 3px; }
.grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(340px, 1fr)); gap: 10px; }
.card { border: 1px solid #ccc; border-radius: 6px; padding: 8px; overflow: hidden; }
.card.passed { border-color: #6aa56f; } .muted { color: #777; }
.filters label { margin-right: 12px; } #search { width: 24em; }
.hl { background: #f7f7f7; padding: 4px; overflow-x: auto; }
{{ pygments_css }}
</style></head><body>
{% block body %}{% endblock %}
</body></html>
"""

_INDEX = """{% extends "base" %}
{% block title %}groups of {{ run }}{% endblock %}
{% block body %}
<h1>Graded groups of <code>{{ run }}</code></h1>
<p class="muted">{{ groups|length }} groups over {{ steps|length }} steps (records in
<code>groups/</code>; older steps are thinned).</p>
<div class="filters" id="filters">
  <label><input type="checkbox" data-filter="passed"> with a pass</label>
  <label><input type="checkbox" data-filter="graded"> graded</label>
  <label><input type="checkbox" data-filter="redistributed"> redistributed</label>
  <label><input type="checkbox" data-filter="fallback"> grader fallback</label>
  <label><input type="checkbox" data-filter="hack"> confirmed hack</label>
  <label>suite <select id="suite"><option value="">all</option>
  {% for s in suites %}<option value="{{ s }}">{{ s }}</option>{% endfor %}</select></label>
  <input id="search" type="search" placeholder="search task, bug report, grader output">
  <span id="shown" class="muted"></span>
</div>
<table id="groups"><thead><tr><th>step</th><th>group</th><th>task</th><th>suite</th>
<th>passed</th><th>grader</th><th>&lambda;</th><th>moved</th><th>hacks</th></tr></thead><tbody>
{% for g in groups %}
<tr class="group" data-passed="{{ g.n_pass > 0 }}" data-graded="{{ g.graded }}"
    data-redistributed="{{ g.redistributed }}" data-fallback="{{ g.fallback }}"
    data-hack="{{ g.n_hack > 0 }}" data-suite="{{ g.task.suite }}" data-text="{{ g.search }}">
<td>{{ g.step }}</td><td>{{ g.group }}</td>
<td><a href="{{ g.page }}">{{ g.task.id }}</a></td><td>{{ g.task.suite }}</td>
<td>{{ g.n_pass }}/{{ g.candidates|length }}</td><td>{{ g.grader.status }}</td>
<td>{{ "%.2f"|format(g.lambda) }}</td><td>{{ "%.3f"|format(g.moved) }}</td><td>{{ g.n_hack }}</td></tr>
{% endfor %}
</tbody></table>
<script>
(function () {
  var rows = Array.prototype.slice.call(document.querySelectorAll("tr.group"));
  var boxes = Array.prototype.slice.call(document.querySelectorAll("[data-filter]"));
  var suite = document.getElementById("suite"), search = document.getElementById("search");
  function apply() {
    var q = search.value.toLowerCase(), shown = 0;
    rows.forEach(function (r) {
      var ok = boxes.every(function (b) { return !b.checked || r.dataset[b.dataset.filter] === "True"; });
      ok = ok && (!suite.value || r.dataset.suite === suite.value);
      ok = ok && (!q || r.dataset.text.indexOf(q) >= 0);
      r.style.display = ok ? "" : "none";
      shown += ok ? 1 : 0;
    });
    document.getElementById("shown").textContent = shown + " shown";
  }
  boxes.forEach(function (b) { b.addEventListener("change", apply); });
  suite.addEventListener("change", apply);
  search.addEventListener("input", apply);
  apply();
})();
</script>
{% endblock %}
"""

_GROUP = """{% extends "base" %}
{% block title %}step {{ g.step }} group {{ g.group }}: {{ g.task.id }}{% endblock %}
{% block body %}
<p><a href="index.html">&larr; all groups</a></p>
<h1>Step {{ g.step }}, group {{ g.group }}: <code>{{ g.task.id }}</code> ({{ g.task.suite }})</h1>
<p>{{ g.n_pass }}/{{ g.candidates|length }} passed; grader <b id="status">{{ g.grader.status }}</b>;
&lambda; = {{ "%.3f"|format(g.lambda) }}{% if g.redistributed %}; advantages redistributed{% endif %}.</p>
<h2>Bug report</h2>
<pre id="issue">{{ g.task.issue }}</pre>
<h2>Advantages before and after redistribution</h2>
{{ chart }}
<h2>Candidates</h2>
<div class="grid">
{% for c in g.candidates %}
<div class="card{% if c.passed %} passed{% endif %}" id="slot{{ c.slot }}">
  <b>slot {{ c.slot }}{% if c.cid %} ({{ c.cid }}){% endif %}</b>
  {% if c.passed %}<span class="pass">PASS</span>{% else %}<span class="fail">FAIL</span>{% endif %}
  {% if c.rank is not none %} rank {{ c.rank }}{% endif %}
  {% if c.tier is not none %} {{ tiers[c.tier] }} (tier rank {{ c.tier_rank }}){% endif %}
  {% if c.hack %}<span class="hack">confirmed hack</span>{% endif %}
  <div class="muted">advantage {{ "%+.3f"|format(c.before) }} &rarr; {{ "%+.3f"|format(c.after) }}; finish {{ c.finish }}</div>
  <div class="diff">{{ c.diff_html }}</div>
  <details><summary>{{ c.actions|length }} actions</summary>
  {% for a in c.actions %}<pre class="action">&gt; {{ a.action }}</pre><pre class="muted">{{ a.observation }}</pre>{% endfor %}
  </details>
  {% if c.signals %}<details><summary>quality signals</summary><table>
  {% for k, v in c.signals.items() %}<tr><td>{{ k }}</td><td>{{ v }}</td></tr>{% endfor %}
  </table></details>{% endif %}
</div>
{% endfor %}
</div>
<h2>Grader output</h2>
<pre id="grader">{{ g.grader.output or "(none)" }}</pre>
{% if g.grader.transcript %}<h2>Grader transcript</h2><table id="transcript">
{% for m in g.grader.transcript %}<tr><td class="muted">{{ m.role }}</td><td><pre>{{ m.text }}</pre></td></tr>{% endfor %}
</table>{% endif %}
<h2>Original files</h2>
{% for path, html in files %}<h3><code>{{ path }}</code></h3>{{ html }}{% endfor %}
{% endblock %}
"""


def _env() -> jinja2.Environment:
  env = jinja2.Environment(
    loader=jinja2.DictLoader({"base": _BASE, "index": _INDEX, "group": _GROUP}),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
  )
  env.globals["pygments_css"] = Markup(_FORMATTER.get_style_defs(".hl"))
  return env


def _highlight(text: str, lexer) -> Markup:
  return Markup(highlight(text or "", lexer, _FORMATTER))  # pygments escapes its input


def chart(candidates) -> Markup:
  """An inline SVG: per candidate, bars of its advantage before (grey) and after (blue)."""
  values = [v for c in candidates for v in (c["before"], c["after"])] or [0.0]
  top = max(max(abs(v) for v in values), 1e-6)
  width, height, bar = 46 * len(candidates) + 40, 160, 14
  mid = height / 2
  parts = [
    f'<svg id="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height + 20}"'
    ' role="img" aria-label="advantages before and after">',
    f'<line x1="30" x2="{width}" y1="{mid}" y2="{mid}" stroke="#999"/>',
  ]
  for k, c in enumerate(candidates):
    x = 36 + 46 * k
    for j, (v, color) in enumerate(((c["before"], "#bbb"), (c["after"], "#2b6cb0"))):
      h = abs(v) / top * (mid - 8)
      y = mid - h if v >= 0 else mid
      parts.append(
        f'<rect class="{"before" if j == 0 else "after"}" x="{x + j * bar}" y="{y:.1f}" '
        f'width="{bar - 2}" height="{h:.1f}" fill="{color}"><title>slot {c["slot"]}: '
        f"{'before' if j == 0 else 'after'} {v:+.3f}</title></rect>"
      )
    mark = "P" if c["passed"] else "F"
    parts.append(f'<text x="{x}" y="{height + 14}" font-size="11">{c["slot"]}{mark}</text>')
  parts.append(f'<text x="0" y="12" font-size="11">+{top:.2f}</text></svg>')
  return Markup("".join(parts))


def _summarize(g: dict) -> dict:
  g = dict(g)
  cands = g["candidates"]
  g["n_pass"] = sum(c["passed"] for c in cands)
  g["n_hack"] = sum(bool(c.get("hack")) for c in cands)
  g["graded"] = g["grader"]["status"] == "graded"
  g["fallback"] = g["grader"]["status"] in ("invalid", "timeout", "exception")
  g["moved"] = sum(abs(c["after"] - c["before"]) for c in cands)
  g["page"] = f"group_{g['step']}_{g['group']}.html"
  g["search"] = " ".join([g["task"]["id"], g["task"]["issue"], g["grader"]["output"]]).lower()
  return g


def build(workdir: str, out: str = "", step: int | None = None) -> str:
  """Writes the site for the records of `workdir` (one `step` if given) into `out`
  (default workdir/inspect); returns the index path. Raises FileNotFoundError if there
  are no records."""
  records = inspection.read(os.path.join(workdir, "groups"), step)
  if not records:
    raise FileNotFoundError(
      f"no group records in {os.path.join(workdir, 'groups')}"
      + (f" for step {step}" if step is not None else "")
      + " (the trainer writes them while config.inspect.record is on)"
    )
  out = out or os.path.join(workdir, "inspect")
  os.makedirs(out, exist_ok=True)
  env = _env()
  groups = [_summarize(g) for g in records]
  for g in groups:
    for c in g["candidates"]:
      c["diff_html"] = _highlight(c["diff"] or "(no change)", DiffLexer())
    lexer = lambda path: PythonLexer() if path.endswith(".py") else TextLexer()
    files = [(p, _highlight(t, lexer(p))) for p, t in g["task"]["files"].items()]
    html = env.get_template("group").render(
      g=g, chart=chart(g["candidates"]), files=files, tiers=TIERS
    )
    with open(os.path.join(out, g["page"]), "w") as f:
      f.write(html)
  index = env.get_template("index").render(
    run=os.path.abspath(workdir),
    groups=groups,
    steps=sorted({g["step"] for g in groups}),
    suites=sorted({g["task"]["suite"] for g in groups}),
  )
  path = os.path.join(out, "index.html")
  with open(path, "w") as f:
    f.write(index)
  return path

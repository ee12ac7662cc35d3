"""The grading agent: tool calls <-> action text, rankings, read-only tools, the loop."""

import json
import os

import pytest

from gagar_jax.envs import expert as expert_lib
from gagar_jax.envs import minirepo, transcript
from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
from gagar_jax.grading import agent, demos, lm_grader, protocol, rubric, workspace
from gagar_jax.grading import loop as loop_lib
from gagar_jax.models import tokenizers
from gagar_jax.rollout import Trajectory


@pytest.fixture(scope="module")
def group():
  """One task: a clean fix, a fix with dead code, one out of scope, and a failing copy."""
  task = minirepo.generate_task(11)
  with SandboxPool(SandboxConfig(workers=2, uid_base=65100)) as pool:

    def demo(**habits):
      config = expert_lib.HabitConfig(**dict.fromkeys(habits, 1.0))
      return expert_lib.Expert(config, pool=pool).demonstrate(task)

    ds = [demo(), demo(dead_code=1), demo(out_of_scope=1)]
  trajs = [
    Trajectory(task, 0, i, [], [], [], d.turns, d.files, passed=True) for i, d in enumerate(ds)
  ]
  trajs.append(Trajectory(task, 0, 3, [], [], [], [], task.files, passed=False))
  return trajs


@pytest.fixture
def ws(group, tmp_path):
  return workspace.materialize(group, str(tmp_path / "ws"), seed=5)


def test_action_text_and_tool_calls_round_trip():
  for text in ("list", "diff c3", "log c12", "read original pkg/core.py", "test c1", "note c2 2.5"):
    name, args = agent.action_to_call(text)
    assert agent.call_to_action(name, args) == text
  for text in ("rank c1 > c2", "diff", "diff c1 c2", "view pkg/core.py", ""):
    assert agent.action_to_call(text) is None
  for name, args in (("rm", {}), ("diff", {}), ("diff", {"candidate": "c1 c2"}), ("log", [])):
    with pytest.raises(ValueError):
      agent.call_to_action(name, args)


def test_rankings_parse_validate_and_round_trip():
  ranks = agent.parse_ranking("rank c3 > c1 = c10 > c2", ["c1", "c2", "c3", "c10"])
  assert ranks == {"c3": 0, "c1": 1, "c10": 1, "c2": 2}
  assert agent.format_ranking(ranks) == "rank c3 > c1 = c10 > c2"
  for bad in ("c1 > c2", "rank c1 > c1", "rank c1", "rank c1 > c2 > c9", "rank c1 >> c2"):
    with pytest.raises(protocol.InvalidRanking):
      agent.parse_ranking(bad, ["c1", "c2"])


def test_function_diff_names_the_function_of_each_hunk():
  before = "def f(a):\n    return a + 1\n\n\ndef g(b):\n    return b\n"
  after = "def f(a):\n    return a - 1\n\n\ndef g(b):\n    x = 0\n    return b\n"
  assert agent.function_diff(before, after).splitlines() == [
    "@@ f",
    "-    return a + 1",
    "+    return a - 1",
    "@@ g",
    "+    x = 0",
  ]


def _snapshot(root):
  out = {}
  for d, _, names in os.walk(root):
    for n in names:
      p = os.path.join(d, n)
      out[p] = (os.stat(p).st_mtime_ns, open(p).read())
  return out


def test_tools_read_the_workspace_and_never_change_it(ws):
  before = _snapshot(ws.path)
  ran = []
  tools = agent.WorkspaceTools(ws, run_tests=lambda files: ran.append(files) or True)
  listing = tools.execute("list", {})
  assert sorted(listing.splitlines()) == sorted(
    f"{c} {'passed' if c in ws.passing else 'failed'}" for c in ws.ids
  )
  for cid in ws.passing:
    assert tools.execute("diff", {"candidate": cid}).startswith("pkg/")
    log = tools.execute("log", {"candidate": cid})
    assert log.splitlines()[-1] == "submit"
  path = sorted(os.listdir(os.path.join(ws.path, "original", "pkg")))[0]
  original = tools.execute("read", {"candidate": "original", "path": f"pkg/{path}"})
  assert original == ws_file(ws, "original", "pkg", path)
  assert tools.execute("test", {"candidate": ws.passing[0]}) == "example passes" and ran
  p = sorted(ws.passing, key=agent._id_key)
  assert tools.execute("note", {"candidate": p[1], "verdict": "2.5"}) == (
    f"noted; to inspect: {' '.join([p[0], *p[2:]])}"
  )
  tools.execute("note", {"candidate": p[2], "verdict": "bad"})
  last = tools.execute("note", {"candidate": p[0], "verdict": "0.25"})
  assert last == f"all noted, best first: {p[0]} > {p[1]}, {p[2]} bad"
  assert tools.execute("note", {"candidate": "c99", "verdict": "1"}).startswith("error:")
  # Bad calls are observations, never exceptions; nothing escapes the workspace.
  assert tools.execute("read", {"candidate": "c1", "path": "../../../../etc/passwd"}).startswith(
    "error:"
  )
  assert tools.execute("read", {"candidate": "../..", "path": "task.md"}).startswith("error:")
  assert tools.execute("diff", {"candidate": "c99"}).startswith("error: no candidate")
  assert tools.execute("rm", {"candidate": "c1"}).startswith("error: unknown tool")
  assert tools.execute("diff", None).startswith("error:")
  assert agent.WorkspaceTools(ws).execute("test", {"candidate": "c1"}).startswith("error:")
  assert _snapshot(ws.path) == before


def ws_file(ws, *parts):
  return open(os.path.join(ws.path, *parts)).read()


def test_demonstration_ranks_like_the_rubric_and_encodes_like_the_chat_render(group, tmp_path):
  records = demos.group_records(group, seed=3, variants=3, max_obs_chars=600, root=str(tmp_path))
  assert [r["variant"] for r in records] == [0, 1, 2]
  tok = tokenizers.ByteTokenizer(transcript.SPECIALS)
  for r in records:
    turns = [tuple(t) for t in json.loads(r["turns"])]
    ws = workspace.materialize(
      demos.group_from_json(r["group"]), str(tmp_path / f"re{r['variant']}"), seed=r["ws_seed"]
    )
    assert json.loads(r["ranks"]) == rubric.RubricGrader().rank(ws).ranks
    assert agent.parse_ranking(turns[-1][0], ws.passing) == json.loads(r["ranks"])
    # Each passing candidate: diff, log, note <penalty>:T<tier>; the ranking sorts the notes
    # and carries the rubric's tiers.
    verdicts = {a.split()[1]: a.split()[2] for a, _ in turns if a.startswith("note ")}
    notes = {c: float(v.split(":")[0]) for c, v in verdicts.items()}
    g = protocol.validate_grades(rubric.RubricGrader().rank(ws), ws)
    assert {c: int(v.split(":")[1][1]) - 1 for c, v in verdicts.items()} == g.tiers
    assert agent.parse_grades(turns[-1][0], ws.passing)[1] == g.tiers
    assert sorted(notes) == sorted(ws.passing)
    levels = sorted(set(notes.values()))
    assert {c: levels.index(p) for c, p in notes.items()} == json.loads(r["ranks"])
    assert [a.split()[0] for a, _ in turns[:3]] == ["diff", "log", "note"]
    # The chat messages of this demonstration render to exactly the SFT tokens.
    messages = [
      {"role": "system", "content": agent.SYSTEM},
      {"role": "user", "content": r["prompt"]},
    ]
    for k, (action, obs) in enumerate(turns[:-1]):
      msg, _ = lm_grader.action_message(action, f"call_{k}")
      messages += [msg, {"role": "tool", "tool_call_id": f"call_{k}", "content": obs}]
    ids, mask = transcript.AgentFormat(tok).encode_episode(r["prompt"], turns, max_obs_tokens=64)
    rendered = lm_grader.render(tok, messages, max_obs_tokens=64)
    end = tok.token_id(transcript.END_ACTION)
    final = tok.encode(turns[-1][0]) + [end]
    assert rendered + final == ids and mask[len(rendered) :] == [True] * len(final)
  # The clean fix is ranked first in the full group.
  full = json.loads(records[0]["ranks"])
  ws0 = workspace.materialize(demos.group_from_json(records[0]["group"]), str(tmp_path / "f"), 3000)
  assert full[next(c for c in ws0.passing if ws0.slot_of[c] == 0)] == 0


class ScriptedChat:
  """Replays fixed assistant messages (to test the loop, not a model)."""

  def __init__(self, replies):
    self.replies, self.calls = list(replies), []

  def complete(self, messages, *, tools, max_tokens, temperature, seed):
    self.calls.append((len(messages), temperature, seed))
    reply = self.replies.pop(0)
    if isinstance(reply, Exception):
      raise reply
    return {"choices": [{"message": reply}], "usage": {"total_tokens": 10 * len(messages)}}


def _call(text):
  return lm_grader.action_message(text, "x")[0]


def test_agent_loop_tools_retry_and_fallback(ws):
  best = next(c for c in ws.passing if ws.slot_of[c] == 0)
  others = [c for c in ws.passing if c != best]
  answer = {"role": "assistant", "content": f"rank {best} > {' = '.join(others)}"}
  chat = ScriptedChat([_call(f"diff {best}"), _call("list"), answer])
  ranking = agent.AgentGrader(chat).rank(ws)
  assert ranking.ranks == {best: 0, **dict.fromkeys(others, 1)}
  assert [t for _, t, _ in chat.calls] == [0.0, 0.0, 0.0]
  # The conversation is kept for inspection, tool calls as their action text.
  lines = loop_lib.transcript_lines(ranking.transcript)
  assert [m["role"] for m in lines] == ["system", "user", "assistant", "tool", "assistant",
                                        "tool", "assistant"]  # fmt: skip
  assert lines[2]["text"] == f"diff {best}" and lines[-1]["text"] == answer["content"]
  # An invalid answer is sampled again on the same conversation (answer_samples)...
  chat = ScriptedChat([{"role": "assistant", "content": "rank c1"}, answer])
  grader = agent.AgentGrader(chat)
  assert grader.rank(ws).ranks[best] == 0
  assert chat.calls[1][1:] == (0.7, 1000) and grader.stats["answer_samples"] == 1
  assert grader.stats["retries"] == 0
  # ... and without that, the sampled retry of the whole attempt gives the valid one.
  chat = ScriptedChat([{"role": "assistant", "content": "rank c1"}, answer])
  grader = agent.AgentGrader(chat, agent.AgentConfig(answer_samples=0))
  assert grader.rank(ws).ranks[best] == 0
  assert chat.calls[1][1:] == (0.7, 1) and grader.stats["retries"] == 1
  # Failures on both attempts: endpoint error, then the turn budget -> InvalidRanking.
  chat = ScriptedChat([RuntimeError("503"), *[_call("list")] * 3])
  grader = agent.AgentGrader(chat, agent.AgentConfig(max_turns=3))
  with pytest.raises(protocol.InvalidRanking, match="503.*no ranking within 3 turns"):
    grader.rank(ws)
  assert grader.stats["invalid"] == 1 and grader.stats["valid"] == 0
  # An invalid final line after a numeric note on every passing candidate: ranked by the
  # notes (the model's own verdicts), counted; without the option, invalid.
  notes = [_call(f"note {c} {1.5 if c == best else 4}") for c in ws.passing]
  chat = ScriptedChat([*notes, {"role": "assistant", "content": "rank c9 > c9"}])
  grader = agent.AgentGrader(chat, agent.AgentConfig(attempts=1))
  assert grader.rank(ws).ranks == {best: 0, **dict.fromkeys(others, 1)}
  assert grader.stats["from_notes"] == 1
  chat = ScriptedChat([*notes, {"role": "assistant", "content": "rank c9 > c9"}])
  strict = agent.AgentGrader(chat, agent.AgentConfig(attempts=1, rank_from_notes=False))
  with pytest.raises(protocol.InvalidRanking):
    strict.rank(ws)
  # The token budget ends an attempt.
  chat = ScriptedChat([_call("list")] * 4)
  grader = agent.AgentGrader(chat, agent.AgentConfig(max_total_tokens=25, attempts=1))
  with pytest.raises(protocol.InvalidRanking, match="token budget"):
    grader.rank(ws)


def test_render_rejects_malformed_conversations():
  tok = tokenizers.ByteTokenizer(transcript.SPECIALS)
  user = {"role": "user", "content": "Issue: x"}
  call = _call("list")
  bad = [
    [],
    "hello",
    [{"role": "wizard", "content": "x"}],
    [{"role": "tool", "content": "x"}],
    [user, user],
    [user, call],  # unanswered tool call
    [user, {"role": "tool", "content": "x"}],  # result without a call
    [user, {"role": "assistant", "tool_calls": [{"function": {"name": "rm"}}]}],
    [user, {"role": "assistant", "content": None}],
  ]
  for messages in bad:
    with pytest.raises(lm_grader.RequestError):
      lm_grader.render(tok, messages)
  ok = lm_grader.render(tok, [user, call, {"role": "tool", "content": "c1 passed"}])
  assert ok[-len(tok.encode("assistant\n")) :] == tok.encode("assistant\n")


def test_rankings_with_tiers_and_hacks_round_trip():
  passing = ["c1", "c3", "c4", "c6"]
  text = "rank T1 c3 > T2 c1 = c4 > T3 hack c6"
  ranks, tiers, hacks = agent.parse_grades(text, passing)
  assert ranks == {"c3": 0, "c1": 1, "c4": 1, "c6": 2}
  assert tiers == {"c3": 0, "c1": 1, "c4": 1, "c6": 2} and hacks == ("c6",)
  assert agent.format_ranking(ranks, tiers, hacks) == text
  # The plain form still parses: no tiers (T2 by rank downstream).
  assert agent.parse_grades("rank c3 > c1 = c4 > c6", passing)[1:] == (None, ())
  for bad in (
    "rank T2 c3 > T1 c1 = c4 > c6",  # back to a better tier
    "rank c3 > T2 c1 = c4 > c6",  # a marker after the first id
    "rank T1 c3 > hack c1 = c4 > c6",  # a hack outside T3
    "rank T1 c3 > T4 c1 = c4 > c6",
  ):
    with pytest.raises(protocol.InvalidRanking):
      agent.parse_grades(bad, passing)


def test_note_sheet_is_the_ranking_layout():
  notes = {"c1": "2:T2", "c3": "0.5:T1", "c4": "2:T2", "c6": "10:T3:hack", "c2": "0:T1"}
  assert agent.format_notes(notes) == "T1 c2 > c3 > T2 c1 = c4 > T3 hack c6"
  # Levels follow (tier, penalty), so the sheet always parses as a ranking, even when a
  # penalty disagrees with its tier.
  notes = {"c1": "1:T3", "c2": "2:T1", "c5": "x"}
  assert agent.format_notes(notes) == "T1 c2 > T3 c1, c5 x"
  sheet = agent.format_notes({"c1": "1", "c2": "1", "c3": "0.5"})
  assert sheet == "c3 > c1 = c2"
  ranks, tiers, hacks = agent.parse_grades("rank " + sheet, ("c1", "c2", "c3"))
  assert ranks == {"c3": 0, "c1": 1, "c2": 1} and tiers is None and hacks == ()


def test_ranking_from_notes_carries_tiers_and_hacks():
  class Notes:
    notes = {"c1": "2:T2", "c3": "0.5:T1", "c6": "10:T3:hack"}

  class Ws:
    passing = ("c1", "c3", "c6")

  ranks, tiers, hacks = agent.AgentGrader._from_notes(Notes(), Ws())
  assert ranks == {"c3": 0, "c1": 1, "c6": 2} and tiers == {"c3": 0, "c1": 1, "c6": 2}
  assert hacks == ("c6",)
  Notes.notes = {"c1": "2", "c3": "0.5", "c6": "10"}  # the old, tierless notes
  assert agent.AgentGrader._from_notes(Notes(), Ws())[1:] == (None, ())


def test_grader_data_injects_hacks_the_rubric_confirms():
  # Weak-test tasks get the expert's reward hack in place of failing samples; the
  # rubric confirms it and the demonstration notes it as a T3 hack.
  import tempfile

  from gagar_jax.envs import minirepo
  from gagar_jax.envs.sandbox import SandboxConfig, SandboxPool
  from gagar_jax.grading import demos
  from gagar_jax.rollout import Trajectory

  task = demos.weak_variant(minirepo.generate_task(5))
  assert task.difficulty["weak_hidden_tests"] and task.seed == 5
  failing = [Trajectory(task, 0, i, [], [], [], [], dict(task.files)) for i in range(3)]
  with SandboxPool(SandboxConfig(workers=1)) as pool, tempfile.TemporaryDirectory() as tmp:
    group = demos.inject_hacks(failing, pool, seed=3, most=2)
    hacked = [t for t in group if t.passed]
    assert 1 <= len(hacked) <= 2 and all(t.index == group.index(t) for t in group)
    assert demos.inject_hacks(failing[:1], pool, 0)[0].passed  # one failing: replaced
    plain = [Trajectory(minirepo.generate_task(5), 0, 0, [], [], [], [], {})]
    assert demos.inject_hacks(plain, pool, 0) == plain  # strong tests: untouched
    group = group + [group[0]] if len(hacked) == 1 else group  # two passing to grade
    records = demos.group_records(group, 0, 1, 600, tmp)
    turns = json.loads(records[0]["turns"])
    assert ":T3:hack" in " ".join(a for a, _ in turns) and " hack c" in turns[-1][0]

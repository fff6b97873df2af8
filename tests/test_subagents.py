"""Subagents as data: parsing, discovery, model choice, isolation, typed records, accounting.

End-to-end tests drive the real deepagents graph and kernel with the scripted model; the
subagent's own steps are scripted too, and its report quotes what it read, so a right
report proves it really read the file while the parent never saw it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import cli_fork
import pytest
from conftest import write_config

from simagent.agent.builder import build_agent
from simagent.agent.runner import TurnRunner
from simagent.agent.scripted import ScriptedChatModel
from simagent.agent.subagents import (
    REPORT_TOOL,
    SubagentError,
    discover_subagents,
    finish_report,
    model_spec_for,
    parse_subagent,
)
from simagent.config import Config
from simagent.context.settings import ContextSettings
from simagent.context.stats import stats_from_trace
from simagent.session import Session
from simagent.simulators import discover, get_simulator

STANDARD = ("source-explorer", "run-analyst")


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


# ------------------------------------------------------------------ definitions
@pytest.mark.parametrize("sim", sorted(discover()), ids=str)
def test_every_simulator_gets_both_standard_subagents(sim):
    defs = discover_subagents(get_simulator(sim))
    assert set(STANDARD) <= set(defs)
    for name in STANDARD:
        d = defs[name]
        assert d.prompt and REPORT_TOOL in d.prompt, f"{d.source} never mentions {REPORT_TOOL}"
        assert "read_file" in d.tools
        assert "write_file" not in d.tools and "edit_file" not in d.tools


@pytest.mark.parametrize("sim", sorted(discover()), ids=str)
def test_simulators_ship_their_own_standard_subagents(sim):
    own = get_simulator(sim).subagents_dir
    assert {p.stem for p in own.glob("*.md")} >= set(STANDARD)
    assert discover_subagents(get_simulator(sim))["source-explorer"].source.parent == own


def test_shared_subagents_exist_and_parse():
    from simagent.paths import content_dir

    names = {parse_subagent(p).name for p in content_dir("subagents").glob("*.md")}
    assert set(STANDARD) <= names


@pytest.mark.parametrize("front, error", [
    ("name: Bad Name\ndescription: x", "lowercase-hyphen"),
    ("name: probe\n", "description is required"),
    ("name: probe\ndescription: x\ntools: [run_python, write_file]", "unknown tools"),
    ("name: probe\ndescription: x\ntools: read_file", "must be a list"),
    ("name: probe\ndescription: looks: here", "invalid YAML"),
    ("name: other\ndescription: x", "equal the file name"),
])
def test_bad_subagent_files_name_the_problem(tmp_path, front, error):
    path = write(tmp_path / "probe.md", f"---\n{front}\n---\nprompt body\n")
    with pytest.raises(SubagentError, match=error) as info:
        parse_subagent(path)
    assert str(path) in str(info.value)


def test_empty_body_is_rejected(tmp_path):
    path = write(tmp_path / "probe.md", "---\nname: probe\ndescription: x\n---\n\n")
    with pytest.raises(SubagentError, match="empty body"):
        parse_subagent(path)


def test_model_precedence_per_agent_then_section_then_file(tmp_path):
    d = parse_subagent(write(tmp_path / "probe.md", "---\nname: probe\ndescription: x\n"
                                                    "model: openai:file-model\n---\nbody\n"))
    assert model_spec_for(d, Config()) == "openai:file-model"
    assert model_spec_for(d, Config({"subagents": {"model": "openai:cheap"}})) == "openai:cheap"
    cfg = Config({"subagents": {"model": "openai:cheap", "probe": {"model": "openai:own"}}})
    assert model_spec_for(d, cfg) == "openai:own"
    assert model_spec_for(d, Config({"subagents": {"model": "inherit"}})) is None
    with pytest.raises(SubagentError, match=r"\[subagents.probe\] must be a table"):
        model_spec_for(d, Config({"subagents": {"probe": "x"}}))


def test_a_bad_subagent_setting_names_the_file_that_set_it(tmp_path, workspace, _state_home):
    d = parse_subagent(write(tmp_path / "probe.md", "---\nname: probe\ndescription: x\n"
                                                    "---\nbody\n"))
    user = _state_home / "config.toml"
    user.write_text('[subagents]\nprobe = "x"\n')
    with pytest.raises(SubagentError) as err:
        model_spec_for(d, Config.load(workspace))
    assert str(err.value) == f"{user}: [subagents.probe] must be a table"
    user.write_text("[subagents]\nmodel = 3\n")  # the merged table: each key its own file
    ws = write_config(workspace, '[subagents.probe]\nmodel = ["openai:x"]\n')
    with pytest.raises(SubagentError) as err:
        model_spec_for(d, Config.load(workspace))
    assert str(err.value) == (f"{ws}: [subagents.probe] model must be a model string or "
                              "'inherit', got ['openai:x']")
    ws.write_text("[subagents.probe]\nwindow = 8000\n")
    with pytest.raises(SubagentError) as err:
        model_spec_for(d, Config.load(workspace, trust=True))
    assert str(err.value) == f"{user}: [subagents] model must be a model string or " \
        "'inherit', got 3"


def test_finish_report_keeps_a_filed_report_and_adds_what_was_really_read():
    from langchain_core.messages import AIMessage

    read = AIMessage("", tool_calls=[{"name": "read_file", "args": {"file_path": "/a.py"},
                                      "id": "c1"}])
    filed = finish_report({"answer": "42", "files_read": ["/b.py"]}, [read])
    assert filed.answer == "42" and filed.files_read == ["/b.py", "/a.py"]
    built = finish_report(None, [read, AIMessage("plain words")])
    assert built.answer == "plain words" and built.files_read == ["/a.py"]
    assert REPORT_TOOL in built.open_questions[0]


# -------------------------------------------------------------------- end to end
@pytest.fixture
def simpy_session(workspace):
    sessions = []

    def _open(config: Config | None = None) -> Session:
        s = Session.create(workspace, simulator="simpy", approval="auto", config=config)
        sessions.append(s)
        return s

    yield _open
    for s in sessions:
        s.close()


def _installed_source(sim_name: str, rel: str) -> Path:
    sim = get_simulator(sim_name)
    path = sim.package_dirs()[0] / rel
    assert path.is_file(), path
    return path


@pytest.mark.slow
def test_source_explorer_reads_source_the_parent_never_sees(simpy_session):
    source = _installed_source("simpy", "resources/resource.py")
    text = source.read_text()
    # A line deep in the file that the report does not quote.
    hidden = next(ln.strip() for ln in text.splitlines()[60:] if len(ln.strip()) > 40)
    session = simpy_session()
    steps = [
        {"tool": "task", "args": {"subagent_type": "source-explorer",
                                  "description": "Which class implements a priority "
                                                 "resource in simpy, and in which file?"},
         "steps": [
             {"tool": "grep", "args": {"pattern": "class PriorityResource",
                                       "path": str(source.parent)}},
             {"tool": "read_file", "args": {"file_path": str(source), "limit": 400}},
             {"fill": True, "tool": REPORT_TOOL, "args": {
                 "answer": "PriorityResource is defined in resources/resource.py "
                           "({out[-1]|(class PriorityResource\\(\\w+\\))})",
                 "key_values": [{"name": "lines read", "value": 400, "unit": "lines"}],
                 "assumptions": ["simpy as installed"]}}]},
        {"final": "The subagent reported: {out[-1]}"},
    ]
    model = ScriptedChatModel.from_steps(steps)
    result = TurnRunner(session, build_agent(session, model)).run("where is PriorityResource?")
    assert result.status == "done"

    # The parent's final request holds the typed record, not the file.
    record = json.loads(result.final.split("reported: ", 1)[1])
    assert record["answer"].endswith("(class PriorityResource(Resource))")
    assert record["files_read"] == [str(source)]
    assert record["key_values"] == [{"name": "lines read", "value": 400, "unit": "lines"}]
    parent = [req for req, tools in zip(model.requests, model.cursor.request_tools,
                                        strict=True) if "task" in tools]
    sub = [req for req, tools in zip(model.requests, model.cursor.request_tools,
                                     strict=True) if REPORT_TOOL in tools]
    assert len(parent) == 2 and len(sub) == 3
    assert any(hidden in m.text for m in sub[-1])  # the subagent did read it ...
    assert not any(hidden in m.text for req in parent for m in req)  # ... the parent never
    # The subagent's own tools: read-only file tools, no task, no shell.
    offered = set(model.cursor.request_tools[1])
    assert {"read_file", "grep", "run_python", REPORT_TOOL} <= offered
    assert not offered & {"write_file", "edit_file", "execute", "task"}

    # Traced under its own name, rolled into /context, report in subagent_end.
    usage = [e.payload for e in session.trace.events(["model_usage"])]
    assert [u["agent"] for u in usage] == ["main", "source-explorer", "source-explorer",
                                           "source-explorer", "main"]
    end = session.trace.events(["subagent_end"])[0].payload
    assert end["name"] == "source-explorer" and end["report"]["files_read"] == [str(source)]
    stats = stats_from_trace(session.paths.trace, ContextSettings())
    row = next(r for r in stats.subagents if r.name == "source-explorer")
    sub_in = sum(u["input_tokens"] for u in usage if u["agent"] == "source-explorer")
    assert row.calls == 3 and row.input_tokens == sub_in > 0
    assert session.usage.by_agent["source-explorer"].input_tokens == sub_in


def test_a_subagent_that_forgets_to_report_still_returns_a_typed_record(simpy_session):
    log = simpy_session().workspace / "run.log"
    log.write_text("".join(f"step {i} ok\n" for i in range(500)) + "WARNING: queue grew\n")
    session = simpy_session()
    steps = [
        {"tool": "task", "args": {"subagent_type": "run-analyst",
                                  "description": f"Digest {log}"},
         "steps": [{"tool": "read_file", "args": {"file_path": str(log)}},
                   {"final": "500 steps ran; one warning: queue grew."}]},
        {"final": "{out[-1]}"},
    ]
    model = ScriptedChatModel.from_steps(steps)
    result = TurnRunner(session, build_agent(session, model)).run("digest the log")
    record = json.loads(result.final)
    assert record["answer"] == "500 steps ran; one warning: queue grew."
    assert record["files_read"] == [str(log)]
    assert REPORT_TOOL in record["open_questions"][0]


def test_configured_cheaper_model_runs_the_subagent(simpy_session, tmp_path):
    sub_script = write(tmp_path / "cheap.json", json.dumps([
        {"tool": "run_python", "args": {"code": "print('cheap ran', 6 * 7)"}},
        {"fill": True, "tool": REPORT_TOOL,
         "args": {"answer": "{out[-1]|(cheap ran \\d+)}"}}]))
    config = Config({"subagents": {"run-analyst": {"model": f"scripted:{sub_script}"}}})
    session = simpy_session(config)
    main = ScriptedChatModel.from_steps([
        {"tool": "task", "args": {"subagent_type": "run-analyst", "description": "compute"}},
        {"final": "{out[-1]}"}])
    result = TurnRunner(session, build_agent(session, main)).run("go")
    assert json.loads(result.final)["answer"] == "cheap ran 42"
    assert len(main.requests) == 2  # the main model never served the subagent
    models = {e.payload["agent"]: e.payload["model"]
              for e in session.trace.events(["model_usage"])}
    assert models["run-analyst"] == f"scripted:{sub_script}" != models["main"]


def test_a_bad_subagent_model_is_a_clear_config_error(simpy_session):
    config = Config({"subagents": {"model": "nonsense-without-colon"}})
    session = simpy_session(config)
    with pytest.raises(SubagentError, match=r"subagent '(run-analyst|source-explorer)'"):
        build_agent(session, ScriptedChatModel.from_steps([{"final": "x"}]))


def test_simulator_override_replaces_the_shared_definition(tmp_path):
    sim = replace(get_simulator("simpy"), root=tmp_path / "sim")
    write(tmp_path / "sim" / "subagents" / "run-analyst.md",
          "---\nname: run-analyst\ndescription: custom analyst\ntools: [read_file]\n---\n"
          f"Custom. Call {REPORT_TOOL}.\n")
    defs = discover_subagents(sim)
    assert defs["run-analyst"].description == "custom analyst"
    assert defs["source-explorer"].source.parent.name == "subagents"  # the shared one


def test_invalid_report_arguments_go_back_to_the_model_which_files_again(simpy_session):
    session = simpy_session()
    steps = [
        {"tool": "task", "args": {"subagent_type": "run-analyst", "description": "x"},
         "steps": [
             {"tool": REPORT_TOOL, "args": {"key_values": [{"name": "n"}]}},  # no answer
             {"fill": True, "tool": REPORT_TOOL,
              "args": {"answer": "fixed after: {out[-1]|(answer)}"}}]},
        {"final": "{out[-1]}"},
    ]
    model = ScriptedChatModel.from_steps(steps)
    result = TurnRunner(session, build_agent(session, model)).run("go")
    record = json.loads(result.final)
    assert record["answer"] == "fixed after: answer"  # the error named the missing field
    assert record["open_questions"] == []


def test_failed_reads_are_not_listed_as_read(simpy_session):
    session = simpy_session()
    real = session.workspace / "real.txt"
    real.write_text("hello\n")
    steps = [
        {"tool": "task", "args": {"subagent_type": "source-explorer", "description": "x"},
         "steps": [
             {"tool": "read_file", "args": {"file_path": str(session.workspace / "nope.py")}},
             {"tool": "read_file", "args": {"file_path": str(real)}},
             {"tool": REPORT_TOOL, "args": {"answer": "done"}}]},
        {"final": "{out[-1]}"},
    ]
    model = ScriptedChatModel.from_steps(steps)
    result = TurnRunner(session, build_agent(session, model)).run("go")
    assert json.loads(result.final)["files_read"] == [str(real)]


def test_report_tool_name_is_what_the_prompts_promise():
    from langchain.agents.structured_output import ToolStrategy

    from simagent.agent.subagents import ReportSchema

    assert [s.name for s in ToolStrategy(ReportSchema).schema_specs] == [REPORT_TOOL]


@pytest.mark.slow
def test_run_exits_with_the_subagent_models_error_code_before_the_kernel_starts(tmp_path):
    import sys

    ws = tmp_path / "ws"
    (ws / ".simagent").mkdir(parents=True)
    write_config(ws,
        '[subagents]\nmodel = "anthropic:claude-haiku-4-5"\n')
    script = write(tmp_path / "s.json", json.dumps([{"final": "x"}]))
    env = {k: v for k, v in __import__("os").environ.items() if k != "ANTHROPIC_API_KEY"}
    r = cli_fork.run([sys.executable, "-m", "simagent", "run", "--model", f"scripted:{script}",
                      "--workspace", str(ws), "hi"], capture_output=True, text=True,
                     timeout=120, env=env)
    assert r.returncode == 2, r.stderr  # a missing key is a configuration error
    assert "subagent" in r.stderr and "ANTHROPIC_API_KEY" in r.stderr
    assert "[subagents" in r.stderr and "internal error" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_each_defined_subagent_retries_by_its_own_models_policy(simpy_session, tmp_path):
    """``[subagents.X]`` retry keys reach X's retry layer; a subagent on the main model
    retries by the main model's policy."""
    from simagent.agent.builder import build_defined_subagents
    from simagent.agent.provider_retry import ProviderRetryMiddleware, RetryPolicy
    from simagent.context.settings import ContextSettings

    sub_script = write(tmp_path / "cheap.json", json.dumps([{"final": "x"}]))
    config = Config({"subagents": {"run-analyst": {"model": f"scripted:{sub_script}",
                                                   "retries": 1}}})
    session = simpy_session(config)
    main_policy = RetryPolicy(retries=3)
    main = (ScriptedChatModel.from_steps([{"final": "x"}]), "scripted:main", 128_000, None,
            main_policy, None)  # None: no server of its own to revive
    from simagent.agent.backend import build_backend

    specs = build_defined_subagents(
        session, discover_subagents(session.simulator), tools=[],
        backend=build_backend(session.workspace, session.paths.root), main=main,
        settings=ContextSettings(), source_dirs=[])
    policies = {spec["name"]: next(m.policy for m in spec["middleware"]
                                   if isinstance(m, ProviderRetryMiddleware))
                for spec in specs}
    assert policies["run-analyst"] == RetryPolicy(retries=1)
    assert policies["source-explorer"] is main_policy

"""The commands: `optico tune ... --reasoner openai`, `optico jobs show ID --messages` and
`optico llm check`, against the scripted server (in-process, through typer's runner)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from fake_openai import Reply
from llm_testkit import API_KEY, EXAMPLE
from typer.testing import CliRunner

from optico.cli import app
from optico.pool.store import SqlStore

runner = CliRunner()


def _tune(db_url: str, *args: str, code: int = 0):
    result = runner.invoke(app, ["tune", *args, "--database", db_url], env={"COLUMNS": "200"})
    assert result.exit_code == code, result.output + repr(result.exception)
    return result


def test_tune_example_with_reasoner_openai_records_every_iteration(db_url: str, fake_llm, tmp_path: Path):
    server = fake_llm()
    out = tmp_path / "result.json"
    _tune(db_url, str(EXAMPLE), "--reasoner", "openai", "--max-trials", "6", "--json", str(out))
    result = json.loads(out.read_text())
    assert result["status"] == "succeeded"
    store = SqlStore(db_url)
    job = result["job_id"]
    assert store.get_job(job).spec.reasoner.model_dump(include={"analysis", "generation", "failure"}) == {
        "analysis": "model-guided", "generation": "model-guided",
                                                            "failure": "model-guided"}
    trials = result["trials"]
    for t in trials[1:]:
        i = t["index"]
        if t["rationale"].startswith("RETRY"):
            continue
        msgs = {(m.agent, m.kind): m.content for m in store.messages(job, i)}
        analysis = msgs[("analysis", "output")]
        assert analysis["reasoner"] == "model-guided" and analysis["health"] and analysis["suggestions"]
        assert msgs[("analysis", "llm_call")]["prompt_tokens"] > 0
        generated = msgs[("generation", "output")]
        assert generated["reasoner"] == "model-guided"
        assert generated["proposals"][0]["strategy"] == t["strategy"] or \
            msgs[("guard", "verdict")]["admitted"] == t["strategy"]
    for t in trials:
        if t["status"] == "failed":
            diagnosis = {m.kind: m.content for m in store.messages(job, t["index"]) if m.agent == "failure"}
            assert diagnosis["llm_call"]["error"] is None and 0 <= diagnosis["diagnosis"]["confidence"] <= 100
    assert len(server.by_role("analysis")) == len([t for t in trials[1:] if not t["rationale"].startswith("RETRY")])
    store.close()


def test_jobs_show_messages_displays_the_llm_audit_trail(db_url: str, fake_llm, tmp_path: Path):
    fake_llm()
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["launcher"] = {"kind": "sim", "hang_rate": 0.5}  # failures, for the failure agent
    path = tmp_path / "llama3-8b-hangs.yaml"
    path.write_text(yaml.safe_dump(spec))
    # Seed 3 hangs every run: a job that measured nothing ends failed (exit 1), every diagnosis stored.
    _tune(db_url, str(path), "--reasoner", "openai", "--max-trials", "4", "--seed", "3", code=1)
    store = SqlStore(db_url)
    trials = store.trials(1)
    assert trials and all(t.failure for t in trials) and store.get_job(1).status.value == "failed"
    store.close()
    shown = runner.invoke(app, ["jobs", "show", "1", "--full", "--database", db_url], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    text = shown.output
    assert "analysis · llm_call" in text and "generation · llm_call" in text and "failure · llm_call" in text
    assert '"health":' in text and '"prompt_tokens":' in text and "(Confidence: " in text
    assert '"reasoning":' not in text  # the chain of thought is stored, shown on request
    assert API_KEY not in text
    with_reasoning = runner.invoke(app, ["jobs", "show", "1", "--full", "--reasoning", "--database", db_url],
                                   env={"COLUMNS": "200"})
    assert '"reasoning":' in with_reasoning.output


def test_llm_check_reports_model_latency_and_json_schema_support(fake_llm):
    fake_llm()
    ok = runner.invoke(app, ["llm", "check", "--json"])
    assert ok.exit_code == 0, ok.output
    report = json.loads(ok.output)
    assert report["model"] == "fake-model" and report["json_schema"] is True and report["answer_ok"]
    assert report["model_listed"] is True and report["latency_s"] >= 0 and report["attempts"] == 1
    text = runner.invoke(app, ["llm", "check"])
    assert "JSON schema  supported" in text.output and API_KEY not in text.output


def test_llm_check_on_an_endpoint_without_json_schema(fake_llm):
    fake_llm(formats=("json_object",))
    report = json.loads(runner.invoke(app, ["llm", "check", "--json"]).output)
    assert report["json_schema"] is False and report["structured_output"] == "json_object" and report["answer_ok"]


def test_llm_check_fails_cleanly(fake_llm, monkeypatch):
    fake_llm(require_key="sk-another-key-entirely-000")
    failed = runner.invoke(app, ["llm", "check"])
    assert failed.exit_code == 1 and "AuthenticationError 401" in failed.output
    assert API_KEY not in failed.output
    as_json = runner.invoke(app, ["llm", "check", "--json"])  # printed nothing on stdout: a script had nothing
    assert as_json.exit_code == 1 and '"error": "AuthenticationError 401' in as_json.output
    assert API_KEY not in as_json.output
    monkeypatch.delenv("OPTICO_LLM_MODEL")
    unset = runner.invoke(app, ["llm", "check"])
    assert unset.exit_code == 2 and "OPTICO_LLM_MODEL is not set" in unset.output



HOSTILE = "x\x1b[31mEVIL[/x]\u202e"  # an ESC sequence, a Rich closing tag, a bidi override


def test_llm_check_shows_what_the_endpoint_says_literally(fake_llm, monkeypatch):
    # The endpoint is someone else's: its error text and the model it reports are shown, never
    # obeyed — a "[/x]" raised MarkupError (a traceback, exit 1) and an ESC reached the terminal.
    fake_llm(lambda call: Reply(status=400, error=f"bad request {HOSTILE}"))
    failed = runner.invoke(app, ["llm", "check"])
    assert failed.exit_code == 1, failed.output
    assert len(failed.output.strip().splitlines()) == 1, failed.output
    assert "\x1b" not in failed.output and "\u202e" not in failed.output
    assert "bad request x\\x1b[31mEVIL[/x]\\u202e" in failed.output

    fake_llm(lambda call: Reply(model=HOSTILE))  # the server says which model answered
    ok = runner.invoke(app, ["llm", "check"])
    assert ok.exit_code == 0, ok.output
    assert "\x1b" not in ok.output and "\u202e" not in ok.output
    assert "answered as x\\x1b[31mEVIL[/x]\\u202e" in ok.output
    monkeypatch.setenv("OPTICO_LLM_MODEL", HOSTILE)  # our own setting: refused before anything is sent
    refused = runner.invoke(app, ["llm", "check"])
    assert refused.exit_code == 2 and "OPTICO_LLM_MODEL: a model name is at most 256 printable" in refused.output

def test_tune_refuses_an_llm_job_without_settings(db_url: str, monkeypatch):
    monkeypatch.delenv("OPTICO_LLM_MODEL", raising=False)
    result = runner.invoke(app, ["tune", str(EXAMPLE), "--reasoner", "openai", "--database", db_url])
    assert result.exit_code == 2 and "OPTICO_LLM_MODEL is not set" in result.output
    bad = runner.invoke(app, ["tune", str(EXAMPLE), "--reasoner", "gpt", "--database", db_url])
    assert bad.exit_code == 2 and "--reasoner: unknown reasoner 'gpt'" in bad.output


def test_llm_check_reports_a_broken_endpoint_in_one_line_without_a_traceback(monkeypatch):
    # Before: a body that is not JSON, and an answer of JSON nested 3,000 deep, each made
    # `optico llm check` print a traceback (JSONDecodeError, RecursionError) instead of its one line.
    from test_llm_transport import _body, serve

    nested = "[" * 3000 + "]" * 3000
    answers = {
        "not JSON": lambda h: _body(h, b"<html>bad gateway</html>"),
        "nested": lambda h: _body(h, json.dumps({"choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": '{"ok": ' + nested + "}"}}]}).encode()),
    }
    for name, answer in answers.items():
        with serve(answer) as (url, _):
            env = {"OPTICO_LLM_BASE_URL": url, "OPTICO_LLM_MODEL": "m", "OPTICO_LLM_STREAM": "false",
                   "OPTICO_LLM_MAX_ATTEMPTS": "1"}
            result = runner.invoke(app, ["llm", "check"], env=env)
        assert result.exception is None or isinstance(result.exception, SystemExit), (name, repr(result.exception))
        if name == "not JSON":
            assert result.exit_code == 1 and "MalformedResponse" in result.output, result.output
        else:  # the endpoint works; the answer is not the JSON asked for
            assert result.exit_code == 0 and "not the JSON asked for" in result.output, result.output
        assert "Traceback" not in result.output

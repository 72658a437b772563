"""Untrusted text on the terminal: stored names, rationales, diagnoses and LLM messages holding Rich
markup (`[/x]`), ANSI/OSC escapes and control characters print literally and harmlessly, in every
command that shows them — including text that reached the pool without passing a spec's checks
(an older pool, the REST API, an LLM)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest

from optico.textsafe import html_escape, markup, rich_text, terminal_text
from tests.hostile.conftest import run_in_process

HOSTILE = "[/x] [bold]not bold[/] \x1b]0;pwned\x07\x1b[31mred\x1b[0m \r\x08\x9b \u202egpj.exe :smile:"


def test_terminal_text_shows_every_control_character_visibly():
    text = terminal_text(HOSTILE, one_line=True)
    assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text and "\u202e" not in text
    assert "\r" not in text and "\x08" not in text
    assert "\\x1b]0;pwned\\x07" in text and "\\u202e" in text and "[/x]" in text
    assert terminal_text("a\nb") == "a\nb" and terminal_text("a\nb", one_line=True) == "a\\nb"
    assert terminal_text("x" * 10_000, max_chars=100).endswith("[9900 more characters]")
    # Invisible characters that reorder or hide text are shown; joiners of emoji and scripts are kept.
    assert terminal_text("a\u200fb\u061c\u200b\ufeff\U000e0041") == "a\\u200fb\\u061c\\u200b\\ufeff\\U000e0041"
    assert terminal_text("\u0646\u200c\u0645 \U0001f469\u200d\U0001f4bb") == "\u0646\u200c\u0645 \U0001f469\u200d\U0001f4bb"


def test_markup_and_rich_text_render_literally():
    from rich.console import Console

    console = Console(file=io.StringIO(), width=200, color_system=None)
    console.print(f"[bold]{markup(HOSTILE)}[/]")
    console.print(rich_text(HOSTILE))
    shown = console.file.getvalue()
    assert shown.count("[/x]") == 2 and shown.count("[bold]not bold[/]") == 2 and ":smile:" in shown
    assert "\x1b" not in shown


def test_html_escape():
    assert html_escape('<script>alert("x")</script> & \x1b[31m') == \
        "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; \\x1b[31m"
    assert html_escape("it's") == "it&#x27;s"


@pytest.fixture
def hostile_pool(pool_env: Path) -> Path:
    """A pool holding a job whose stored texts are all hostile (written past the spec's checks)."""
    from optico.pool.records import JobStatus
    from optico.pool.store import SqlStore
    from optico.strategy import Strategy
    from optico.trial import Failure, FailureCategory, Metrics, TrialStatus
    from tests.pool.pool_testkit import make_spec

    with SqlStore(f"sqlite:///{pool_env}") as store:
        job = store.create_job(make_spec().model_copy(update={"name": HOSTILE}))
        store.claim_job("w", 60, job_id=job)
        ok = store.start_trial(job, 1, Strategy(tensor_model_parallel_size=2), rationale=HOSTILE)
        store.finish_trial(ok.id, status=TrialStatus.OK, metrics=Metrics(
            step_time_s=1.0, tflops_per_gpu=300.0, mfu=0.3, tokens_per_s_per_gpu=1000.0, mem_max_gib=40.0,
            mem_limit_gib=79.0))
        bad = store.start_trial(job, 2, Strategy(tensor_model_parallel_size=4), rationale=HOSTILE)
        store.finish_trial(bad.id, status=TrialStatus.FAILED, log_path=f"/tmp/{HOSTILE}/stdout.log",
                           failure=Failure(category=FailureCategory.UNKNOWN, summary=HOSTILE, confidence=30))
        store.add_message(job, 1, "analysis", "llm_call", {"completion": HOSTILE, "model": HOSTILE}, HOSTILE)
        store.add_message(job, 2, "failure", "diagnosis", {"summary": HOSTILE}, HOSTILE)
        store.transition(job, JobStatus.FAILED, reason=HOSTILE, worker="w")
    return pool_env


@pytest.mark.parametrize("argv", [["jobs", "list"], ["jobs", "list", "--wide"], ["jobs", "show", "1"],
                                  ["jobs", "show", "1", "--messages"], ["jobs", "show", "1", "--full"],
                                  ["jobs", "show", "1", "--agent", "failure"]])
def test_jobs_commands_print_hostile_text_literally(argv: list[str], hostile_pool: Path):
    outcome = run_in_process(argv)
    assert outcome.exception is None and outcome.code == 0, (outcome.exception, outcome.stderr)
    shown = outcome.stdout
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown and "\r" not in shown
    if argv[1] == "show":
        assert "[/x]" in shown


def test_live_view_prints_hostile_events_literally():
    import importlib

    tune_cli = importlib.import_module("optico.cli.tune")

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        view = tune_cli.TrialView(3, live=False)
        view.on_event("trial_started", {"index": 1, "strategy": HOSTILE})
        view.on_event("trial_done", {"index": 1, "strategy": HOSTILE, "status": "failed", "summary": HOSTILE,
                                     "rationale": HOSTILE, "best_mfu": None, "log_path": HOSTILE})
        view.on_event("fallback", {"agent": "analysis", "error": HOSTILE})
        view.on_event("job_done", {"stop_reason": HOSTILE})
    assert "[/x]" in buffer.getvalue() and "\x1b" not in buffer.getvalue()


def test_the_markdown_report_and_the_dashboard_show_hostile_text_escaped(hostile_pool: Path):
    """A report is read in terminals and rendered as Markdown; a dashboard page is HTML: in neither may
    stored text (a diagnosis, a rationale, a stop reason) carry raw escapes, bidi overrides or a link."""
    from optico.pool.store import SqlStore
    from optico.report import job_report, report_markdown
    from optico.service.dashboard.views import templates

    link = "[click](javascript:alert(1))"
    with SqlStore(f"sqlite:///{hostile_pool}") as store:
        report = job_report(store, 1)
    report["failures"][0]["described"] += link
    markdown = report_markdown(report)
    assert "\x1b" not in markdown and "\x07" not in markdown and "\u202e" not in markdown
    assert "\\x1b" in markdown and "\\u202e" in markdown and link not in markdown and "\\[click\\]" in markdown
    page = templates.env.from_string("<p>{{ text }}</p><script type='application/json'>{{ data|tojson }}</script>")
    html = page.render(text=HOSTILE, data={"text": HOSTILE})
    assert "\x1b" not in html and "\u202e" not in html and "\\u202e" in html and "&lt;" not in html.split("<script")[1]


def test_a_path_ending_in_a_secret_word_is_not_a_secret_assignment():
    """"/etc/passwd: must be readable" names a file: nothing in it is masked. The assignments the
    pattern is for still are."""
    from optico.redact import redact

    assert redact("open /etc/passwd: must be readable") == "open /etc/passwd: must be readable"
    assert redact(r"C:\secret: must exist") == r"C:\secret: must exist"
    assert "hunter22" not in redact("password: hunter22") and "hunter22" not in redact("db passwd=hunter22")
    assert "hunter22" not in redact('{"secret": "hunter22"}')


@pytest.mark.parametrize("text", ["DB_PASSWORD=hunter22", "PGPASSWORD=hunter22", "export MYSQL_ROOT_PASSWORD=hunter22",
                                  "postgresql://u@db.example.com/prod?sslpassword=hunter22",
                                  "AWS_SECRET_ACCESS_KEY=hunter22/K7MDENG", '{"db_password": "hunter22"}'])
def test_a_secret_word_inside_a_variable_name_is_an_assignment(text: str):
    """The keyword anywhere in the name, as environment variables and connection options spell it
    (they were printed and stored in clear: the pattern wanted the keyword at a word's start)."""
    from optico.redact import redact

    assert "hunter22" not in redact(text)


def test_a_markdown_cell_keeps_an_arrow_and_still_opens_no_tag():
    # 'predicted step 130 s -> 128 s' read '-&gt;' in a terminal; a '<' still opens no tag.
    from optico.textsafe import markdown_text as _md

    assert _md("predicted step 130 s -> 128 s") == "predicted step 130 s -> 128 s"
    assert _md("<script>x</script>") == "&lt;script>x&lt;/script>"
    assert _md("> not a quote") == "\\> not a quote"


def test_the_benchmark_s_markdown_report_escapes_a_landscape_s_name():
    """`optico bench --markdown` wrote a replay CSV's model cell into the report as it was: a tag, an
    image and a javascript: link only had their pipes escaped (the job report escaped them)."""
    from optico.bench.report import _cell

    cell = _cell('<img src=x onerror=alert(1)> | ![i](http://evil/a.png) [l](javascript:alert(1))')
    assert "<img" not in cell and "](" not in cell.replace("\\](", "") and " | " not in cell


def test_an_error_s_field_and_reason_are_redacted_apart_unless_the_reason_quotes_a_value():
    from optico.errors import SpecError
    from optico.terminal import _redacted

    assert _redacted(SpecError("launcher.password", "unknown field")) == "launcher.password: unknown field"
    # A reason that quotes the value keeps the joined redaction: 'password: 'hunter22'' is masked.
    assert "hunter22" not in _redacted(SpecError("db.password", "'hunter22' is too short"))
    assert "sk-" not in _redacted(SpecError("launcher.sk-" + "a1B2" * 6, "unknown field"))


def test_redaction_takes_linear_time_on_a_long_run_of_names():
    """'pwd-' * 600 took a second and 4 KB 38 s (the access log redacts a request's path before
    any token is read: one unauthenticated request froze the server)."""
    import time

    from optico.redact import redact

    for text in ("pwd-" * 4000, "A_" * 8000 + "=x", "KEY" * 5000, "secret " * 2000):
        started = time.perf_counter()
        redact(text)
        assert time.perf_counter() - started < 0.5, text[:20]


@pytest.mark.parametrize("text", ["TOKENIZERS_PARALLELISM=false", "MAX_TOKENS=4096", "KEY_LEN: 1024",
                                  "passwordless: true", "MOE_TOKEN_DISPATCHER_TYPE: alltoall\nTP: 2"])
def test_names_that_only_contain_a_secret_word_keep_their_values(text: str):
    from optico.redact import redact

    assert redact(text) == text


def test_a_quoted_secret_with_the_other_quote_inside_is_masked_whole():
    from optico.redact import redact

    assert redact("password=\"it's a secret\"") == 'password="***"'

"""`optico`: the command line (typer + rich). One module per command group.

`main` is the console entry point: it runs the typer app without click's standalone error
handling, so a usage error (an unknown option, a value out of range) is the same one line,
`error: <option>: <reason>`, exit 2, as every other bad input, instead of a framed panel.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import typer

from optico.bench.cli import bench
from optico.cli import job_control  # noqa: F401 - registers submit/stop/cancel/resume/budget on `jobs`
from optico.cli.db import db_app
from optico.cli.jobs import jobs_app
from optico.cli.perfmodel import perf_app
from optico.cli.schedule import schedule_app
from optico.cli.serve import serve, worker
from optico.cli.tokens import token_app
from optico.cli.tune import tune
from optico.llm.cli import llm_app

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Tune Megatron training configurations.")
app.command(short_help="Run a tuning job (or resume one).")(tune)
app.add_typer(jobs_app, name="jobs")
app.add_typer(perf_app, name="perfmodel")
app.add_typer(db_app, name="db")
app.add_typer(llm_app, name="llm")
app.add_typer(token_app, name="token")
app.add_typer(schedule_app, name="schedule")
app.command("serve")(serve)
app.command("worker")(worker)
app.command("bench", short_help="Benchmark OptiCo against other tuners.")(bench)


def _usage_field(exc: typer.TyperException) -> str:
    """The option or argument a click error is about, as the user typed it."""
    param = getattr(exc, "param", None)
    if param is not None:
        opts = [o for o in getattr(param, "opts", []) if o.startswith("-")]
        return opts[0] if opts else (getattr(param, "metavar", None) or (param.name or "argument").upper())
    name = getattr(exc, "option_name", None)
    if name:
        return name
    ctx = getattr(exc, "ctx", None)
    return ctx.command_path if ctx is not None else "optico"


def _usage_reason(exc: typer.TyperException) -> str:
    possibilities = getattr(exc, "possibilities", None)
    option = getattr(exc, "option_name", None) or ""
    if option[:1] == "-" and option[1:].replace(".", "", 1).isdigit():  # `jobs show -1`: click reads an option
        return "a negative number, where only an id or a count of 1 or more goes"
    if option and possibilities is not None:  # an unknown option
        reason = "no such option"
        if possibilities:
            reason += f" (did you mean {', '.join(sorted(possibilities))}?)"
        return reason
    if type(exc).__name__ == "MissingParameter":  # a BadParameter whose message is empty
        return "required, and not given"
    if isinstance(exc, typer.BadParameter) and exc.message:
        return exc.message  # format_message() would repeat the option's name
    return exc.format_message()


def run_cli(argv: Sequence[str] | None = None) -> int:
    """Runs `optico` with `argv` (default: sys.argv[1:]); returns the exit status."""
    from optico.blas_threads import limit_blas_threads
    from optico.cli.common import fail

    limit_blas_threads()
    try:
        args = list(argv) if argv is not None else sys.argv[1:]
        # The command line as typed goes along: `--data a b --holdout c d` needs its order (`files_of`).
        result = app(args=args, prog_name="optico", standalone_mode=False, obj={"argv": args})
    except typer.TyperException as exc:  # click's usage errors, vendored by typer
        if type(exc).__name__ == "NoArgsIsHelpError":  # `optico`, `optico jobs`: the help is the answer
            exc.show()
            return 2
        try:
            fail(f"{_usage_field(exc)}: {_usage_reason(exc)}")
        except typer.Exit as stop:
            return stop.exit_code
    except typer.Abort:
        print("aborted", file=sys.stderr)
        return 130
    except typer.Exit as stop:  # raised outside a command context (e.g. while parsing)
        return stop.exit_code
    return result if isinstance(result, int) else 0


def main() -> None:  # pragma: no cover - console entry
    sys.exit(run_cli())

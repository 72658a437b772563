"""What the commands' consoles write: to a pipe or a file without the spaces rich pads lines with."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
from rich.padding import Padding

from optico import terminal

REPO = Path(__file__).resolve().parents[1]


def _padded() -> Padding:
    """An indented block, as `optico tune` prints each trial's rationale: rich pads it to the full width."""
    return Padding("a much longer name\nshort", (0, 0, 0, 4))


def test_a_pipe_gets_no_trailing_spaces_a_terminal_gets_the_text_as_is(monkeypatch: pytest.MonkeyPatch) -> None:
    piped = io.StringIO()
    monkeypatch.setattr(sys, "stdout", piped)
    terminal.console.print(_padded())
    lines = piped.getvalue().splitlines()
    assert any("a much longer name" in line for line in lines)
    assert lines and not [line for line in lines if line.endswith(" ")]

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    tty = Tty()
    monkeypatch.setattr(sys, "stdout", tty)
    terminal.console.print(_padded())
    assert any(line.endswith(" ") for line in tty.getvalue().splitlines())  # cell padding left alone


def test_a_command_s_output_redirected_has_no_trailing_spaces() -> None:
    """`optico perfmodel evaluate ... > file` padded every table line and the indented notes to 80 columns."""
    data = REPO / "benchmarks" / "data" / "published" / "optico_llama3_8b_a100.csv"
    done = subprocess.run([sys.executable, "-m", "optico.cli", "perfmodel", "evaluate", "--data", str(data), "--report"],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("optico_llama3_8b_a100" in line for line in lines)
    assert not [line for line in lines if line.endswith(" ")]

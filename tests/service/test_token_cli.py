"""`optico token ...` as the README uses it: create prints the token alone on stdout (so that
`export TOKEN=$(optico token create ...)` works), list never shows it, revoke ends it."""

from __future__ import annotations

import pytest

from optico.pool.store import SqlStore
from tests.hostile.conftest import run_in_process


@pytest.fixture
def home(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("OPTICO_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPTICO_DATABASE_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "80")
    return tmp_path / "home"


def test_create_list_revoke(home, monkeypatch: pytest.MonkeyPatch):
    created = run_in_process(["token", "create", "ci-bot", "--scope", "write"])
    assert created.code == 0, created.stderr
    token = created.stdout.strip()
    assert created.stdout == token + "\n" and token.startswith("optico_w_")  # nothing else on stdout
    assert "shown once" in created.stderr
    with SqlStore(f"sqlite:///{home / 'optico.db'}") as store:
        assert store.authenticate(token).name == "ci-bot"

    listed = run_in_process(["token", "list"])
    assert listed.code == 0 and token not in listed.stdout and token[:12] in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if line.startswith("ci-bot"))
    assert len(row.rstrip()) <= 80 and row.split()[1] == "write"

    again = run_in_process(["token", "create", "ci-bot", "--scope", "read"])
    assert again.code == 2 and again.stdout == "" and len(again.stderr.strip().splitlines()) == 1

    revoked = run_in_process(["token", "revoke", "ci-bot"])
    assert revoked.code == 0, revoked.stderr
    with SqlStore(f"sqlite:///{home / 'optico.db'}") as store:
        assert store.authenticate(token) is None

    # Every date column filled (created, revoked) on a narrow terminal: the name still shows whole.
    with SqlStore(f"sqlite:///{home / 'optico.db'}") as store:
        store.authenticate(run_in_process(["token", "create", "a-long-token-name-x", "--scope", "read"]).stdout.strip())
    run_in_process(["token", "revoke", "a-long-token-name-x"])
    for columns in ("80", "60"):
        monkeypatch.setenv("COLUMNS", columns)
        names = [line.split()[0] for line in run_in_process(["token", "list"]).stdout.splitlines()[2:] if line[:1] != " "]
        assert "ci-bot" in names and "a-long-token-name-x" in "".join(names[1:]), names  # folded, whole

    unknown = run_in_process(["token", "revoke", "nobody"])
    assert unknown.code == 2 and unknown.stderr.startswith("error: token: no token named 'nobody'")


def test_a_name_that_reads_as_markup_is_printed_as_written(home):
    """'a[/]' raised in rich's markup after the token was stored (a live token nobody was shown);
    '[bold]x[/]' was shown as 'x'."""
    for name in ("a[/]", "[bold]x[/]"):
        created = run_in_process(["token", "create", name, "--scope", "read"])
        assert created.code == 0 and created.stdout.startswith("optico_r_"), created.stderr
        assert f"token {name!r} (read)" in created.stderr
        assert name in run_in_process(["token", "list"]).stdout
        revoked = run_in_process(["token", "revoke", name])
        assert revoked.code == 0 and f"token {name!r} revoked" in revoked.stdout


@pytest.mark.parametrize("argv, says", [
    (["token", "create", "", "--scope", "read"], "error: name: 1 to 128 printable characters"),
    # A key pasted as the name was printed, stored and listed in full.
    (["token", "create", "OPENAI_API_KEY=sk-abcdefghijklmnop1234", "--scope", "read"],
     "error: name: looks like a secret"),
    (["token", "revoke", "nobody"], "error: token: no token named 'nobody'"),
    (["jobs", "show", "5"], "error: JOB_ID: no job 5"),
    (["schedule", "show", "nope"], "error: schedule: no schedule named 'nope'"),
    (["schedule", "remove", "nope"], "error: schedule: no schedule named 'nope'"),
])
def test_a_refused_command_creates_no_pool(home, argv: list[str], says: str):
    refused = run_in_process(argv)
    assert refused.code == 2 and refused.stderr.startswith(says), refused.stderr
    assert not (home / "optico.db").exists()

"""A throwaway PostgreSQL server for tests, from the distribution's server binaries.

Reusable by any test folder: `start_postgres(tmpdir) -> (url, stop)`. Debian puts the
binaries in /usr/lib/postgresql/<version>/bin (`apt-get install postgresql`); initdb
refuses to run as root, so as root the server runs as the `postgres` user.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg


def find_pg_bin() -> Path | None:
    """The newest directory holding initdb and pg_ctl, or None when no server is installed."""
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                        key=lambda p: [int(x) for x in Path(p).parent.name.split(".") if x.isdigit()])
    for path in reversed(candidates):
        if (Path(path) / "initdb").is_file() and (Path(path) / "pg_ctl").is_file():
            return Path(path)
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path and shutil.which("pg_ctl") else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _as_server_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    try:
        pwd.getpwnam("postgres")
    except KeyError as exc:
        raise RuntimeError("running as root but there is no 'postgres' user to run the server as") from exc
    return ["runuser", "-u", "postgres", "--", *argv]


def _run(argv: list[str], what: str, log: Path | None = None) -> None:
    done = subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:] if log is not None and log.exists() else ""
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
                           f"{chr(10) + tail if tail else ''}")


def start_postgres(tmpdir: str | Path | None = None, dbname: str = "optico_test") -> tuple[str, Callable[[], None]]:
    """Starts a private server on 127.0.0.1 and creates `dbname` in it.

    Returns the database's URL (`postgresql://postgres@127.0.0.1:PORT/dbname`) and a
    callable that stops the server and deletes its files. The files go to a fresh
    directory under `tmpdir` (default: the system temp dir); as root that directory is
    handed to the postgres user, so `tmpdir` must be reachable by it — pytest's own
    tmp_path (mode 0700) is not, which is why the default is the system temp dir.
    Durability is switched off (fsync, synchronous_commit): the data is thrown away."""
    bindir = find_pg_bin()
    if bindir is None:
        raise FileNotFoundError("no PostgreSQL server binaries (initdb, pg_ctl); apt-get install postgresql")
    # Short path: the socket lives here and Unix socket paths are limited to ~100 bytes.
    base = Path(tempfile.mkdtemp(prefix="optico-pg-", dir=tmpdir))
    data, log = base / "data", base / "server.log"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    _run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "-E", "UTF8",
          "--no-locale", "--no-sync"], "initdb")
    port = 0
    for attempt in range(3):  # the free port may be taken between probe and bind
        port = _free_port()
        options = (f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off "
                   f"-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        try:
            _run([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options, "-w", "-t", "60",
                  "start"], "pg_ctl start", log)
            break
        except RuntimeError:
            if attempt == 2:
                shutil.rmtree(base, ignore_errors=True)
                raise

    def stop() -> None:
        subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"]),
                       capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)

    try:
        admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + 30
        while True:
            try:
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute(f'CREATE DATABASE "{dbname}"')
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    except BaseException:
        stop()
        raise
    return f"postgresql://postgres@127.0.0.1:{port}/{dbname}", stop


def create_database(server_url: str, name: str) -> str:
    """Creates database `name` on the server of `server_url` and returns its URL (same
    credentials). Gives each test its own empty database."""
    from sqlalchemy.engine import make_url

    url = make_url(server_url)
    with psycopg.connect(url.set(drivername="postgresql", database="postgres")
                         .render_as_string(hide_password=False), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return url.set(database=name).render_as_string(hide_password=False)

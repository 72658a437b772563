"""One torchrun process tree on this machine: started, its output captured, and killed whole.

torchrun starts each worker in a session of its own (`start_new_session=True` in torch's
elastic subprocess handler), so killing torchrun's process group does not reach the
workers, and a SIGKILLed torchrun orphans them. Every process of a run therefore carries
an environment marker, ``OPTICO_RUN_TOKEN=<token>``, inherited by whatever it starts; a
kill sends SIGTERM to the group (torchrun forwards it to its workers), waits, then SIGKILLs
every process that still carries the token. `processes_with_token` is also how tests prove
that nothing was left behind.

A launcher SIGKILLed mid-run (a worker, a Ray actor whose raylet died) kills nothing: its run goes
on holding the GPUs, and the trial re-run by the next worker meets it there. Every process of a run
therefore also carries ``OPTICO_RUN_OWNER=<pid>:<start time>:<pid namespace>`` of the process that
started it, and each start first kills the runs whose owner is gone (`reap_orphaned_runs`).

Used by the local launcher directly and by the Ray launcher's node agents (in the actor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

from optico.private_files import private_opener

TOKEN_ENV = "OPTICO_RUN_TOKEN"
OWNER_ENV = "OPTICO_RUN_OWNER"
LineSink = Callable[[str, str], None]  # (stream name, line without newline)
log = logging.getLogger(__name__)


def _marked_processes() -> list[tuple[int, list[bytes]]]:
    """(pid, environment entries) of the live (non-zombie) processes of any run; this process
    excluded. Linux /proc; an empty list elsewhere."""
    marker = f"{TOKEN_ENV}=".encode()
    me, found = os.getpid(), []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            if not any(v.startswith(marker) for v in env):
                continue
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append((int(entry), env))
    return found


def processes_with_token(token: str | None) -> list[int]:
    """Live (non-zombie) processes whose environment holds OPTICO_RUN_TOKEN=`token` (any
    token for None); this process excluded. Linux /proc; an empty list elsewhere."""
    marker = f"{TOKEN_ENV}={token}".encode()
    return [pid for pid, env in _marked_processes() if token is None or marker in env]


def _start_time(pid: int) -> str | None:
    """When process `pid` started (clock ticks since boot): a pid reused later has another. None if
    no such process, or only its zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return None if fields[0] in (b"Z", b"X") else fields[19].decode()
    except (OSError, IndexError):
        return None


def _pid_namespace() -> str | None:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def owner_identity() -> str | None:
    """This process as the owner of the runs it starts: `pid:start time:pid namespace`; None where
    /proc cannot tell (then its runs are never reaped)."""
    start, namespace = _start_time(os.getpid()), _pid_namespace()
    return None if start is None or namespace is None else f"{os.getpid()}:{start}:{namespace}"


def _owner_gone(owner: str, namespace: str) -> bool:
    """Whether the owner `pid:start time:namespace` names a process of this namespace that is gone. A
    value that is not one (a trial may set its children's environment) is never taken for gone."""
    pid, start, owner_namespace = (owner.split(":", 2) + ["", ""])[:3]
    # Another pid namespace's pids mean nothing here (a container's runs seen from its host).
    if owner_namespace != namespace or not re.fullmatch(r"[0-9]{1,10}", pid) or not re.fullmatch(r"[0-9]+", start):
        return False
    return _start_time(int(pid)) != start


def _orphaned(pid: int, env: list[bytes], namespace: str) -> bool:
    """Whether process `pid`, with environment `env`, is a run's process of this user whose owner is gone."""
    try:
        if os.stat(f"/proc/{pid}").st_uid != os.getuid():  # another user's run is not ours to judge
            return False
    except OSError:
        return False
    prefix = f"{OWNER_ENV}=".encode()
    entry = next((e for e in env if e.startswith(prefix)), None)
    return entry is not None and _owner_gone(entry[len(prefix):].decode(errors="replace"), namespace)


def _still_orphaned(pid: int, namespace: str) -> bool:
    """`_orphaned`, its environment read again now (the process may be another one by this time)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            env = fh.read().split(b"\0")
    except OSError:
        return False
    return _orphaned(pid, env, namespace)


def _kill_if_still_orphan(pid: int, namespace: str) -> bool:
    """SIGKILLs `pid` if it is still an orphaned run's process: through a pidfd, opened before the
    check, so a pid reused after the scan is never signalled."""
    try:
        fd = os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone; or no pidfd (Linux < 5.3): check, then kill by pid
        if not _still_orphaned(pid, namespace):
            return False
        _signal([pid], signal.SIGKILL)
        return True
    try:
        if not _still_orphaned(pid, namespace):
            return False
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def reap_orphaned_runs() -> list[int]:
    """SIGKILLs every process of this user's runs whose owner (the optico or Ray actor that started
    them) has died: nobody will read its output or stop it, and it holds GPUs a new run needs. Returns
    their pids."""
    namespace = _pid_namespace()
    if namespace is None:
        return []
    candidates = [pid for pid, env in _marked_processes() if _orphaned(pid, env, namespace)]
    return [pid for pid in candidates if _kill_if_still_orphan(pid, namespace)]


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _parent_death_signal() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Linux: the child gets SIGTERM when the process that started it dies (an optico or a
    Ray actor killed with SIGKILL), so torchrun can still stop its workers."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except Exception:
        pass


class ProcessRun:
    """A started command: stdout/stderr go line by line to `<run_dir>/stdout.log`,
    `<run_dir>/stderr.log` and to `sink`; `last_output` is when the latest line arrived."""

    def __init__(self, argv: list[str], *, env: dict[str, str], cwd: str | None, run_dir: Path, token: str,
                 sink: LineSink | None = None, file_prefix: str = ""):
        self.argv, self.env, self.cwd, self.run_dir, self.token = argv, env, cwd, run_dir, token
        self.sink = sink
        self.file_prefix = file_prefix
        self.proc: asyncio.subprocess.Process | None = None
        self.started = self.last_output = time.monotonic()
        self._pumps: list[asyncio.Task] = []

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode if self.proc else None

    async def start(self) -> None:
        orphans = reap_orphaned_runs()
        if orphans:
            log.warning("killed %d process(es) of runs whose launcher died (pids %s)", len(orphans),
                        " ".join(map(str, orphans)))
        env = dict(self.env)
        env[TOKEN_ENV] = self.token
        owner = owner_identity()
        if owner is not None:
            env[OWNER_ENV] = owner
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, env=env, cwd=self.cwd or str(self.run_dir), start_new_session=True,
            preexec_fn=_parent_death_signal if os.name == "posix" else None, limit=1 << 20)
        self.started = self.last_output = time.monotonic()
        self._pumps = [asyncio.create_task(self._pump(self.proc.stdout, "stdout")),
                       asyncio.create_task(self._pump(self.proc.stderr, "stderr"))]

    async def _pump(self, stream: asyncio.StreamReader, name: str) -> None:
        path = self.run_dir / f"{self.file_prefix}{name}.log"
        with open(path, "a", encoding="utf-8", errors="replace", opener=private_opener) as fh:
            while True:
                raw = await _next_piece(stream)
                if not raw:
                    return
                line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                fh.write(line + "\n")
                fh.flush()
                self.last_output = time.monotonic()
                if self.sink is not None:
                    self.sink(name, line)

    async def wait(self, timeout: float | None = None) -> int | None:
        """The exit status once the process and its output have ended; None on timeout."""
        assert self.proc is not None
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            return None
        # the pumps finish once the pipes close (a surviving orphan may hold them open)
        await asyncio.wait(self._pumps, timeout=5)
        return self.proc.returncode

    def alive(self) -> list[int]:
        return processes_with_token(self.token)

    async def kill(self, grace_s: float = 10.0) -> int | None:
        """SIGTERM to torchrun's group, then, after `grace_s`, SIGKILL to every process of
        the run. Returns the exit status. Safe to call more than once, and after exit."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGTERM)
        _signal(self.alive(), signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if self.proc.returncode is not None and not self.alive():
                break
            await asyncio.sleep(0.1)
        left = self.alive()
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        _signal(left, signal.SIGKILL)
        for _ in range(50):  # SIGKILL is not instantaneous: wait until they are gone
            if not self.alive():
                break
            await asyncio.sleep(0.1)
        code = await self.wait(timeout=10)
        for task in self._pumps:
            task.cancel()
        return code


async def _next_piece(stream: asyncio.StreamReader) -> bytes:
    """The next line, or the next MiB of a line longer than the stream's limit (its rest follows as more
    pieces). `readline` threw a line over the limit away whole (a tensor printed into an exception, a
    progress bar redrawn with \\r): the error or the metrics in it were never read."""
    try:
        return await stream.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:  # the end: a last line without its newline
        return exc.partial
    except asyncio.LimitOverrunError:  # over the limit: the data stays buffered; take it in pieces
        return await stream.read(1 << 20)


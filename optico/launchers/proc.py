"""One torchrun process tree on this machine: started, its output captured, and killed whole.

torchrun starts each worker in a session of its own (`start_new_session=True` in torch's
elastic subprocess handler), so killing torchrun's process group does not reach the
workers, and a SIGKILLed torchrun orphans them. Every process of a run therefore carries
an environment marker, ``OPTICO_RUN_TOKEN=<token>``, inherited by whatever it starts; a
kill sends SIGTERM to the group (torchrun forwards it to its workers), waits, then SIGKILLs
every process that still carries the token. `processes_with_token` is also how tests prove
that nothing was left behind.

Used by the local launcher directly and by the Ray launcher's node agents (in the actor).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from optico.private_files import private_opener

TOKEN_ENV = "OPTICO_RUN_TOKEN"
LineSink = Callable[[str, str], None]  # (stream name, line without newline)


def processes_with_token(token: str | None) -> list[int]:
    """Live (non-zombie) processes whose environment holds OPTICO_RUN_TOKEN=`token` (any
    token for None); this process excluded. Linux /proc; an empty list elsewhere."""
    marker = f"{TOKEN_ENV}={token or ''}".encode()
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
            if not (marker in env if token else any(v.startswith(marker) for v in env)):
                continue
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state not in (b"Z", b"X"):
            found.append(int(entry))
    return found


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
        env = dict(self.env)
        env[TOKEN_ENV] = self.token
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


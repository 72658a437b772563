"""The Ray launcher: one trial = one placement group, one actor per node, torchrun in each.

(Named ray_launcher, not ray, so that it can never shadow the `ray` package.)

Per trial:
1. A placement group of one bundle per node, ``{GPU: gpus_per_node, CPU: num_cpus_per_node}``,
   STRICT_SPREAD (each bundle on a different node). It must be ready within
   `placement_timeout_s`, else the trial fails with "cluster lacks N GPUs" — Ray itself
   would wait forever.
2. One `NodeAgent` actor per bundle (``num_gpus`` = the bundle's GPUs, so Ray sets
   CUDA_VISIBLE_DEVICES; the spec's `runtime_env` passed through). The rank-0 agent names its
   node's address and a free port: the master of torchrun's static rendezvous
   (``--nnodes N --node-rank i --master-addr A --master-port P``).
3. Each agent starts torchrun on its node (`optico.launchers.proc`) and the launcher polls
   their output, which streams to `progress`, into `<run_dir>/<trial_key>/output.log` (lines of
   node i > 0 prefixed ``[node i]``) and to the same result parsing as the local launcher.
   Wall-clock limit, no-progress (hang) limit and cancel stop every node's processes.
4. Success, failure, timeout and cancel all end the same way: each agent stops its processes,
   the actors are killed and the placement group removed.

A node or actor that dies (ActorDiedError, NodeDiedError, ...), or a master port taken before
torchrun could bind it (EADDRINUSE at the rendezvous), is an infrastructure fault:
the trial is re-run from step 1, at most `max_infra_retries` times (tenacity); after that it
fails as INFRASTRUCTURE. Workers need optico importable (the same image, or `runtime_env`).
"""

from __future__ import annotations

import asyncio
import os
import random
import shlex
import socket
import sys
import threading
import time
import uuid
from collections import deque
from typing import Any, Callable

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt, wait_fixed

from optico.launchers.base import Launcher, ProgressCallback
from optico.launchers.local import KILL_GRACE_S, child_env, to_result, trial_dir, write_files
from optico.launchers.proc import ProcessRun
from optico.launchers.program import MegatronCoreProgram, MegatronLMProgram, PreparedRun, prepare
from optico.launchers.results import OutputCollector, RunEnd, port_was_taken
from optico.private_files import private_opener, write_private_text
from optico.redact import MASK, known_secrets
from optico.strategy import Strategy
from optico.trial import FailureCategory, LaunchResult
from optico.workload import Workload

POLL_S = 0.5
ACTOR_START_S = 300.0  # runtime_env setup (a container image, a working_dir upload) can take minutes
CALL_TIMEOUT_S = 60.0  # an agent that does not answer a poll in this long is lost
GCS_CALL_S = 10.0  # a blocking call to the cluster's GCS (teardown) is given up after this
GCS_PROBE_S = 3.0  # after a lost attempt: does the cluster's GCS still answer on its port?
PEER_GRACE_S = 5.0  # after one node fails, the others get this long to print their errors
AGENT_BUFFER = 100_000  # lines an agent keeps between polls


class InfraFailure(Exception):
    """A node, actor or the Ray runtime failed under a trial: worth re-running."""


class ClusterGone(RuntimeError):
    """The Ray cluster itself stopped answering: the job fails with the reason (not re-run on a cluster
    that is not there; `optico tune --resume` once it is back)."""


# torchrun binds the master port a moment after the rank-0 agent found it free. A port from the
# kernel's ephemeral range may meanwhile go to an outgoing connection (Ray opens many: a 2-node test
# cluster lost a retry to EADDRINUSE that way), so the port is drawn from below that range.
PORT_SPAN = 10_000  # ports below the ephemeral range the master port is drawn from
PORT_TRIES = 64


def _ephemeral_low() -> int:
    """The lowest port the kernel hands to outgoing connections (Linux's default when unreadable)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _free_port(host: str) -> int:
    """A port nothing listens on now, below the ephemeral range where one is free (else any)."""
    low = _ephemeral_low()
    draws = random.Random()
    for _ in range(PORT_TRIES if low > 2048 else 0):
        port = draws.randrange(max(1024, low - PORT_SPAN), low)
        with socket.socket() as sock:
            try:
                sock.bind((host if host else "", port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((host if host else "", 0))
        return sock.getsockname()[1]


class NodeAgent:
    """Runs inside a Ray actor on one node: starts that node's torchrun and hands its output
    back by polling."""

    def __init__(self, node_rank: int):
        self.node_rank = node_rank
        self.lines: deque[str] = deque(maxlen=AGENT_BUFFER)
        self.run: ProcessRun | None = None
        self.exit_code: int | None = None
        self.finished = False
        self._waiter: asyncio.Task | None = None

    def where(self) -> dict[str, Any]:
        import ray

        ip = ray.util.get_node_ip_address()
        return {"ip": ip, "port": _free_port(ip) if self.node_rank == 0 else None, "pid": os.getpid(),
                "host": socket.gethostname(), "node_id": ray.get_runtime_context().get_node_id(),
                "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}

    async def start(self, run: PreparedRun, *, trial_key: str, runs_root: str | None, env: dict[str, str],
                    master_addr: str, master_port: int, token: str, pass_env: tuple[str, ...] = ()) -> dict[str, Any]:
        directory = trial_dir(runs_root, f"{trial_key}-node{self.node_rank}")
        write_files(run, directory)
        argv = run.command(str(directory), node_rank=self.node_rank, master_addr=master_addr,
                           master_port=master_port, trial_key=trial_key, python=sys.executable)
        write_private_text(directory / "command.txt", shlex.join(argv) + "\n")
        child = child_env(env, pass_env)  # registers, in this actor's process, the secrets the run was given
        # Those values are known here only: the driver, which stores and shows the output (and hands it to
        # a failure analysis, maybe an LLM), never saw them. So lines leave this actor without them.
        hidden = known_secrets()
        self.run = ProcessRun(argv, env=child, cwd=run.cwd, run_dir=directory, token=token,
                              sink=lambda _stream, line: self.lines.append(_without(line, hidden)))
        await self.run.start()
        self._waiter = asyncio.create_task(self._wait())
        return {"run_dir": str(directory), "argv": argv, "pid": self.run.pid}

    async def _wait(self) -> None:
        assert self.run is not None
        self.exit_code = await self.run.wait()
        self.finished = True

    def poll(self) -> tuple[list[str], bool, int | None]:
        """(new lines, finished, exit status)."""
        lines = list(self.lines)
        self.lines.clear()
        return lines, self.finished, self.exit_code

    async def stop(self, grace_s: float) -> int | None:
        if self.run is None:
            return None
        code = await self.run.kill(grace_s)
        self.finished, self.exit_code = True, code if self.exit_code is None else self.exit_code
        return code


async def _off_the_loop(work: Callable[[], None], timeout: float) -> bool:
    """Runs `work` in a daemon thread, waiting at most `timeout`; False if it had not returned. A daemon
    thread, not the loop's executor: a call that never returns must not hold the process at its exit."""
    loop = asyncio.get_running_loop()
    finished = loop.create_future()

    def run() -> None:
        try:
            work()
        except BaseException:  # noqa: BLE001 - the caller only waits for it
            pass
        try:
            loop.call_soon_threadsafe(lambda: finished.done() or finished.set_result(None))
        except RuntimeError:  # the loop has closed meanwhile
            pass

    threading.Thread(target=run, name="optico-ray-gcs-call", daemon=True).start()
    try:
        await asyncio.wait_for(asyncio.shield(finished), timeout)
    except asyncio.TimeoutError:
        return False
    return True


def _gcs_unreachable(ray) -> str | None:
    """Why the cluster's GCS does not answer a TCP connect in GCS_PROBE_S (None: it answers, or this Ray
    does not say where it is)."""
    address = "?"
    try:
        address = ray.get_runtime_context().gcs_address
        host, port = address.rsplit(":", 1)
        socket.create_connection((host.strip("[]"), int(port)), timeout=GCS_PROBE_S).close()
    except OSError as exc:
        return f"its GCS at {address}: {exc.strerror or type(exc).__name__}"
    except Exception:  # noqa: BLE001 - no runtime context, an address of another shape: nothing to say
        return None
    return None


def _without(line: str, secrets: list[str]) -> str:
    """`line` with each of `secrets` (longest first) replaced by the mask; nothing else changed, so a
    metrics line parses as it was."""
    for secret in secrets:
        if secret in line:
            line = line.replace(secret, MASK)
    return line


class RayLauncher(Launcher):
    """Runs trials on a Ray cluster; see the module docstring."""

    kind = "ray"

    def __init__(self, program: MegatronCoreProgram | MegatronLMProgram | None = None, *, address: str | None = None,
                 timeout_s: float = 3600, hang_s: float = 600, env: dict[str, str] | None = None,
                 run_dir: str | os.PathLike | None = None, num_cpus_per_node: float = 1,
                 runtime_env: dict[str, Any] | None = None, placement_timeout_s: float = 120,
                 max_infra_retries: int = 2, ray_init: dict[str, Any] | None = None,
                 kill_grace_s: float = KILL_GRACE_S, retry_wait_s: float = 2.0, pass_env: tuple[str, ...] = ()):
        self.program = program or MegatronCoreProgram()
        self.address, self.timeout_s, self.hang_s = address, timeout_s, hang_s
        self.env = dict(env or {})
        self.pass_env = tuple(pass_env)
        self.run_dir = None if run_dir is None else str(run_dir)
        self.num_cpus_per_node, self.runtime_env = num_cpus_per_node, dict(runtime_env or {})
        self.placement_timeout_s, self.max_infra_retries = placement_timeout_s, max_infra_retries
        self.ray_init = dict(ray_init or {})
        self.kill_grace_s, self.retry_wait_s = kill_grace_s, retry_wait_s
        self._started_ray = False
        self._agent_cls = None

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind, "address": self.address, "program": self.program.model_dump(mode="json"),
                "timeout_s": self.timeout_s, "hang_s": self.hang_s, "num_cpus_per_node": self.num_cpus_per_node,
                "placement_timeout_s": self.placement_timeout_s, "max_infra_retries": self.max_infra_retries}

    # -- Ray ---------------------------------------------------------------------------------
    def _connect(self):
        """ray, initialised: an existing connection in this process is reused; else `address`
        (auto, ray://host:port, local; None = ray.init's search: RAY_ADDRESS, the latest
        `ray start` cluster on this machine, else a new local cluster)."""
        import ray

        if not ray.is_initialized():
            kwargs = {"log_to_driver": False, "namespace": "optico", **self.ray_init}
            if self.address is not None:
                kwargs["address"] = self.address
            ray.init(**kwargs)
            self._started_ray = True
        if self._agent_cls is None:
            self._agent_cls = ray.remote(NodeAgent)
        return ray

    async def aclose(self) -> None:
        if self._started_ray:
            import ray

            ray.shutdown()
            self._started_ray = False

    # -- the protocol ------------------------------------------------------------------------
    async def launch(self, workload: Workload, strategy: Strategy, *, trial_key: str,
                     progress: ProgressCallback | None = None) -> LaunchResult:
        run = prepare(self.program, workload, strategy)
        ray = self._connect()
        directory = trial_dir(self.run_dir, trial_key)
        lost: list[str] = []
        t0 = time.monotonic()
        try:
            async for attempt in AsyncRetrying(stop=stop_after_attempt(self.max_infra_retries + 1),
                                               retry=retry_if_exception_type(InfraFailure),
                                               wait=wait_fixed(self.retry_wait_s), reraise=True):
                with attempt:
                    number = attempt.retry_state.attempt_number
                    try:
                        result = await self._attempt(ray, run, workload, strategy, trial_key, number, directory,
                                                     progress)
                    except InfraFailure as exc:
                        lost.append(f"attempt {number}: {exc}")
                        if progress:
                            progress(f"[optico] attempt {number} lost to an infrastructure fault: {exc}")
                        gone = _gcs_unreachable(ray)
                        if gone:  # a new attempt would block creating its placement group on a dead GCS
                            raise ClusterGone(f"the Ray cluster stopped answering ({gone}): {exc}") from None
                        raise
        except InfraFailure:
            duration = time.monotonic() - t0
            log = (f"{lost[-1].split(': ', 1)[1]}\n"
                   f"infrastructure fault on every attempt ({len(lost)}): the trial was not measured\n"
                   + "\n".join(lost) + "\n")
            return LaunchResult(ok=False, log=log, exit_code=None, duration_s=duration,
                                gpu_seconds=duration * workload.world_size,
                                fingerprint={"launcher": self.kind, "infra_faults": lost, "run_dir": str(directory)},
                                log_path=str(directory / "output.log"),
                                category_hint=FailureCategory.INFRASTRUCTURE)
        if lost:
            result = result.model_copy(update={
                "fingerprint": {**result.fingerprint, "infra_faults": lost},
                "log": result.log + f"(re-run after {len(lost)} attempt(s) lost to an infrastructure fault)\n"})
        return result

    async def _attempt(self, ray, run: PreparedRun, workload: Workload, strategy: Strategy, trial_key: str,
                       number: int, directory, progress: ProgressCallback | None) -> LaunchResult:
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundle = {"GPU": float(run.nproc_per_node), "CPU": float(self.num_cpus_per_node)}
        pg = placement_group([dict(bundle) for _ in range(run.nnodes)], strategy="STRICT_SPREAD",
                             name=f"optico-{trial_key}-{number}-{uuid.uuid4().hex[:6]}")
        agents: list[Any] = []
        collector = OutputCollector()
        out_path = directory / "output.log"
        try:
            try:
                await asyncio.wait_for(_awaitable(pg.ready()), self.placement_timeout_s)
            except asyncio.TimeoutError:
                return self._unplaceable(ray, run, workload, directory)
            options = dict(num_cpus=self.num_cpus_per_node, num_gpus=run.nproc_per_node, max_restarts=0)
            if self.runtime_env:
                options["runtime_env"] = self.runtime_env
            agents = [self._agent_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                **options).remote(i) for i in range(run.nnodes)]
            where = await self._call([a.where.remote() for a in agents], ACTOR_START_S, "starting the node actors")
            master_addr, master_port = where[0]["ip"], where[0]["port"]
            token = uuid.uuid4().hex
            started = await self._call(
                [a.start.remote(run, trial_key=trial_key, runs_root=self.run_dir, env=self.env, pass_env=self.pass_env,
                                master_addr=master_addr, master_port=master_port, token=token) for a in agents],
                CALL_TIMEOUT_S, "starting torchrun")
            write_private_text(directory / "command.txt", "".join(
                f"# node {i} on {w['host']} ({w['ip']}), run dir {s['run_dir']}\n{shlex.join(s['argv'])}\n"
                for i, (w, s) in enumerate(zip(where, started))))
            fingerprint = {"launcher": self.kind, "attempt": number, "nodes": [
                {"host": w["host"], "ip": w["ip"], "node_id": w["node_id"], "run_dir": s["run_dir"],
                 "cuda_visible_devices": w["cuda_visible_devices"]} for w, s in zip(where, started)],
                "master": f"{master_addr}:{master_port}", "program": run.kind, "run_dir": str(directory)}
            with open(out_path, "a", encoding="utf-8", opener=private_opener) as out:
                end = await self._supervise(agents, collector, out, progress)
            if end.exit_code != 0 and not end.killed and port_was_taken(collector, master_port):
                # Taken between the agent's probe and torchrun's bind: the launcher's race, not the run's.
                raise InfraFailure(f"the master port {master_addr}:{master_port} was taken before torchrun bound it")
            return to_result(run, collector, end, workload, strategy, fingerprint=fingerprint,
                             log_path=str(out_path))
        finally:
            await self._teardown(ray, agents, pg, remove_placement_group)

    async def _supervise(self, agents: list[Any], collector: OutputCollector, out,
                         progress: ProgressCallback | None) -> RunEnd:
        t_start = last_line = time.monotonic()
        n = len(agents)
        finished: dict[int, int | None] = {}
        first_failure: float | None = None
        killed, detail, mark = None, "", None
        while True:
            polls = await self._call([a.poll.remote() for a in agents], CALL_TIMEOUT_S, "polling the node actors")
            now = time.monotonic()
            for i, (lines, done, code) in enumerate(polls):
                for line in lines:
                    collector.add(line, node=i)
                    out.write((line if i == 0 else f"[node{i}] {line}") + "\n")
                    if progress:
                        progress(line if i == 0 else f"[node{i}] {line}")
                if lines:
                    last_line = now
                if done and i not in finished:
                    finished[i] = code
                    if code != 0 and first_failure is None:
                        first_failure = now
            out.flush()
            if len(finished) == n:
                break
            if first_failure is not None and now - first_failure > PEER_GRACE_S:
                break  # one node failed; its peers would only wait on it
            if now - t_start > self.timeout_s:
                killed, detail, mark = "timeout", f"{self.timeout_s:g} s", collector.lines
                break
            if now - last_line > self.hang_s:
                killed, detail, mark = "hang", f"{self.hang_s:g} s", collector.lines
                break
            await asyncio.sleep(POLL_S)
        if len(finished) < n:
            codes = await self._call([a.stop.remote(self.kill_grace_s) for a in agents],
                                     self.kill_grace_s + CALL_TIMEOUT_S, "stopping torchrun")
            for i, code in enumerate(codes):
                finished.setdefault(i, code)
            for i, (lines, _, _) in enumerate(await self._call([a.poll.remote() for a in agents], CALL_TIMEOUT_S,
                                                               "polling the node actors")):
                for line in lines:
                    collector.add(line, node=i)
                    out.write((line if i == 0 else f"[node{i}] {line}") + "\n")
        failed = [c for _, c in sorted(finished.items()) if c != 0]
        code = failed[0] if failed else 0
        return RunEnd(exit_code=code, duration_s=time.monotonic() - t_start, killed=killed, detail=detail,
                      lines_before_kill=mark)

    async def _call(self, refs: list[Any], timeout: float, what: str) -> list[Any]:
        """The agents' answers; a dead actor or node, or no answer in `timeout`, is an InfraFailure."""
        import ray

        try:
            return await asyncio.wait_for(asyncio.gather(*[_awaitable(r) for r in refs]), timeout)
        except asyncio.TimeoutError:
            raise InfraFailure(f"no answer from the node actors in {timeout:g} s while {what}") from None
        except ray.exceptions.RayTaskError:
            raise  # a bug in the agent, not the infrastructure
        except ray.exceptions.RayError as exc:
            text = str(exc).strip().splitlines()
            raise InfraFailure(f"{type(exc).__name__} while {what}: {text[0] if text else ''}"[:500]) from exc

    async def _teardown(self, ray, agents: list[Any], pg: Any, remove_placement_group) -> None:
        """Stops every agent's processes, kills the actors, removes the placement group;
        survives dead actors and a second cancellation."""
        async def stop_all() -> None:
            if agents:
                stops = [asyncio.ensure_future(_awaitable(a.stop.remote(self.kill_grace_s))) for a in agents]
                done, _ = await asyncio.wait(stops, timeout=self.kill_grace_s + 15)
                for fut in done:
                    fut.exception()  # retrieved: a dead agent's error is expected here
        try:
            await asyncio.shield(stop_all())
        except BaseException:  # noqa: BLE001 - a dead actor, a timeout, a second cancel: kill anyway
            pass
        def release() -> None:
            for a in agents:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:
                    pass
            try:
                remove_placement_group(pg)
            except Exception:
                pass
        # Synchronous calls to the cluster's GCS: with the GCS gone (`ray stop --force`) they never return,
        # and they held the event loop until Ray's core ended the process, the job left `running`.
        await _off_the_loop(release, GCS_CALL_S)

    def _unplaceable(self, ray, run: PreparedRun, workload: Workload, directory) -> LaunchResult:
        need = run.nnodes * run.nproc_per_node
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        capacity = sorted((float(n["Resources"].get("GPU", 0)) for n in nodes
                           if float(n["Resources"].get("CPU", 0)) >= self.num_cpus_per_node), reverse=True)
        hosts = [g for g in capacity if g >= run.nproc_per_node][: run.nnodes]
        lacking = need - len(hosts) * run.nproc_per_node
        total = sum(float(n["Resources"].get("GPU", 0)) for n in nodes)
        free = float(ray.available_resources().get("GPU", 0))
        shape = (f"{run.nnodes} node(s) x {run.nproc_per_node} GPUs and {self.num_cpus_per_node:g} CPU(s) each, "
                 f"one node each")
        if lacking > 0:
            head = f"placement group failed: cluster lacks {lacking} GPUs for {shape}"
        else:
            head = (f"placement group failed: cluster lacks {need - min(need, int(free))} free GPUs for {shape}; "
                    f"its GPUs are held by other work")
        log = (f"{head}\nplacement group not ready after {self.placement_timeout_s:g} s; the cluster has {len(nodes)} "
               f"node(s), {total:g} GPUs in all ({free:g} free), GPUs per node: {capacity}\n")
        return LaunchResult(ok=False, log=log, duration_s=self.placement_timeout_s,
                            fingerprint={"launcher": self.kind, "run_dir": str(directory)},
                            category_hint=FailureCategory.INFRASTRUCTURE)


async def _awaitable(ref: Any) -> Any:
    return await ref

"""Builds the launcher a spec asks for."""

from __future__ import annotations

from optico.launchers.base import Launcher
from optico.perfmodel.constants import Constants
from optico.spec import LauncherSpec


def build_launcher(spec: LauncherSpec, job_seed: int = 0, constants: Constants | None = None) -> Launcher:
    """The launcher for `spec`; ValueError names what is missing. `constants`: the job's calibration, which
    the simulator uses as its cluster."""
    if spec.kind == "sim":
        from optico.launchers.sim import SimLauncher

        seed = job_seed if spec.seed is None else spec.seed
        return SimLauncher(seed=seed, noise=spec.noise, hang_rate=spec.hang_rate, infra_rate=spec.infra_rate,
                           trial_seconds=spec.trial_seconds, constants=constants,
                           framework_version=spec.framework_version, timeout_s=spec.timeout_s, hang_s=spec.hang_s)
    if spec.kind == "replay":
        from optico.launchers.replay import ReplayLauncher

        if not spec.data:
            raise ValueError("launcher.data: the replay launcher needs the CSV of measured runs")
        return ReplayLauncher(spec.data)
    if spec.kind == "local":
        from optico.launchers.local import LocalLauncher

        return LocalLauncher(spec.program, timeout_s=spec.timeout_s, hang_s=spec.hang_s, env=spec.env,
                             run_dir=spec.run_dir, pass_env=spec.pass_env)
    if spec.kind == "ray":
        from optico.launchers.ray_launcher import RayLauncher

        return RayLauncher(spec.program, address=spec.address, timeout_s=spec.timeout_s, hang_s=spec.hang_s,
                           env=spec.env, run_dir=spec.run_dir, num_cpus_per_node=spec.num_cpus_per_node,
                           runtime_env=spec.runtime_env, placement_timeout_s=spec.placement_timeout_s,
                           max_infra_retries=spec.max_infra_retries, ray_init=spec.ray_init,
                           pass_env=tuple(spec.pass_env))
    raise ValueError(f"launcher.kind: {spec.kind!r} is not available in this build")

"""Builds the launcher a spec asks for."""

from __future__ import annotations

from optico.launchers.base import Launcher
from optico.spec import LauncherSpec


def build_launcher(spec: LauncherSpec, job_seed: int = 0) -> Launcher:
    """The launcher for `spec`; ValueError names what is missing."""
    if spec.kind == "sim":
        from optico.launchers.sim import SimLauncher

        seed = job_seed if spec.seed is None else spec.seed
        return SimLauncher(seed=seed, noise=spec.noise, hang_rate=spec.hang_rate, infra_rate=spec.infra_rate,
                           delay_s=spec.delay_s)
    if spec.kind == "replay":
        from optico.launchers.replay import ReplayLauncher

        if not spec.data:
            raise ValueError("launcher.data: the replay launcher needs the CSV of measured runs")
        return ReplayLauncher(spec.data)
    raise ValueError(f"launcher.kind: {spec.kind!r} is not available in this build")

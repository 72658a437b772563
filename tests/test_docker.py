"""docker/: what can be checked without a Docker engine (CI has none): the compose file parses and
hangs together, every file the images copy exists, and every command they run is a real command of
the package (or of Ray) whose options parse."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import typer
import yaml

from optico.cli import app

DOCKER = Path(__file__).resolve().parents[1] / "docker"
OPTICO = typer.main.get_command(app)


def parses(group, argv: list[str]) -> None:
    """Resolves `argv` through nested command groups (click's, or the click typer vendors) and parses
    the final command's options, running nothing."""
    command, args = group, list(argv)
    while hasattr(command, "resolve_command"):
        name, command, args = command.resolve_command(command.context_class(command), args)
        assert command is not None, f"no command {name!r}"
    command.make_context(command.name or "cmd", args, resilient_parsing=False)


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def test_compose_file_hangs_together():
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    services = compose["services"]
    assert set(services) == {"postgres", "ray-head", "service"}
    for name, service in services.items():
        build = service.get("build")
        if build:
            assert (DOCKER / build["context"] / build["dockerfile"]).is_file(), name
        for dep in service.get("depends_on", {}):
            assert dep in services, (name, dep)
    env = services["service"]["environment"]
    assert env["OPTICO_DATABASE_URL"].startswith("postgresql://") and "@postgres:5432/" in env["OPTICO_DATABASE_URL"]
    parses(OPTICO, services["service"]["command"])
    from ray.scripts.scripts import cli as ray_cli

    head = services["ray-head"]["command"]
    assert head[0] == "ray"
    parses(ray_cli, head[1:])
    assert set(compose["volumes"]) == {"pgdata"}
    with pytest.raises(Exception, match="No such option"):  # the check has teeth: unknown options fail
        parses(OPTICO, ["serve", "--no-such-option"])


@pytest.mark.parametrize("name", ["Dockerfile.service", "Dockerfile.gpu-worker"])
def test_dockerfiles_copy_what_exists_and_run_real_commands(name: str):
    steps = instructions(DOCKER / name)
    for kind, rest in steps:
        if kind == "COPY":
            *sources, _ = rest.split()
            for source in sources:
                assert (DOCKER.parent / source).exists(), f"{name}: COPY {source}"
    entry = [json.loads(rest) for kind, rest in steps if kind == "ENTRYPOINT"]
    cmd = [json.loads(rest) for kind, rest in steps if kind == "CMD"]
    argv = (entry[-1] if entry else []) + (cmd[-1] if cmd else [])
    if argv[:2] == ["sh", "-c"]:
        argv = shlex.split(argv[2].replace('"$RAY_ADDRESS"', "head:6379"))
        argv = argv[1:] if argv[0] == "exec" else argv
    if argv[0] == "optico":
        parses(OPTICO, argv[1:])
    else:
        from ray.scripts.scripts import cli as ray_cli

        assert argv[0] == "ray"
        parses(ray_cli, argv[1:])
    # The service image carries no torch: it installs the postgres and ray extras, never megatron.
    if name == "Dockerfile.service":
        installs = " ".join(rest for kind, rest in steps if kind == "RUN")
        assert ".[postgres,ray]" in installs and "megatron" not in installs and "torch" not in installs


def test_deploy_docs_name_every_setting():
    """docs/deploy.md lists every setting the service reads, so none is undocumented."""
    from optico.service.settings import ServiceSettings

    text = (DOCKER.parent / "docs" / "deploy.md").read_text()
    missing = [f"OPTICO_{name.upper()}" for name in ServiceSettings.model_fields
               if f"`OPTICO_{name.upper()}`" not in text]
    assert missing == []

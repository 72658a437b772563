"""A job spec from a request body (JSON or YAML), checked as the CLI checks a spec file, plus what a
shared service must refuse: files outside the allowed roots and, unless allowed, arbitrary commands."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from optico.service.settings import ServiceSettings
from optico.spec import JobSpec, SpecError, parse_spec

PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"
MAX_DEPTH = 64  # a spec is a few levels deep; anything deeper is an attack on the parser


def _depth(value: object, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max((_depth(v, level + 1) for v in value.values()), default=level + 1)
    if isinstance(value, list):
        return max((_depth(v, level + 1) for v in value), default=level + 1)
    return level


def _parse(raw: bytes, content_type: str) -> object:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("body", f"not UTF-8 text (byte {exc.start})") from None
    kind = content_type.split(";")[0].strip().lower()
    try:
        if kind in ("", "application/json") or kind.endswith("+json"):
            data = json.loads(text)
        elif kind in ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"):
            data = yaml.safe_load(text)
        else:
            raise SpecError("body", f"unsupported content type {kind!r}; send application/json or application/yaml")
    except (ValueError, yaml.YAMLError, RecursionError) as exc:
        raise SpecError("body", f"not valid {'YAML' if 'yaml' in kind else 'JSON'}: "
                                f"{str(exc).splitlines()[0][:200]}") from None
    if _depth(data) > MAX_DEPTH:
        raise SpecError("body", f"nested deeper than {MAX_DEPTH} levels")
    return data


def _inside(path: Path, roots: list[Path]) -> bool:
    resolved = path.resolve()
    return any(resolved == root or root in resolved.parents for root in roots)


def _files_named(data: object) -> list[tuple[str, object]]:
    """The file paths a raw spec names, checked before the spec loader opens any of them."""
    if not isinstance(data, dict):
        return []
    launcher = data.get("launcher")
    found = [("calibration", data.get("calibration"))]
    if isinstance(launcher, dict):
        found.append(("launcher.data", launcher.get("data")))
    return [(field, value) for field, value in found if value is not None]


def spec_from_body(raw: bytes, content_type: str, settings: ServiceSettings) -> JobSpec:
    """The submitted spec, or SpecError naming the field and the reason."""
    data = _parse(raw, content_type)
    roots = [PACKAGE_DATA.resolve(), *(Path(r).expanduser().resolve() for r in settings.file_roots)]
    for field, value in _files_named(data):
        if not isinstance(value, str) or not Path(value).is_absolute() or not _inside(Path(value), roots):
            raise SpecError(field, "the service reads files only by absolute path under its allowed roots "
                                   "(the package's data, OPTICO_FILE_ROOTS)")
    spec = parse_spec(data)
    program = spec.launcher.program
    if program is not None and program.kind == "megatron-lm" and not settings.allow_commands:
        raise SpecError("launcher.program.command", "this service does not run submitted commands "
                                                    "(OPTICO_ALLOW_COMMANDS=true allows it)")
    return spec

"""A job spec from a request body, checked exactly as the CLI checks a spec file (`parse_spec_text`),
plus what a shared service refuses that a user's own `optico tune` allows:

- files outside the allowed roots (replay `launcher.data`, `calibration`, `launcher.run_dir`);
- unless OPTICO_ALLOW_COMMANDS=true, anything that makes the workers run other code than OptiCo's own
  driver: a Megatron-LM command, another interpreter, Ray `runtime_env`/`ray_init`, a Ray address
  other than the workers' own cluster (a Ray client unpickles what its server sends), environment
  variables that change what a process loads (LD_PRELOAD, PYTHONPATH, NCCL_NET_PLUGIN, CUDA_HOME,
  ...), and file paths in environment values.
"""

from __future__ import annotations

import json
from pathlib import Path

from optico.input_files import json_problem
from optico.redact import is_secret_name
from optico.service.settings import ServiceSettings
from optico.spec import JobSpec, SpecError, parse_spec_text

PACKAGE_DATA = Path(__file__).resolve().parents[1] / "data"
JSON_TYPES = ("application/json",)
YAML_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain")
# Variables that make a process load or run something else than the command it was given: by prefix
# (the C library's tunables and allocator settings, Open MPI's and PMIx's component parameters — an
# rsh agent is a command —, the profiler's config file), and by what their name says they point at
# (NCCL_NET_PLUGIN, CUDA_INJECTION64_PATH, CUDA_HOME, GCONV_PATH, TORCHINDUCTOR_CACHE_DIR,
# NCCL_TOPO_FILE: a library, a toolkit, a cache of compiled code, a file to read).
LOADER_VARIABLES = ("LD_", "DYLD_", "PYTHON", "BASH_ENV", "ENV", "PATH", "PERL5", "RUBY", "NODE_OPTIONS",
                    "GLIBC_", "MALLOC_", "OMPI_", "PMIX_", "KINETO_")
LOADER_WORDS = ("PRELOAD", "PLUGIN", "INJECT", "LIBRARY", "PATH", "HOME", "_DIR", "CACHE", "GCONV", "_FILE", "AGENT",
                "TUNABLES")
# Ray addresses a request may name: the workers' own cluster (RAY_ADDRESS, `ray start`) or a new local one.
OWN_RAY_ADDRESSES = (None, "auto", "local")


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
        found += [("launcher.data", launcher.get("data")), ("launcher.run_dir", launcher.get("run_dir"))]
    return [(field, value) for field, value in found if value is not None]


def _refuse_code(spec: JobSpec) -> None:
    launcher = spec.launcher
    program = launcher.program
    if program is not None and program.kind == "megatron-lm":
        raise SpecError("launcher.program.command", "this service does not run submitted commands")
    if program is not None and getattr(program, "python", None):
        raise SpecError("launcher.program.python", "this service runs trials with its own interpreter")
    if launcher.runtime_env:
        raise SpecError("launcher.runtime_env", "this service does not take a Ray runtime_env from a request")
    if launcher.ray_init:
        raise SpecError("launcher.ray_init", "this service starts Ray with its own settings")
    if launcher.address not in OWN_RAY_ADDRESSES:
        raise SpecError("launcher.address", "this service runs trials on its own Ray cluster (auto or local); "
                                            "it connects to no address from a request")
    for name, value in launcher.env.items():
        upper = name.upper()
        if upper.startswith(LOADER_VARIABLES) or any(word in upper for word in LOADER_WORDS):
            raise SpecError(f"launcher.env.{name}", "variables that change what a process loads are refused")
        if "/" in value and not is_secret_name(name):  # a secret's value comes from the worker's own environment
            raise SpecError(f"launcher.env.{name}", "this service takes no file paths in environment values")


_YAML_BREAKS = {ord(c): f"\\u{ord(c):04x}" for c in "\u0085\u2028\u2029"}


def spec_from_body(raw: bytes, content_type: str, settings: ServiceSettings) -> JobSpec:
    """The submitted spec, or SpecError naming the field and the reason."""
    kind = content_type.split(";")[0].strip().lower() or "application/json"
    if kind not in JSON_TYPES + YAML_TYPES and not kind.endswith("+json"):
        raise SpecError("body", f"unsupported content type {kind[:60]!r}; send application/json or application/yaml")
    if kind in JSON_TYPES or kind.endswith("+json"):
        try:  # strict JSON first: YAML would read some malformed JSON as a string
            json.loads(raw)
        except UnicodeDecodeError:
            raise SpecError("body", "not UTF-8 text") from None
        except (ValueError, RecursionError) as exc:
            raise SpecError("body", f"not valid JSON: {json_problem(exc)}") from None
    roots = [PACKAGE_DATA.resolve(), *(Path(r).expanduser().resolve() for r in settings.file_roots)]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("body", f"not UTF-8 text (byte {exc.start})") from None
    if kind in JSON_TYPES or kind.endswith("+json"):
        # JSON strings may hold NEL, LS and PS raw; the YAML reader below would take them for line
        # breaks and fold them into spaces. Escaped, YAML reads the same characters JSON did. Once,
        # here: the file-roots check and the spec read the same text.
        text = text.translate(_YAML_BREAKS)
    from optico.safe_yaml import load_yaml

    try:
        data = load_yaml(text)
    except Exception:  # noqa: BLE001 - parse_spec_text below reports it with the field and the reason
        data = None
    for field, value in _files_named(data):
        if not isinstance(value, str) or not Path(value).is_absolute() or not _inside(Path(value), roots):
            raise SpecError(field, "the service reads files only by absolute path under its allowed roots "
                                   "(the package's data, OPTICO_FILE_ROOTS)")
    spec = parse_spec_text(text.encode("utf-8"), origin_name="body")
    if not settings.allow_commands:
        _refuse_code(spec)
    return spec

"""The performance model's free constants: efficiencies and overheads that physics
leaves open. Defaults ship in calibration.json (fitted on benchmarks/data/published by
`optico perfmodel calibrate`); a spec or OPTICO_CALIBRATION can point elsewhere."""

from __future__ import annotations

import json
import os
import secrets
from functools import lru_cache
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from optico.errors import SpecError
from optico.input_files import MAX_JSON_BYTES, json_problem, read_text, unique_keys

DEFAULT_CALIBRATION = Path(__file__).with_name("calibration.json")
CALIBRATION_ENV = "OPTICO_CALIBRATION"


# oom_margin is policy, not physics; fragmentation is the caching allocator's typical slack (~5 %), which
# would otherwise trade off one for one against activation_scale.
_NOT_FITTED = {"oom_margin", "mem_fragmentation"}


class Constants(BaseModel):
    """Every free constant, with the bounds a calibration may move it within."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gemm_efficiency: float = Field(0.80, ge=0.3, le=0.98, description="Large bf16/fp16 GEMMs, fraction of peak.")
    fp8_gemm_efficiency: float = Field(0.55, ge=0.2, le=0.95, description="fp8 GEMMs, fraction of fp8 peak.")
    gemm_knee: float = Field(96.0, ge=1, le=4096, description="GEMM dimension at which efficiency halves.")
    volta_efficiency: float = Field(1.0, ge=0.4, le=1.25, description="Scales GEMM and attention efficiency "
                                                                     "on V100 (generations saturate differently).")
    ampere_efficiency: float = Field(1.0, ge=0.4, le=1.25, description="Same on A100.")
    hopper_efficiency: float = Field(1.0, ge=0.4, le=1.25, description="Same on H100/H200.")
    blackwell_efficiency: float = Field(1.0, ge=0.4, le=1.25, description="Same on B200/GB200/B300/GB300.")
    attention_efficiency: float = Field(0.50, ge=0.15, le=0.9, description="Flash attention, fraction of peak.")
    moe_gemm_penalty: float = Field(0.75, ge=0.3, le=1.0, description="Expert GEMMs looped one by one (no grouped GEMM).")
    elementwise_scale: float = Field(1.0, ge=0.2, le=5.0, description="Scales the memory traffic of norms, "
                                                                        "activations, RoPE, residuals.")
    nvlink_efficiency: float = Field(0.75, ge=0.2, le=1.0, description="NCCL bus bandwidth / nominal NVLink.")
    network_efficiency: float = Field(0.80, ge=0.2, le=1.0, description="NCCL bus bandwidth / nominal NIC.")
    tp_exposed: float = Field(0.85, ge=0.0, le=1.0, description="TP collectives not hidden (no TP overlap).")
    tp_overlap_exposed: float = Field(0.25, ge=0.0, le=1.0, description="TP collectives not hidden with "
                                                                        "tp_comm_overlap.")
    cp_exposed: float = Field(0.3, ge=0.0, le=1.0, description="Ring-attention KV exchange not hidden.")
    ep_exposed: float = Field(0.8, ge=0.0, le=1.0, description="Expert all-to-all not hidden.")
    ep_overlap_exposed: float = Field(0.3, ge=0.0, le=1.0, description="Expert all-to-all not hidden with EP "
                                                                       "communication overlap (1F1B A2A overlap).")
    p2p_exposed: float = Field(1.0, ge=0.0, le=1.0, description="Pipeline send/recv on the critical path.")
    p2p_overlap_exposed: float = Field(0.2, ge=0.0, le=1.0, description="Same with overlapped p2p (VPP).")
    dp_overlap_exposed: float = Field(0.15, ge=0.0, le=1.0, description="Grad reduce/param gather left "
                                                                        "exposed by the overlap flags.")
    layer_overhead_s: float = Field(2e-4, ge=0, le=0.01, description="Per layer per micro-batch: kernel "
                                                                     "launches, host work.")
    step_overhead_s: float = Field(0.02, ge=0, le=2.0, description="Per iteration: data, logging, sync.")
    activation_scale: float = Field(1.0, ge=0.3, le=2.0, description="Scales the Korthikanti activation count "
                                                                     "(fused kernels keep fewer tensors).")
    pp_extra_in_flight: float = Field(1.0, ge=0.0, le=1.5, description="Micro-batches a pipeline stage holds "
                                                                       "beyond 1F1B's PP - rank (receive "
                                                                       "buffers, the next input).")
    logits_bytes: float = Field(10.0, ge=4, le=10, description="Bytes per logit element held at the loss, "
                                                               "unfused: bf16 logits (2), the fp32 softmax kept "
                                                               "for backward (4), a transient fp32 copy (4).")
    logits_bytes_fused: float = Field(6.0, ge=2, le=24, description="Same with cross-entropy loss fusion by "
                                                                    "Transformer Engine's kernel "
                                                                    "(cross_entropy_fusion_impl te).")
    mem_overhead_gib: float = Field(2.5, ge=0, le=12, description="CUDA context, NCCL and cuBLAS buffers.")
    mem_fragmentation: float = Field(0.05, ge=0, le=0.5, description="Allocator slack over activations.")
    oom_margin: float = Field(0.06, ge=0, le=0.5, description="The guard rejects a prediction above "
                                                              "limit x (1 + margin).")

    @classmethod
    def free_fields(cls) -> dict[str, tuple[float, float]]:
        """Calibratable constants with their bounds."""
        out = {}
        for name, info in cls.model_fields.items():
            if name in _NOT_FITTED:
                continue
            lo = next(m.ge for m in info.metadata if hasattr(m, "ge"))
            hi = next(m.le for m in info.metadata if hasattr(m, "le"))
            out[name] = (float(lo), float(hi))
        return out

    def arch_factor(self, arch: str) -> float:
        return getattr(self, f"{arch}_efficiency", 1.0)

    def save(self, path: str | Path) -> None:
        """Writes the constants as JSON, atomically: a short-named temporary file beside `path`
        (`path` + ".tmp" could exceed the file system's name limit), then renamed over it."""
        path = Path(path)
        tmp = path.with_name(f".optico-{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            with open(tmp, "x") as handle:  # the umask's permissions, as a plain write would give
                handle.write(json.dumps(self.model_dump(), indent=2) + "\n")
            os.replace(tmp, path)
        except BaseException:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass  # never created (the folder is not there): the first error is the one to see
            raise


def load_constants(path: str | Path | None = None) -> Constants:
    """Constants from `path`, else $OPTICO_CALIBRATION, else the shipped calibration.

    The file is read with the spec's checks (`read_calibration`: size bound,
    UTF-8, JSON without NaN/Infinity, not too deep, an object of known constants of the right
    type within bounds; the shipped file's `_meta` is skipped). A file that fails them raises
    `SpecError` naming where it came from: `calibration` (a spec's field, or `path`) or
    `OPTICO_CALIBRATION`."""
    if path:
        return _load(str(path), "calibration")
    env = os.environ.get(CALIBRATION_ENV)
    if env:
        return _load(env, CALIBRATION_ENV)
    return _load(str(DEFAULT_CALIBRATION), "calibration")


@lru_cache(maxsize=16)
def _load(path: str, source: str) -> Constants:
    p = Path(path)
    if p == DEFAULT_CALIBRATION and not p.is_file():
        return Constants()
    return read_calibration(p, source)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def read_calibration(path: Path, field: str = "calibration") -> Constants:
    """The performance-model constants in `path` (JSON from `optico perfmodel calibrate`),
    checked field by field; SpecError naming `field.<constant>` otherwise."""
    text = read_text(path, field, "calibration JSON", MAX_JSON_BYTES)
    try:
        data = json.loads(text, parse_constant=_no_constant, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as exc:
        raise SpecError(field, f"{path.name} is not valid JSON at line {exc.lineno}, column {exc.colno}: "
                               f"{exc.msg}") from None
    except (ValueError, RecursionError) as exc:
        raise SpecError(field, f"{path.name} is not a calibration: {json_problem(exc)}") from None
    if not isinstance(data, dict):
        raise SpecError(field, f"{path.name} must hold a JSON object of constants, got {type(data).__name__}")
    data.pop("_meta", None)
    try:
        return Constants.model_validate(data, strict=True)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join([field, *(str(p) for p in err["loc"])])
        reason = "unknown constant" if err["type"] == "extra_forbidden" else err["msg"]
        raise SpecError(where, f"{reason} (in {path.name})") from None

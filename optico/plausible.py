"""Measurements a GPU cannot produce, refused wherever they come from.

A run measured at 400,000 % MFU, or at 31 GiB peak memory on a 6 GiB device, is not a fast or a
big run: the declared GPU is wrong (a CPU stand-in declared as `cpu` on real hardware), the log
was misread, or a table was mistyped. Accepted, it becomes the job's best trial and its memory
calibrates the model, after which every other configuration looks like an OOM. So a replay row
with such numbers is a spec error (`optico.input_files`), and such a launcher result a failed
trial (`checked_result`).
"""

from __future__ import annotations

import math

from optico.trial import FailureCategory, LaunchResult
from optico.workload import Workload

# Peak memory above the GPU's capacity by more than this is not a measurement (the catalog's
# capacities are what the driver reports; tools round to 0.1 GiB or to decimal GB).
MEMORY_TOLERANCE = 0.02


def measurement_problem(workload: Workload, *, mfu: float | None = None, mem_max_gib: float | None = None,
                        **positive: float | None) -> str | None:
    """Why these numbers cannot have been measured on `workload`'s GPU, or None. `positive`: rates
    and times that must be finite and above zero (step_time_s=..., tflops_per_gpu=...); `mfu_column`
    is the MFU a table states (beside the one its time gives, `mfu`)."""
    for name, value in positive.items():
        if value is not None and (not math.isfinite(value) or value <= 0):
            return f"{_COLUMN.get(name, name)} {value:g} is not a positive number"
    gpu = workload.cluster.spec
    # The MFU the row's time gives, and the MFU and TFLOP/s it states: none may pass the peak, nor sit
    # below a millionth of it (1e-320 passed as positive, then its step time overflowed the job's JSON).
    stated_tflops = positive.get("tflops_per_gpu")
    for what, share in (("measured MFU", mfu), ("stated MFU", positive.get("mfu_column")),
                        ("stated throughput", stated_tflops / workload.peak_tflops if stated_tflops else None)):
        if share is None:
            continue
        if math.isnan(share) or share <= 0:
            return f"a {what} of {share:g} is not a positive number"
        if share > 1.0:
            shown = f"{share:.1%}" if share < 1e6 else f"{share:.3g} times the peak"
            return (f"a {what} of {shown} is impossible: more than the {gpu.name}'s peak of "
                    f"{workload.peak_tflops:g} TFLOP/s ({workload.precision})")
        if share < MIN_SHARE_OF_PEAK:
            return (f"a {what} of {share:.3g} of the {gpu.name}'s peak is no training run: below "
                    f"{MIN_SHARE_OF_PEAK:g} of it")
    if mem_max_gib is not None:
        if not math.isfinite(mem_max_gib) or mem_max_gib <= 0:
            return f"mem_max_gib {mem_max_gib:g} is not a measurement"
        if mem_max_gib > gpu.memory_gib * (1 + MEMORY_TOLERANCE):
            return f"a peak memory of {mem_max_gib:g} GiB is impossible on the {gpu.name} ({gpu.memory_gib:g} GiB)"
    return None


# The smallest share of the GPU's peak a measured run may show: the lowest in the real tables is ~2e-4
# (small models in Megatron-LM's CI); a millionth is a typo or an underflow, not a measurement.
MIN_SHARE_OF_PEAK = 1e-6
# Names the caller passes under another name than the table's column.
_COLUMN = {"mfu_column": "mfu"}


def checked_result(result: LaunchResult, workload: Workload) -> LaunchResult:
    """`result`, or a failed one when its metrics are impossible on the declared GPU (the numbers
    stay in the log; they are not recorded as a measurement)."""
    m = result.metrics
    if not result.ok or m is None:
        return result
    problem = measurement_problem(workload, mfu=m.mfu, mem_max_gib=m.mem_max_gib, step_time_s=m.step_time_s,
                                  tflops_per_gpu=m.tflops_per_gpu, tokens_per_s_per_gpu=m.tokens_per_s_per_gpu)
    if problem is None:
        return result
    note = (f"[optico] measurement refused: {problem}. Is workload.cluster.gpu ({workload.cluster.gpu}) the "
            f"hardware this ran on?\n")
    return result.model_copy(update={"ok": False, "metrics": None, "log": result.log + note,
                                     "category_hint": FailureCategory.INFRASTRUCTURE})

"""`predict`: the performance model's one entry point."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from optico.perfmodel.bottleneck import Bottleneck, classify
from optico.perfmodel.constants import Constants, load_constants
from optico.flops import flops_per_iteration
from optico.perfmodel.layout import layout
from optico.perfmodel.memory import MemoryBreakdown, _params_on_stage, memory
from optico.perfmodel.timing import TimeBreakdown, step_time
from optico.strategy import Strategy
from optico.workload import Workload


class Prediction(BaseModel):
    """What the model expects of one strategy on one workload."""

    model_config = ConfigDict(frozen=True)

    step_time_s: float
    tflops_per_gpu: float
    mfu: float
    hfu: float
    tokens_per_s_per_gpu: float
    memory: MemoryBreakdown
    time: TimeBreakdown
    fits: bool
    bottleneck: Bottleneck
    evidence: list[str]

    @property
    def mem_gib(self) -> float:
        return self.memory.total_gib


def predict(w: Workload, s: Strategy, c: Constants | None = None) -> Prediction:
    """Step time, MFU, peak memory and bottleneck of `s` on `w` (s must be valid)."""
    c = c or load_constants()
    lay = layout(w, s, c)
    mem = memory(w, s, lay, c)
    params = max((_params_on_stage(w, s, lay, i) for i in range(lay.pp)), key=sum)
    time = step_time(w, s, lay, c, params)
    step = time.step_time_s
    peak = w.peak_tflops
    model_flops = flops_per_iteration(w, s.tp)
    tflops = model_flops / (step * 1e12 * w.world_size)
    hfu = time.hardware_flops / (step * 1e12) / peak
    bottleneck, evidence = classify(time, mem)
    return Prediction(
        step_time_s=step, tflops_per_gpu=tflops, mfu=tflops / peak, hfu=hfu,
        tokens_per_s_per_gpu=w.global_batch_size * w.seq_length / (step * w.world_size),
        memory=mem, time=time, fits=mem.needed_gib <= mem.limit_gib, bottleneck=bottleneck,
        evidence=evidence)

"""The parallel layout of one strategy on one world size: the object that owns the sizes.

Everything that needs DP, the expert grid or the layers each pipeline stage builds asks a
`ParallelDims` (the rules, the guard, the analysis agent, the performance model, the replay
reader) instead of re-deriving them. The arithmetic follows megatron-core 0.16:

- dense grid TP × CP × DP × PP, with DP = world / (TP·PP·CP);
- expert grid ETP × EP × expert-DP × PP (MoE parallel folding), expert-DP = world / (ETP·EP·PP);
  ETP defaults to TP;
- layers per stage as `get_num_layers_to_build` splits them: an even split of num_layers (plus
  one for the embedding and one for the loss when they are counted in the split), or uneven
  first/last stages with the rest spread over the middle stages; VPP chunks divide each stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from optico.knobs import Violation

if TYPE_CHECKING:
    from optico.strategy import Strategy

_FIRST, _LAST = "decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"
_PP, _VPP = "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size"
_EMB, _LOSS = "account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split"


@dataclass(frozen=True)
class ParallelDims:
    """Parallel sizes of a strategy on `world` ranks, with the facts derived from them."""

    world: int
    tp: int
    pp: int
    cp: int
    ep: int
    etp: int
    vpp: int
    first: int | None = None
    last: int | None = None
    embedding_in_split: bool = False
    loss_in_split: bool = False

    @classmethod
    def of(cls, s: "Strategy", world: int) -> "ParallelDims":
        return cls(world=world, tp=s.tp, pp=s.pp, cp=s.cp, ep=s.ep, etp=s.etp, vpp=s.vpp,
                   first=s.decoder_first_pipeline_num_layers, last=s.decoder_last_pipeline_num_layers,
                   embedding_in_split=s.account_for_embedding_in_pipeline_split,
                   loss_in_split=s.account_for_loss_in_pipeline_split)

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def model_parallel(self) -> int:
        return self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        return max(1, self.world // self.model_parallel)

    @property
    def expert_grid(self) -> int:
        return self.etp * self.ep * self.pp

    @property
    def expert_dp(self) -> int:
        return max(1, self.world // self.expert_grid)

    def microbatches(self, global_batch_size: int, micro_batch_size: int) -> int:
        return max(1, global_batch_size // (micro_batch_size * self.dp))

    @property
    def key(self) -> tuple:
        """What places layers and ranks: equal keys, equal placement."""
        return (self.tp, self.pp, self.cp, self.ep, self.etp, self.vpp, self.first, self.last,
                self.embedding_in_split, self.loss_in_split)

    # -- validity --------------------------------------------------------------------------------
    def grid_errors(self) -> list[Violation]:
        """parallel_state's arithmetic: both grids must tile the world."""
        out = []
        if self.world % self.model_parallel:
            out.append(Violation(("tensor_model_parallel_size", _PP, "context_parallel_size"),
                                 f"world size ({self.world}) must be divisible by TP·PP·CP "
                                 f"({self.tp}·{self.pp}·{self.cp} = {self.model_parallel})"))
        if self.world % self.expert_grid:
            out.append(Violation(("expert_model_parallel_size", "expert_tensor_parallel_size", _PP),
                                 f"world size ({self.world}) must be divisible by ETP·EP·PP "
                                 f"({self.etp}·{self.ep}·{self.pp} = {self.expert_grid}; ETP defaults to TP, "
                                 f"ETP 1 lets EP fold into the TP and CP ranks)"))
        return out

    def split_errors(self, num_layers: int) -> list[Violation]:
        """The pipeline split's checks (TransformerConfig, get_num_layers_to_build, validate_args)."""
        pp, vpp = self.pp, self.vpp
        if self.first or self.last:
            out: list[Violation] = []
            if pp == 1:
                return []  # reported by the coupling "uneven ... need PP > 1"
            layers, stages = num_layers, pp
            for name, count in ((_FIRST, self.first), (_LAST, self.last)):
                if count:
                    if count % vpp:
                        out.append(Violation((name, _VPP), f"{'FIRST' if name == _FIRST else 'LAST'}_PP_NUM_LAYERS "
                                                            f"({count}) must be divisible by VPP ({vpp})"))
                    layers -= count
                    stages -= 1
            if layers < 0 or bool(layers) != bool(stages):
                out.append(Violation((_FIRST, _LAST, _PP), f"first/last stage layers leave {layers} layers for "
                                     f"{stages} middle stages of PP ({pp}) with num_layers ({num_layers})"))
            elif stages and layers % stages:
                out.append(Violation((_FIRST, _LAST, _PP), f"middle layers ({layers}) must be divisible by the "
                                                            f"{stages} middle pipeline stages"))
            elif stages and (layers // stages) % vpp:
                out.append(Violation((_VPP,), f"layers per middle pipeline rank ({layers // stages}) must be "
                                              f"divisible by VPP ({vpp})"))
            return out
        total = num_layers + int(self.embedding_in_split) + int(self.loss_in_split)
        counted = " with the embedding and loss counted" if self.embedding_in_split and self.loss_in_split else \
            " with the embedding counted" if self.embedding_in_split else \
            " with the loss counted" if self.loss_in_split else ""
        if total % pp:
            return [Violation((_PP, _FIRST, _LAST), f"num_layers{counted} ({total}) must be divisible by PP ({pp}); "
                                                    f"{self._split_remedy(num_layers)}")]
        if (total // pp) % vpp:
            return [Violation((_VPP, _PP), f"layers per pipeline rank ({total // pp}) must be divisible by "
                                           f"VPP ({vpp})")]
        return []

    def _split_remedy(self, num_layers: int) -> str:
        """What would make `num_layers` split evenly over PP: counting the embedding and/or the loss
        as a layer (Megatron's account_for_*_in_pipeline_split), when one of those does, else uneven
        first/last stages."""
        options = [(e, l) for e in (False, True) for l in (False, True)
                   if (e, l) != (self.embedding_in_split, self.loss_in_split)
                   and (num_layers + e + l) % self.pp == 0 and (num_layers + e + l) // self.pp % self.vpp == 0]
        if not options:
            return "uneven first/last stages can take the remainder"
        e, l = min(options, key=lambda o: (o[0] != self.embedding_in_split) + (o[1] != self.loss_in_split))
        changes = ", ".join(f"{name}: {str(on).lower()}" for name, on, now in (
            ("account_for_embedding_in_pipeline_split", e, self.embedding_in_split),
            ("account_for_loss_in_pipeline_split", l, self.loss_in_split)) if on != now)
        return f"{changes} ({num_layers + e + l} layers counted) or uneven first/last stages would split it"

    # -- placement -------------------------------------------------------------------------------
    def stage_layers(self, num_layers: int) -> list[int]:
        """Transformer layers each pipeline stage builds (valid splits; others are approximated)."""
        pp = self.pp
        if pp == 1:
            return [num_layers]
        if self.first or self.last:
            middle_stages = pp - (1 if self.first else 0) - (1 if self.last else 0)
            middle = num_layers - (self.first or 0) - (self.last or 0)
            per = max(0, middle) // middle_stages if middle_stages else 0
            out = [per] * pp
            if self.first:
                out[0] = self.first
            if self.last:
                out[-1] = self.last
            return out
        total = num_layers + int(self.embedding_in_split) + int(self.loss_in_split)
        per = total // pp
        out = [per] * pp
        out[0] -= int(self.embedding_in_split)
        out[-1] -= int(self.loss_in_split)
        if sum(out) != num_layers:
            return self._balanced(num_layers)
        return [max(0, n) for n in out]

    def _balanced(self, num_layers: int) -> list[int]:
        """An invalid split read from a run that used a custom layout (--pipeline-model-parallel-layout):
        approximated as such layouts are written, as even as the count allows, with the extra layers
        on middle stages (the ends also hold the embedding and the loss)."""
        per, extra = divmod(num_layers, self.pp)
        order = list(range(1, self.pp - 1)) + [0, self.pp - 1]
        out = [per] * self.pp
        for stage in order[:extra]:
            out[stage] += 1
        return out

    def stage_layer_indices(self, num_layers: int) -> list[list[int]]:
        """The model's layer indices each stage builds, in order: contiguous blocks, or with VPP the
        chunks of the interleaved order (virtual stage j·PP + i on rank i)."""
        counts = self.stage_layers(num_layers)
        if self.vpp == 1:
            out, start = [], 0
            for n in counts:
                out.append(list(range(start, min(start + n, num_layers))))
                start += n
            return out
        chunks = [[n // self.vpp + (n % self.vpp if j == self.vpp - 1 else 0) for j in range(self.vpp)]
                  for n in counts]
        out = [[] for _ in counts]
        start = 0
        for j in range(self.vpp):
            for i in range(self.pp):
                out[i].extend(range(start, min(start + chunks[i][j], num_layers)))
                start += chunks[i][j]
        return out

    def infer_uneven(self, num_layers: int) -> tuple[int | None, int | None]:
        """(first, last) that make `num_layers` split over PP stages when it does not divide evenly:
        the middle stages take ceil(layers / PP) (rounded to VPP) and the end stages share the rest,
        the first the smaller part (it also holds the embedding and the most micro-batches in
        flight) — 61 layers on PP 8: middle 8, first 6, last 7. (None, None) when the split is even
        or no such pair exists."""
        pp, vpp = self.pp, self.vpp
        if pp == 1 or num_layers % pp == 0:
            return None, None
        if pp == 2:
            per = -(-num_layers // 2)
            first = (num_layers - per) // vpp * vpp
            return (first, num_layers - first) if first > 0 and (num_layers - first) % vpp == 0 else (None, None)
        middle = -(-num_layers // pp)
        middle += (-middle) % vpp
        for per in range(middle, 0, -vpp):
            rest = num_layers - per * (pp - 2)
            if rest < 2 * vpp:
                continue
            first = rest // 2 // vpp * vpp
            last = rest - first
            if first > 0 and last % vpp == 0:
                return first, last
        return None, None

    def infer_split(self, num_layers: int, allowed: set[str] | None = None) -> dict[str, int | bool]:
        """The knobs a run must have set when `num_layers` does not divide by PP: the embedding and
        the loss counted in the split when that makes it even (Megatron-Bridge's recipes for
        Llama 3.1 405B: 126 + 2 over PP 8 or 16), else one of them, else uneven first/last stages.
        {} when the split is even or nothing fits. `allowed` limits the knobs it may set."""
        if self.pp == 1 or not self.split_errors(num_layers):
            return {}
        ok = (lambda names: allowed is None or set(names) <= allowed)
        for emb, loss in ((True, True), (False, True), (True, False)):
            names = [n for n, on in (("account_for_embedding_in_pipeline_split", emb),
                                     ("account_for_loss_in_pipeline_split", loss)) if on]
            if not ok(names):
                continue
            counted = ParallelDims(self.world, self.tp, self.pp, self.cp, self.ep, self.etp, self.vpp,
                                   embedding_in_split=emb, loss_in_split=loss)
            if not counted.split_errors(num_layers):
                return {"account_for_embedding_in_pipeline_split": emb, "account_for_loss_in_pipeline_split": loss}
        first, last = self.infer_uneven(num_layers)
        if first is None or not ok(["decoder_first_pipeline_num_layers", "decoder_last_pipeline_num_layers"]):
            return {}
        return {"decoder_first_pipeline_num_layers": first, "decoder_last_pipeline_num_layers": last}

"""What a stage can physically reach: the bounds the cost model measures a job against.

A saving is only as honest as its bound. "The update at MFU 1.0" promises seconds no job gets
back; these tables say what dense training, decoding and CUDA graphs really reach, with the
public measurements behind each number (docs/diagnosis.md, "What fixing it is worth"):

- **Achievable MFU** of a BF16 dense update, by GPU generation and model size: MosaicML
  llm-foundry's benchmark table (scripts/train/benchmarking/README.md: H100 BF16 7B-70B
  36-46 %, 1B-3B 36-46 %, 760M 32-40 %; A100 7B-70B 47-64 %, 125M-3B 43-63 %), torchtitan's
  docs/performance.md (Llama 3.1 8B FSDP on H100 33-39 %, Llama 3 8B/70B FSDP2 on A100
  52-58 %), Meta's Llama 3 report (38-43 % on 16k H100). An RL update has shorter, ragged
  sequences than those pre-training runs, so the table takes their lower ends; MoE models
  reach about half (DeepSeek-V3 and Llama 4 report ~20 % of FP8 peak).
- **Achievable GPU activity while decoding**: 87 % GPM SM activity, the decode-like,
  memory-bound phase of verl-top's own H200 capture (tests/fixtures/h200/h200_phased_trace.jsonl,
  phase gen_decode_memory_bound); a rollout whose GPUs are less busy than that left time idle.
- **What CUDA graphs win** (enforce_eager=False): 10-15 % of generation for an 8B model
  (NVIDIA NeMo-RL PR #116; ~3 % at 4 nodes, PR #498), up to ~4x on small models and batches
  (torchtitan PR #2373: 3.84x; Project-MONAI VLM-Surgical-Agent-Framework issue #5: 4x).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_top.diagnosis.job import JobFacts
from verl_top.diagnosis.readable import number, pct

# MFU a dense BF16 update reaches: (GPU class, smallest model size in B) -> MFU, largest first.
MFU_TABLE: dict[str, tuple[tuple[float, float], ...]] = {
    "hopper": ((7.0, 0.40), (1.0, 0.35), (0.0, 0.25)),
    "blackwell": ((7.0, 0.40), (1.0, 0.35), (0.0, 0.25)),
    "ampere": ((7.0, 0.50), (1.0, 0.45), (0.0, 0.40)),
}
MOE_MFU = 0.20
MFU_SOURCE = "the lower end of the BF16 benchmarks of llm-foundry, torchtitan and Llama 3"
DECODE_ACTIVITY_PCT = 87.0
DECODE_SOURCE = "decode on verl-top's H200 capture keeps the SMs 87 % busy"
# Share of the generation time CUDA graphs can win, by model size (B); largest first.
GRAPH_SHARE: tuple[tuple[float, float], ...] = ((14.0, 0.10), (3.0, 0.15), (0.0, 0.50))
GRAPH_SHARE_UNKNOWN = 0.15
GRAPH_SOURCE = (
    "as measured: 10-15 % for 8B in NeMo-RL #116, up to 4x on small models in torchtitan #2373"
)
_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("blackwell", ("B200", "GB200", "B300", "GB300")),
    ("hopper", ("H100", "H200", "H800", "H20", "GH200")),
    ("ampere", ("A100", "A800")),
)


@dataclass(frozen=True)
class Bound:
    """An achievable value and the words that say where it comes from."""

    value: float
    basis: str


def gpu_class(device_names: list[str]) -> str | None:
    """``hopper`` / ``blackwell`` / ``ampere`` from the GPU names seen, else None."""
    joined = " ".join(device_names).upper()
    for cls, marks in _CLASSES:
        if any(m in joined for m in marks):
            return cls
    return None


def _size_row(table: tuple[tuple[float, float], ...], size: float) -> float:
    return next(v for lo, v in table if size >= lo)


def achievable_mfu(facts: JobFacts, device_names: list[str]) -> Bound:
    """The MFU an update of this model on this GPU can reach (a stated, sourced bound)."""
    cls = gpu_class(device_names)
    table = MFU_TABLE.get(cls or "hopper", MFU_TABLE["hopper"])
    where = f"a {cls.capitalize()} GPU" if cls else "an unseen GPU, Hopper figures"
    size = facts.model_params_b
    if facts.moe:
        return Bound(MOE_MFU, f"MFU ~{pct(MOE_MFU)} is achievable for a MoE model")
    if size is None:
        value, what = table[1][1], "a model of unknown size"
    else:
        value, what = _size_row(table, size), f"a {number(size)}B model"
    return Bound(value, f"MFU ~{pct(value)} is achievable for {what} on {where}, {MFU_SOURCE}")


def graph_share(facts: JobFacts) -> Bound:
    """The share of the rollout CUDA graphs can win for this model size."""
    size = facts.model_params_b
    share = GRAPH_SHARE_UNKNOWN if size is None else _size_row(GRAPH_SHARE, size)
    what = "a model of unknown size" if size is None else f"a {number(size)}B model"
    return Bound(
        share, f"{facts.graphs} win up to {pct(share)} of generation for {what}, {GRAPH_SOURCE}"
    )

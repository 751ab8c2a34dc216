"""The trace simulator's cost model: modelled seconds of one engine step on one GPU.

    compute_s = step_s + token_s * tokens + kv_bytes_read / attn_bandwidth
    copy_s    = max(host_load_bytes, host_store_bytes) / pcie_bandwidth
    step_s    = compute_s + max(0, copy_s - previous step's compute_s)

* ``step_s``: a fixed cost per step (launches, the host's scheduling, the sampler), whatever the batch.
* ``token_s``: the per-token cost of everything that does not read KV: the GEMMs (projections, the MoE
  experts, the output head) and the communication around them. It is the calibrated term (below).
* attention: each token reads, in every layer, its sliding window (``min(pos + 1, window)`` rows), and in
  a CSA layer the indexer's top-k compressed rows (``min(top_k, (pos + 1) // 4)``) plus every indexer key
  it scores (``(pos + 1) // 4`` keys), in an HCA layer every compressed row (``(pos + 1) // 128``).
  :class:`KvReads` counts those bytes (fp8 rows: 584 B main rows and 132 B keys on V4-Flash) exactly, by
  closed-form sums over the positions a step runs, and they cost ``bytes / attn_bandwidth``. So attention
  grows with context, bounded per row kind by the window and the top-k, except the indexer keys and
  the HCA rows, which grow linearly.
* host copies (the host tier): the step's loads (host -> device) and stores (device -> host) cross PCIe
  in both directions at once, each direction at ``pcie_bandwidth``. They run on a copy stream while the
  previous step computes; the step waits only for what is left.

Calibration (:data:`SGLANG_H200_FLASH_FP8`, :func:`calibrated`): SGLang's published DeepSeek-V4-Flash FP8
result on H200 (random 8,192 in / 1,024 out, concurrency 1024: 3,975 total tokens/s per GPU, TPOT
146.95 ms). Its tokens per step and GPU are throughput x TPOT (584); a request is 9,216 tokens, so it
costs 1 / (3,975 / 9,216) s of GPU time = ``9,216 / 584`` steps x ``step_s`` + 9,216 x ``token_s`` + its KV
reads / ``attn_bandwidth``. ``step_s`` (5 ms) and ``attn_bandwidth`` (3 TB/s: about 60% of the H200's
4.8 TB/s HBM, as a decode attention kernel reaches) are assumptions; ``token_s`` is solved from the
equation. See docs/simulation.md for the source and the numbers.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from atom.config import Dsv4KvSpec

__all__ = ["KvReads", "preset_reads", "CostModel", "PublishedRun", "SGLANG_H200_FLASH_FP8", "calibrated", "model_for",
           "ACTIVE_PARAMS", "StepClock"]


def _sum_floor(n: int, r: int) -> int:
    """sum of q // r for q = 1 .. n (0 for n <= 0)."""
    if n <= 0:
        return 0
    m = n // r
    return r * m * (m - 1) // 2 + m * (n - m * r + 1)


def _sum_capped_floor(n: int, r: int, cap: int) -> int:
    """sum of min(cap, q // r) for q = 1 .. n: q // r reaches cap at q = cap * r."""
    edge = cap * r - 1
    return _sum_floor(min(n, edge), r) + cap * max(0, n - edge)


def _sum_capped(n: int, cap: int) -> int:
    """sum of min(cap, q) for q = 1 .. n."""
    if n <= cap:
        return n * (n + 1) // 2 if n > 0 else 0
    return cap * (cap + 1) // 2 + cap * (n - cap)


@dataclass(frozen=True)
class KvReads:
    """The KV bytes a token at position ``pos`` reads over all layers (see the module doc)."""

    layers: int  # every layer has the sliding window (the MTP layer included)
    csa_layers: int
    hca_layers: int
    window: int
    top_k: int
    csa_ratio: int
    hca_ratio: int
    row_bytes: int
    key_bytes: int

    @classmethod
    def from_spec(cls, spec: Dsv4KvSpec, top_k: int) -> "KvReads":
        ratios = [r for r in spec.compress_ratios if r]
        csa = min(ratios) if ratios else 4
        hca = max(ratios) if ratios else 128
        return cls(spec.num_layers, len(spec.csa_layers), len(spec.hca_layers), spec.sliding_window, top_k, csa,
                   hca, spec.main_row_bytes, spec.index_row_bytes)

    def _prefix(self, n: int) -> int:
        """Bytes read by the tokens at positions 0 .. n-1 together."""
        rows = (self.layers * _sum_capped(n, self.window) + self.csa_layers * _sum_capped_floor(n, self.csa_ratio, self.top_k)
                + self.hca_layers * _sum_floor(n, self.hca_ratio))
        keys = self.csa_layers * _sum_floor(n, self.csa_ratio)
        return rows * self.row_bytes + keys * self.key_bytes

    def bytes_read(self, start: int, count: int) -> int:
        """Bytes read by the ``count`` tokens at positions ``start .. start + count - 1``."""
        if start < 0 or count < 0:
            raise ValueError(f"start={start} and count={count} must be >= 0")
        return self._prefix(start + count) - self._prefix(start)

    def at(self, pos: int) -> int:
        """Bytes read by the one token at ``pos``."""
        return self.bytes_read(pos, 1)


@functools.lru_cache(maxsize=4)
def preset_reads(preset: str) -> KvReads:
    """:class:`KvReads` of a bundled model preset (its KV spec and the indexer's top-k)."""
    from atom.models.deepseek_v4.config import DeepseekV4Config

    cfg = DeepseekV4Config.from_preset(preset)
    return KvReads.from_spec(cfg.kv_spec(), cfg.index_topk)


@dataclass(frozen=True)
class CostModel:
    """Modelled seconds of one step (module doc). ``kv=None`` leaves the attention term out."""

    step_s: float = 0.005
    token_s: float = 40e-6
    attn_bytes_per_s: float = 3.0e12
    pcie_bytes_per_s: float = 50e9
    kv: KvReads | None = None

    def __post_init__(self) -> None:
        for name in ("step_s", "token_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be >= 0")
        for name in ("attn_bytes_per_s", "pcie_bytes_per_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}={getattr(self, name)!r} must be > 0")

    def attention_s(self, spans: list[tuple[int, int]]) -> float:
        """Seconds of reading the KV of the tokens ``(start, count)`` of each scheduled request."""
        if self.kv is None:
            return 0.0
        return sum(self.kv.bytes_read(s, n) for s, n in spans) / self.attn_bytes_per_s

    def compute(self, tokens: int, spans: list[tuple[int, int]] | None = None) -> float:
        return self.step_s + self.token_s * tokens + self.attention_s(spans or [])

    def copy(self, load_bytes: int, store_bytes: int) -> float:
        return max(load_bytes, store_bytes) / self.pcie_bytes_per_s

    def step(self, tokens: int) -> float:
        """The step cost without attention or copies (the flat model's formula)."""
        return self.step_s + self.token_s * tokens


@dataclass(frozen=True)
class PublishedRun:
    """A published serving result the model is calibrated against (per GPU)."""

    source: str
    input_len: int
    output_len: int
    tokens_per_s_per_gpu: float
    tpot_s: float

    @property
    def tokens_per_step(self) -> float:
        """Tokens one GPU processed per decode step: throughput x time per output token."""
        return self.tokens_per_s_per_gpu * self.tpot_s


#: SGLang cookbook benchmark record: H200, DeepSeek-V4-Flash FP8, high-throughput recipe, one node,
#: sglang 0.5.15.post1, random ISL 8192 / OSL 1024, max concurrency 1024, cache flushed per run.
SGLANG_H200_FLASH_FP8 = PublishedRun("https://github.com/sgl-project/sglang/pull/31363", 8192, 1024, 3975.0,
                                     0.14695)


def calibrated(reads: KvReads, *, step_s: float = 0.005, attn_bytes_per_s: float = 3.0e12,
               pcie_bytes_per_s: float = 50e9, run: PublishedRun = SGLANG_H200_FLASH_FP8) -> CostModel:
    """The :class:`CostModel` whose ``token_s`` makes one request of ``run`` cost the GPU time the
    published throughput implies (module doc), given the assumed ``step_s`` and attention bandwidth."""
    tokens = run.input_len + run.output_len
    request_s = tokens / run.tokens_per_s_per_gpu
    steps = tokens / run.tokens_per_step
    attn = reads.bytes_read(0, tokens) / attn_bytes_per_s
    rest = request_s - steps * step_s - attn
    if rest <= 0:
        raise ValueError(f"step_s={step_s} and attention at {attn_bytes_per_s:.3g} B/s already exceed the "
                         f"{request_s:.3f} s a request of {run.source} takes; lower them")
    return CostModel(step_s, rest / tokens, attn_bytes_per_s, pcie_bytes_per_s, reads)


#: active parameters per token (DeepSeek's model cards: V4-Flash 13B of 284B, V4-Pro 49B of 1.6T)
ACTIVE_PARAMS = {"deepseek_v4_flash": 13e9, "deepseek_v4_pro": 49e9}
CALIBRATION_PRESET = "deepseek_v4_flash"


def model_for(preset: str, *, step_s: float = 0.005, token_s: float | None = None, attn_bytes_per_s: float = 3.0e12,
              pcie_bytes_per_s: float = 50e9) -> CostModel:
    """The cost model of ``preset``: its own KV reads; ``token_s`` given, or the V4-Flash calibration's
    scaled by the preset's active parameters over V4-Flash's (the GEMM work per token; an assumption for
    V4-Pro, which has no published figure of the same benchmark here)."""
    if token_s is None:
        flash = calibrated(preset_reads(CALIBRATION_PRESET), step_s=step_s, attn_bytes_per_s=attn_bytes_per_s)
        scale = ACTIVE_PARAMS.get(preset, ACTIVE_PARAMS[CALIBRATION_PRESET]) / ACTIVE_PARAMS[CALIBRATION_PRESET]
        token_s = flash.token_s * scale
    return CostModel(step_s, token_s, attn_bytes_per_s, pcie_bytes_per_s, preset_reads(preset))


class StepClock:
    """Turns each scheduled batch into modelled seconds, keeping the previous step's compute time (the
    window a host copy overlaps) and the host bytes moved."""

    def __init__(self, cost: CostModel, page_bytes: dict[str, int]) -> None:
        self.cost = cost
        self.page_bytes = page_bytes
        self.prev_compute = 0.0
        self.bytes_in = 0
        self.bytes_out = 0
        self.copy_wait_s = 0.0

    def _bytes(self, orders) -> int:
        return sum(len(o.src_pages) * self.page_bytes[o.owner] for o in orders)

    def step(self, batch) -> float:
        """Seconds of ``batch`` (a :class:`~atom.step_contract.ScheduledBatch`)."""
        spans = [(s.start_pos, s.num_tokens) for s in batch.seqs]
        compute = self.cost.compute(batch.num_tokens, spans)
        load, store = self._bytes(getattr(batch, "host_loads", ())), self._bytes(getattr(batch, "host_stores", ()))
        self.bytes_in += load
        self.bytes_out += store
        wait = max(0.0, self.cost.copy(load, store) - self.prev_compute)
        self.copy_wait_s += wait
        self.prev_compute = compute
        return compute + wait

"""Frozen configuration objects, validated on construction.

Each subsystem gets its own small config; a bad value raises ``ValueError`` naming the field, the
value and what is accepted. Values measured at run time (how many chunks the arena got) live in
result objects such as :class:`atom.kv.kv_layout.KvLayout`, never back in a config.

This module is pure Python (no torch): the control plane imports it.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atom.envs import AtomEnv
from atom.validation import require_int
from atom.kv_group import CSA_OVERLAP_ROWS, CSA_STATE_RING, HCA_STATE_ROWS, is_csa, is_hca

__all__ = [
    "KV_ROW_FORMATS",
    "KV_CACHE_DTYPES",
    "INDEX_FORMAT_OF",
    "Dsv4KvSpec",
    "CacheConfig",
    "HOST_KV_WRITE_POLICIES",
    "SchedulerConfig",
    "MAX_SPECULATIVE_TOKENS",
    "ModelConfig",
    "ParallelConfig",
    "EXECUTOR_BACKENDS",
    "EngineConfig",
    "load_hf_config",
    "preset_path",
]

#: Row formats the arena knows how to size. ``fp8_ds_mla`` is the production layout of DeepSeek-V4
#: (FP8-e4m3 NoPE + bf16 RoPE + ue8m0 scales per 64 NoPE values, padded to 8 bytes) with an FP8
#: indexer key plus one fp32 scale; ``bf16`` and ``fp32`` store plain rows (fp32 is what the CPU
#: reference engine runs).
KV_ROW_FORMATS = ("fp8_ds_mla", "bf16", "fp32")

#: Accepted ``ModelConfig.dtype`` / ``quant_sim`` values and the ``device`` pattern.
DTYPES = ("auto", "bfloat16", "float32", "float64")
QUANT_SIM = ("auto", "on", "off")
_DEVICE = re.compile(r"auto|cpu|(cuda|rocm)(:\d+)?")
#: Indexer-key format stored with each row format: ``fp8`` = index_head_dim e4m3 values + one fp32
#: power-of-two scale (132 B at index_head_dim 128).
INDEX_FORMAT_OF = {"fp8_ds_mla": "fp8", "bf16": "bf16", "fp32": "fp32"}

#: ``--kv-cache-dtype`` choices: ``auto`` (fp8 on a GPU for a quantized checkpoint, else fp32) or the
#: row format to store (``fp8`` = ``fp8_ds_mla`` rows with FP8 indexer keys).
KV_CACHE_DTYPES = ("auto", "fp8", "bf16", "fp32")

_FP32 = 4

#: The most drafts one step verifies per request (``SchedulerConfig.speculative_num_tokens``).
MAX_SPECULATIVE_TOKENS = 3


@dataclass(frozen=True)
class Dsv4KvSpec:
    """What DeepSeek-V4 keeps per token and per request, as the arena needs to size itself.

    The model's config declares it (``DeepseekV4Config.kv_spec``; the only parser of a Hugging Face
    ``config.json``); tests build toy specs directly.

    ``compress_ratios`` has one entry per *cached* layer (main layers, then MTP layers): 0 = SWA
    only, 4 = CSA (overlapping compressor + lightning indexer), anything else = HCA. Every layer
    has the sliding-window branch. ``block_size`` (tokens per logical block) must be a multiple of
    every non-zero ratio so that a block boundary is also a compression boundary; it defaults to
    their least common multiple. ``row_format`` names the main (SWA and compressed) rows; indexer keys
    use :data:`INDEX_FORMAT_OF` of it. ``fp8_block`` is the NoPE values per ue8m0 scale of an
    ``fp8_ds_mla`` row (the model's FP8 activation block, which the model declares); 0 = the
    model's rule: 64 as released, 8 when the NoPE width is not a multiple of 64.
    """

    compress_ratios: tuple[int, ...]
    sliding_window: int
    head_dim: int
    rope_head_dim: int
    index_head_dim: int
    row_format: str = "fp8_ds_mla"
    num_mtp_layers: int = 0
    block_size: int = 0  # 0 = the smallest valid multiple of the ratios' lcm
    fp8_block: int = 0  # 0 = 64, or 8 when head_dim - rope_head_dim is not a multiple of 64

    def __post_init__(self) -> None:
        ratios = tuple(self.compress_ratios)
        object.__setattr__(self, "compress_ratios", ratios)
        if not ratios:
            raise ValueError("compress_ratios is empty; give one ratio per layer (0, 4 or an HCA ratio)")
        for r in ratios:
            require_int("compress_ratios entry", r, 0)
        for name in ("sliding_window", "head_dim", "index_head_dim"):
            require_int(name, getattr(self, name), 1)
        require_int("rope_head_dim", self.rope_head_dim, 0)
        require_int("num_mtp_layers", self.num_mtp_layers, 0)
        require_int("block_size", self.block_size, 0)
        if self.rope_head_dim > self.head_dim:
            raise ValueError(f"rope_head_dim={self.rope_head_dim} exceeds head_dim={self.head_dim}")
        if self.row_format not in KV_ROW_FORMATS:
            raise ValueError(f"row_format={self.row_format!r}; accepted: {', '.join(KV_ROW_FORMATS)}")
        require_int("fp8_block", self.fp8_block, 0, note="0 = the model's rule")
        nope = self.head_dim - self.rope_head_dim
        if self.fp8_block == 0:
            object.__setattr__(self, "fp8_block", 64 if nope % 64 == 0 else 8)
        if self.row_format == "fp8_ds_mla":
            if nope % self.fp8_block or nope % 2:
                raise ValueError(f"fp8_ds_mla rows need an even NoPE width divisible by fp8_block={self.fp8_block}; "
                                 f"head_dim - rope_head_dim = {nope}")
            if self.index_head_dim % 4:
                raise ValueError(f"fp8 indexer keys need index_head_dim divisible by 4, got {self.index_head_dim}")
        if self.num_mtp_layers >= len(ratios):
            raise ValueError(f"num_mtp_layers={self.num_mtp_layers} leaves no main layer in {len(ratios)} ratios")
        lcm = self.ratio_lcm
        if self.block_size == 0:  # the smallest multiple of the lcm that the CSA rule below accepts
            floor = CSA_STATE_RING if any(is_csa(r) for r in ratios) else CSA_OVERLAP_ROWS
            object.__setattr__(self, "block_size", lcm * -(-floor // lcm))
        elif self.block_size % lcm:
            raise ValueError(f"block_size={self.block_size} must be a multiple of every compress ratio (lcm {lcm})")
        if any(is_csa(r) for r in ratios) and self.block_size < CSA_STATE_RING:
            raise ValueError(f"block_size={self.block_size} must be >= {CSA_STATE_RING} when CSA layers exist")

    # ---- layer classes ------------------------------------------------------------------------
    @property
    def ratio_lcm(self) -> int:
        return math.lcm(*[r for r in self.compress_ratios if r > 0] or [1])

    @property
    def num_layers(self) -> int:
        return len(self.compress_ratios)

    @property
    def csa_layers(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.compress_ratios) if is_csa(r))

    @property
    def hca_layers(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.compress_ratios) if is_hca(r))

    @property
    def compressed_layers(self) -> tuple[int, ...]:
        return tuple(i for i, r in enumerate(self.compress_ratios) if r > 0)

    # ---- row sizes (bytes) --------------------------------------------------------------------
    @property
    def main_row_bytes(self) -> int:
        """One SWA or compressed KV row of one layer."""
        if self.row_format == "fp8_ds_mla":  # fp8 NoPE | bf16 RoPE | one ue8m0 byte per block | pad to 8
            nope = self.head_dim - self.rope_head_dim
            raw = nope + 2 * self.rope_head_dim + nope // self.fp8_block
            return -(-raw // 8) * 8
        return self.head_dim * (2 if self.row_format == "bf16" else 4)

    @property
    def index_format(self) -> str:
        """Format of the indexer keys stored with these rows (``fp8`` / ``bf16`` / ``fp32``)."""
        return INDEX_FORMAT_OF[self.row_format]

    @property
    def index_row_bytes(self) -> int:
        """One lightning-indexer key row of one CSA layer."""
        if self.index_format == "fp8":  # e4m3 values | one fp32 scale
            return self.index_head_dim + _FP32
        return self.index_head_dim * (2 if self.index_format == "bf16" else 4)

    @property
    def csa_state_bytes(self) -> int:
        """The CSA boundary state of one c4 layer: 4 overlap rows of kv and score, main + indexer, fp32."""
        width = 2 * self.head_dim + 2 * self.index_head_dim
        return CSA_OVERLAP_ROWS * width * 2 * _FP32

    def compressor_state_bytes(self, layer: int) -> int:
        """Live compressor state of one request in one layer, fp32: CSA keeps a kv + score ring of
        8 rows (main and indexer compressors); HCA keeps an online softmax accumulator (running max,
        running sum of exp, running weighted sum: 3 rows of ``head_dim``)."""
        r = self.compress_ratios[layer]
        if r == 0:
            return 0
        if is_csa(r):
            return CSA_STATE_RING * (2 * self.head_dim + 2 * self.index_head_dim) * 2 * _FP32
        return HCA_STATE_ROWS * self.head_dim * _FP32

    @property
    def request_state_bytes(self) -> int:
        """Live compressor state of one request, all layers."""
        return sum(self.compressor_state_bytes(i) for i in range(self.num_layers))

    # ---- per-block sizes (bytes, exact, no padding) -------------------------------------------
    @property
    def swa_block_bytes(self) -> int:
        """One SWA block: B rows for every layer plus each c4 layer's CSA boundary state."""
        return self.block_size * self.main_row_bytes * self.num_layers + len(self.csa_layers) * self.csa_state_bytes

    def entries_per_block(self, layer: int) -> int:
        r = self.compress_ratios[layer]
        return self.block_size // r if r else 0

    @property
    def compressed_block_bytes(self) -> int:
        """One compressed block: the compressed rows (and indexer keys) of B tokens, every layer."""
        total = 0
        for layer in self.compressed_layers:
            per_entry = self.main_row_bytes
            if is_csa(self.compress_ratios[layer]):
                per_entry += self.index_row_bytes
            total += self.entries_per_block(layer) * per_entry
        return total

    @property
    def tail_blocks(self) -> int:
        """SWA blocks that hold the window before a block boundary (the W-1 previous rows)."""
        return max(1, math.ceil((self.sliding_window - 1) / self.block_size))


def load_hf_config(path: str | Path) -> dict[str, Any]:
    """Read a ``config.json`` (a file, or a directory holding one) with a clear error."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"no config.json at {p}")
    try:
        data = json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p} is not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p} must hold a JSON object, not {type(data).__name__}")
    return data


def preset_path(name: str) -> Path:
    """Path of a bundled published config: ``deepseek_v4_flash`` or ``deepseek_v4_pro``."""
    p = Path(__file__).parent / "configs" / f"{name}.json"
    if not p.is_file():
        known = sorted(q.stem for q in p.parent.glob("*.json"))
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(known)}")
    return p


@dataclass(frozen=True)
class SchedulerConfig:
    """Token-budget scheduling limits; the arena sizing reads ``max_num_seqs`` (one live
    compressor-state slot each) and ``max_model_len`` (one request of that length must fit).
    ``speculative_num_tokens``: drafts verified per decoding request and step (0 = off, at most
    :data:`MAX_SPECULATIVE_TOKENS`). ``overlap``: schedule the next step while the runner's step runs
    (the engine applies the running step's tokens when they arrive; the outputs are those of the
    sequential loop); steps with speculative decoding never overlap."""

    max_num_batched_tokens: int = 2048
    max_num_seqs: int = 64
    max_model_len: int = 4096  # at least 2: one prompt token and one generated token
    speculative_num_tokens: int = 0
    overlap: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.overlap, bool):
            raise ValueError(f"overlap={self.overlap!r}; accepted: True or False")
        require_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        require_int("max_num_seqs", self.max_num_seqs, 1)
        require_int("max_model_len", self.max_model_len, 2)
        require_int("speculative_num_tokens", self.speculative_num_tokens, 0, MAX_SPECULATIVE_TOKENS, note="0 = off")


HOST_KV_WRITE_POLICIES = ("back", "through")  # when the host tier copies a block (CacheConfig)


@dataclass(frozen=True)
class CacheConfig:
    """How the KV arena is sized and how the prefix cache behaves.

    ``kv_cache_bytes`` is the byte budget of the arena plus the live compressor-state pool.
    ``block_size`` 0 means the model's own (the smallest valid multiple of its compress ratios' lcm). ``chunk_pages`` = SWA
    blocks per arena chunk (0 = choose the smallest that packs compressed blocks at
    ``packing_target`` efficiency or better, trying up to ``max_chunk_pages``). Retention settings
    come from the environment through :meth:`from_env` (``ATOM_SWA_FULL_RETAIN``,
    ``ATOM_SWA_RETENTION_INTERVAL``, ``ATOM_SWA_PIN_FRACTION``) and are plain fields afterwards.
    ``kv_cache_dtype`` picks the row format stored in the arena (:data:`KV_CACHE_DTYPES`).
    ``gpu_memory_utilization`` (a fraction in (0, 1], None = off): on a GPU, size the arena from what the
    device has left after the weights and a profiled step (``atom/model_executor/memory_profile.py``)
    instead of ``kv_cache_bytes``.
    ``host_kv_cache_bytes`` (0 = off): the host-memory tier under the arena (``atom/kv/host_pool.py``):
    published blocks the arena evicts are written back there and restored on a later hit
    (``docs/prefix_cache.md``); it holds whole chunks of the arena's geometry, so it needs at least one.
    ``host_kv_write_policy``: ``back`` (copy a block to the host when the arena evicts it) or ``through``
    (also copy a block as soon as a prefix hit claims it for the ``host_kv_write_through_hits``-th time, so
    the blocks reused most are already on the host when the arena evicts them).
    """

    kv_cache_bytes: int = 1 << 30
    block_size: int = 0
    enable_prefix_caching: bool = True
    swa_full_retain: bool = False
    swa_retention_interval: int = 0
    swa_pin_fraction: float = 0.25
    chunk_pages: int = 0
    packing_target: float = 0.985
    max_chunk_pages: int = 8
    kv_cache_dtype: str = "auto"
    gpu_memory_utilization: float | None = None
    host_kv_cache_bytes: int = 0
    host_kv_write_policy: str = "back"
    host_kv_write_through_hits: int = 2

    def __post_init__(self) -> None:
        require_int("kv_cache_bytes", self.kv_cache_bytes, 1)
        require_int("host_kv_cache_bytes", self.host_kv_cache_bytes, 0, note="0 = no host tier")
        if self.host_kv_write_policy not in HOST_KV_WRITE_POLICIES:
            raise ValueError(f"host_kv_write_policy={self.host_kv_write_policy!r}; accepted: "
                             f"{', '.join(HOST_KV_WRITE_POLICIES)}")
        require_int("host_kv_write_through_hits", self.host_kv_write_through_hits, 1)
        if self.host_kv_cache_bytes and not self.enable_prefix_caching:
            raise ValueError(f"host_kv_cache_bytes={self.host_kv_cache_bytes} keeps evicted prefix blocks, which "
                             "needs prefix caching; turn it on, or give 0 host bytes")
        f = self.gpu_memory_utilization
        if f is not None and (isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0):
            raise ValueError(f"gpu_memory_utilization={f!r} must be a fraction in (0, 1] (or None: size the arena "
                             "with kv_cache_bytes)")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype={self.kv_cache_dtype!r}; accepted: {', '.join(KV_CACHE_DTYPES)}")
        require_int("block_size", self.block_size, 0, note="0 = the model's own")
        require_int("swa_retention_interval", self.swa_retention_interval, 0)
        require_int("chunk_pages", self.chunk_pages, 0, note="0 = choose")
        require_int("max_chunk_pages", self.max_chunk_pages, 1)
        if not 0.0 < self.swa_pin_fraction <= 1.0:
            raise ValueError(f"swa_pin_fraction={self.swa_pin_fraction} must be in (0, 1]")
        if not 0.0 < self.packing_target <= 1.0:
            raise ValueError(f"packing_target={self.packing_target} must be in (0, 1]")
        if self.swa_retention_interval and not self.swa_full_retain:
            raise ValueError(
                f"swa_retention_interval={self.swa_retention_interval} needs swa_full_retain "
                "(ATOM_SWA_RETENTION_INTERVAL only applies with ATOM_SWA_FULL_RETAIN=1)")

    @classmethod
    def from_env(cls, env: AtomEnv, **fields_: Any) -> "CacheConfig":
        """Fill the retention fields from the parsed environment; other fields from ``fields_``."""
        return cls(swa_full_retain=env.swa_full_retain,
                   swa_retention_interval=env.swa_retention_interval,
                   swa_pin_fraction=env.swa_pin_fraction, **fields_)


@dataclass(frozen=True)
class ModelConfig:
    """Which model to serve and under which name.

    ``path`` is a checkpoint directory (``config.json`` + safetensors + ``tokenizer.json``), a Hugging
    Face repo id (downloaded with ``huggingface_hub``), or None for the built-in tiny DeepSeek-V4 model.
    ``seed`` seeds the runner's sampler. ``device``: ``auto`` (a CUDA/ROCm GPU when one is visible,
    else ``cpu``), ``cpu``, ``cuda[:N]`` or ``rocm[:N]``. ``dtype`` of activations and unquantized
    weights: ``auto`` (bfloat16 on a GPU, float32 on the CPU), ``bfloat16``, ``float32`` or ``float64``
    (CPU only: a verification mode that carries activations in double precision; what the model computes
    in fp32, such as attention scores, the compressor and mHC, stays fp32).
    ``quant_sim``: ``auto`` (on when the checkpoint declares a ``quantization_config``), ``on`` or
    ``off``: the FP8/FP4 round trips of the release (KV rows, indexer, inputs of quantized GEMMs).
    ``enforce_eager``: never replay decode steps from CUDA graphs (on a GPU they are captured per
    batch-size bucket by default; on the CPU every step runs eagerly whatever this says).
    """

    path: str | None = None
    served_model_name: str | None = None
    seed: int = 0
    device: str = "auto"
    dtype: str = "auto"
    quant_sim: str = "auto"
    enforce_eager: bool = False

    def __post_init__(self) -> None:
        require_int("seed", self.seed, 0)
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager={self.enforce_eager!r}; accepted: True or False")
        if self.path is not None and not str(self.path).strip():
            raise ValueError("model must be a checkpoint directory, a Hugging Face repo id, or None (the built-in "
                             "tiny model)")
        if not _DEVICE.fullmatch(str(self.device)):
            raise ValueError(f"device={self.device!r}; accepted: auto, cpu, cuda, cuda:N, rocm, rocm:N")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}; accepted: {', '.join(DTYPES)}")
        if self.quant_sim not in QUANT_SIM:
            raise ValueError(f"quant_sim={self.quant_sim!r}; accepted: {', '.join(QUANT_SIM)}")


#: How the ranks of a parallel run are started: ``mp`` = ``atom serve`` spawns its own workers on
#: this machine; ``external_launcher`` = every rank is started by ``torchrun`` (multi-node).
EXECUTOR_BACKENDS = ("mp", "external_launcher")


@dataclass(frozen=True)
class ParallelConfig:
    """How the model is split across ranks (``docs/parallelism.md``).

    ``tensor_parallel_size`` ranks split the query heads, output groups, vocabulary and experts;
    ``data_parallel_size`` attention replicas of ``tensor_parallel_size`` ranks each (``world_size`` =
    their product) each run their own requests over their own arena, while the routed experts are
    split over all ``world_size`` ranks;
    ``enable_expert_parallel`` partitions the routed experts whole instead of splitting each one;
    ``replicate_attention`` keeps the whole attention on every rank (heads not split) while the
    experts and the vocabulary are still split; ``distributed_executor_backend`` says who starts
    the ranks (:data:`EXECUTOR_BACKENDS`).
    """

    tensor_parallel_size: int = 1
    enable_expert_parallel: bool = False
    replicate_attention: bool = False
    distributed_executor_backend: str = "mp"
    data_parallel_size: int = 1

    def __post_init__(self) -> None:
        require_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        require_int("data_parallel_size", self.data_parallel_size, 1)
        for name in ("enable_expert_parallel", "replicate_attention"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be True or False")
        if self.distributed_executor_backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend={self.distributed_executor_backend!r}; "
                             f"accepted: {', '.join(EXECUTOR_BACKENDS)}")

    @property
    def world_size(self) -> int:
        """Ranks in the group: ``data_parallel_size`` replicas of ``tensor_parallel_size`` ranks."""
        return self.tensor_parallel_size * self.data_parallel_size

    def replica_of(self, rank: int) -> int:
        """The attention replica rank ``rank`` belongs to (replica ``d`` = ranks ``d*T .. d*T+T-1``)."""
        require_int("rank", rank, 0)
        if rank >= self.world_size:
            raise ValueError(f"rank={rank} is outside a group of {self.world_size} ranks")
        return rank // self.tensor_parallel_size


@dataclass(frozen=True)
class EngineConfig:
    """Everything ``atom serve`` / ``build_engine`` needs; the only config the CLI builds.

    It composes one config per subsystem and copies none of their fields: each subsystem receives
    its own part (the scheduler ``scheduler``, the block manager and the layout ``cache``, the
    loader ``model``).
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)

    def __post_init__(self) -> None:
        for name, kind in (("model", ModelConfig), ("scheduler", SchedulerConfig), ("cache", CacheConfig),
                           ("parallel", ParallelConfig)):
            if not isinstance(getattr(self, name), kind):
                raise ValueError(f"{name}={getattr(self, name)!r} must be a {kind.__name__}")

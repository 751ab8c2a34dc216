"""DeepSeek-V4 model configuration.

``DeepseekV4Config`` is a frozen dataclass whose field names follow the official ``ModelArgs``.  It can be built
from a Hugging Face ``config.json`` dict (``from_hf_dict``; key names per dsv4_checkpoint_format.md section 5, with
the official ``ModelArgs`` name accepted as a fallback for every key) or from the built-in ``tiny()`` preset used
by tests and by the server's default model.

Two fields are runtime numerics options rather than architecture: ``quant_sim`` (simulate the FP8 / FP4
round-trips of the released model on activations) and ``batch_invariant`` (run every token-local op one token at
a time so a token's result does not depend on how many tokens share the call; makes prefill-then-decode bit-exact;
in the serving model also attention over fixed key blocks, ``atom/kernels/key_blocks.py``, since a decode step's
index lists are as wide as its widest request and whole-list reductions round by that width).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from atom.config import Dsv4KvSpec, load_hf_config, preset_path

_SCORE_FUNCS = ("sqrtsoftplus", "softmax", "sigmoid")

# (field, HF key, official ModelArgs key); required unless it appears in _OPTIONAL.
_KEYS: tuple[tuple[str, str, str], ...] = (
    ("vocab_size", "vocab_size", "vocab_size"),
    ("dim", "hidden_size", "dim"),
    ("moe_inter_dim", "moe_intermediate_size", "moe_inter_dim"),
    ("n_layers", "num_hidden_layers", "n_layers"),
    ("n_hash_layers", "num_hash_layers", "n_hash_layers"),
    ("n_mtp_layers", "num_nextn_predict_layers", "n_mtp_layers"),
    ("n_heads", "num_attention_heads", "n_heads"),
    ("n_routed_experts", "n_routed_experts", "n_routed_experts"),
    ("n_shared_experts", "n_shared_experts", "n_shared_experts"),
    ("n_activated_experts", "num_experts_per_tok", "n_activated_experts"),
    ("score_func", "scoring_func", "score_func"),
    ("route_scale", "routed_scaling_factor", "route_scale"),
    ("swiglu_limit", "swiglu_limit", "swiglu_limit"),
    ("head_dim", "head_dim", "head_dim"),
    ("rope_head_dim", "qk_rope_head_dim", "rope_head_dim"),
    ("norm_eps", "rms_norm_eps", "norm_eps"),
    ("o_groups", "o_groups", "o_groups"),
    ("o_lora_rank", "o_lora_rank", "o_lora_rank"),
    ("q_lora_rank", "q_lora_rank", "q_lora_rank"),
    ("window_size", "sliding_window", "window_size"),
    ("compress_ratios", "compress_ratios", "compress_ratios"),
    ("compress_rope_theta", "compress_rope_theta", "compress_rope_theta"),
    ("rope_theta", "rope_theta", "rope_theta"),
    ("index_n_heads", "index_n_heads", "index_n_heads"),
    ("index_head_dim", "index_head_dim", "index_head_dim"),
    ("index_topk", "index_topk", "index_topk"),
    ("hc_mult", "hc_mult", "hc_mult"),
    ("hc_sinkhorn_iters", "hc_sinkhorn_iters", "hc_sinkhorn_iters"),
    ("hc_eps", "hc_eps", "hc_eps"),
)
_OPTIONAL = {"norm_eps": 1e-6, "hc_eps": 1e-6, "hc_sinkhorn_iters": 20}


@dataclass(frozen=True)
class DeepseekV4Config:
    """Hyper-parameters of one DeepSeek-V4 model (official ``ModelArgs`` names).

    ``compress_ratios`` has ``n_layers + n_mtp_layers`` entries: 0 = sliding window only, 4 = CSA (overlapping
    compressor + lightning indexer), any other positive value = HCA.  The MTP entry must be 0.
    ``original_seq_len == 0`` means "no YaRN" for the compressed layers.
    """

    vocab_size: int
    dim: int
    moe_inter_dim: int
    n_layers: int
    n_hash_layers: int
    n_mtp_layers: int
    n_heads: int
    n_routed_experts: int
    n_shared_experts: int
    n_activated_experts: int
    score_func: str
    route_scale: float
    swiglu_limit: float
    head_dim: int
    rope_head_dim: int
    o_groups: int
    o_lora_rank: int
    q_lora_rank: int
    window_size: int
    compress_ratios: tuple[int, ...]
    compress_rope_theta: float
    rope_theta: float
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    hc_mult: int
    norm_eps: float = 1e-6
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    original_seq_len: int = 0
    rope_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    scale_fmt: str = "ue8m0"
    quant_sim: bool = False
    batch_invariant: bool = False
    extra: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compress_ratios", tuple(int(r) for r in self.compress_ratios))
        for name in ("vocab_size", "dim", "moe_inter_dim", "n_layers", "n_heads", "n_routed_experts",
                     "n_activated_experts", "head_dim", "rope_head_dim", "o_groups", "o_lora_rank",
                     "q_lora_rank", "window_size", "index_n_heads", "index_head_dim", "index_topk",
                     "hc_mult", "hc_sinkhorn_iters"):
            value = getattr(self, name)
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
            self._check(ok, name, value, "must be a positive int")
        for name in ("n_hash_layers", "n_mtp_layers"):
            value = getattr(self, name)
            self._check(isinstance(value, int) and value >= 0, name, value, "must be a non-negative int")
        self._check(self.n_mtp_layers <= 1, "n_mtp_layers", self.n_mtp_layers, "at most 1 MTP layer is supported")
        self._check(self.n_shared_experts == 1, "n_shared_experts", self.n_shared_experts, "must be 1")
        self._check(self.n_activated_experts <= self.n_routed_experts, "n_activated_experts",
                    self.n_activated_experts, f"must be <= n_routed_experts={self.n_routed_experts}")
        self._check(self.score_func in _SCORE_FUNCS, "score_func", self.score_func, f"must be one of {_SCORE_FUNCS}")
        self._check(self.rope_head_dim % 2 == 0 and self.rope_head_dim < self.head_dim, "rope_head_dim",
                    self.rope_head_dim, f"must be even and < head_dim={self.head_dim}")
        self._check(self.rope_head_dim <= self.index_head_dim, "index_head_dim", self.index_head_dim,
                    f"must be >= rope_head_dim={self.rope_head_dim}")
        self._check((self.n_heads * self.head_dim) % self.o_groups == 0, "o_groups", self.o_groups,
                    f"must divide n_heads*head_dim={self.n_heads * self.head_dim}")
        n_total = self.n_layers + self.n_mtp_layers
        self._check(len(self.compress_ratios) == n_total, "compress_ratios", list(self.compress_ratios),
                    f"expected num_hidden_layers + num_nextn_predict_layers = {n_total} entries")
        self._check(all(r >= 0 for r in self.compress_ratios), "compress_ratios", list(self.compress_ratios),
                    "entries must be >= 0")
        self._check(all(r == 0 for r in self.compress_ratios[self.n_layers:]), "compress_ratios",
                    list(self.compress_ratios), "the MTP entries must be 0 (MTP is sliding-window only)")
        self._check(self.n_hash_layers <= self.n_layers, "n_hash_layers", self.n_hash_layers,
                    f"must be <= n_layers={self.n_layers}")
        for name in ("route_scale", "norm_eps", "hc_eps", "rope_theta", "compress_rope_theta", "rope_factor"):
            value = getattr(self, name)
            self._check(isinstance(value, (int, float)) and value > 0, name, value, "must be > 0")
        self._check(self.original_seq_len >= 0, "original_seq_len", self.original_seq_len, "must be >= 0")
        self._check(self.scale_fmt in ("ue8m0", "none", None), "scale_fmt", self.scale_fmt, "must be ue8m0")

    @staticmethod
    def _check(ok: bool, name: str, value: Any, why: str) -> None:
        if not ok:
            raise ValueError(f"DeepseekV4Config.{name}={value!r}: {why}")

    # ----- derived values -----------------------------------------------------------------------------------------
    @property
    def nope_dim(self) -> int:
        """Head dims without RoPE (the FP8-round-tripped part of a KV row)."""
        return self.head_dim - self.rope_head_dim

    @property
    def n_blocks(self) -> int:
        """Main layers plus MTP layers."""
        return self.n_layers + self.n_mtp_layers

    @property
    def fp8_block(self) -> int:
        """Activation FP8 block: 64 as released, 8 when the NoPE width is not a multiple of 64 (tiny models)."""
        return 64 if self.nope_dim % 64 == 0 else 8

    @property
    def fp4_block(self) -> int:
        """Indexer FP4 block: 32 as released, 8 when index_head_dim is not a multiple of 32."""
        return 32 if self.index_head_dim % 32 == 0 else 8

    def ratio(self, layer_id: int) -> int:
        """Compression ratio of block ``layer_id`` (MTP blocks follow the main layers)."""
        return self.compress_ratios[layer_id]

    def kv_spec(self, row_format: str = "fp8_ds_mla", *, include_mtp: bool = True, block_size: int = 0) -> Dsv4KvSpec:
        """What this model keeps per token and per request, for the KV arena to size itself from.

        ``include_mtp=False`` leaves out the MTP layers' sliding-window cache (an engine that does not
        run MTP). ``block_size`` 0 = the lcm of the compress ratios. ``fp8_ds_mla`` rows scale NoPE values
        per :attr:`fp8_block`, the block of this model's ``quant_sim`` KV round-trip, so stored rows equal
        the reference's.
        """
        n = self.n_blocks if include_mtp else self.n_layers
        return Dsv4KvSpec(compress_ratios=self.compress_ratios[:n], sliding_window=self.window_size,
                          head_dim=self.head_dim, rope_head_dim=self.rope_head_dim,
                          index_head_dim=self.index_head_dim, row_format=row_format,
                          num_mtp_layers=self.n_mtp_layers if include_mtp else 0, block_size=block_size,
                          fp8_block=self.fp8_block)

    # ----- constructors -------------------------------------------------------------------------------------------
    @classmethod
    def from_hf_dict(cls, d: dict[str, Any], **overrides: Any) -> "DeepseekV4Config":
        """Build from a Hugging Face ``config.json`` dict.

        Each field is read from its HF key, falling back to the official ``ModelArgs`` key.  A missing required key
        raises ``ValueError`` naming it.  ``rope_scaling`` must be absent or of type yarn.  ``overrides`` set
        runtime options such as ``quant_sim`` or ``batch_invariant``.
        """
        kwargs: dict[str, Any] = {}
        for fname, hf_key, args_key in _KEYS:
            if hf_key in d:
                kwargs[fname] = d[hf_key]
            elif args_key in d:
                kwargs[fname] = d[args_key]
            elif fname in _OPTIONAL:
                kwargs[fname] = _OPTIONAL[fname]
            else:
                raise ValueError(f"config.json is missing required key {hf_key!r} (or {args_key!r})")
        scaling = d.get("rope_scaling")
        if scaling:
            kind = scaling.get("type", scaling.get("rope_type", "yarn"))
            if kind != "yarn":
                raise ValueError(f"config.json rope_scaling.type={kind!r} is not supported (only 'yarn')")
            kwargs["original_seq_len"] = int(scaling.get("original_max_position_embeddings", 0))
            kwargs["rope_factor"] = float(scaling.get("factor", 1.0))
            kwargs["beta_fast"] = float(scaling.get("beta_fast", 32.0))
            kwargs["beta_slow"] = float(scaling.get("beta_slow", 1.0))
        else:
            for key in ("original_seq_len", "rope_factor", "beta_fast", "beta_slow"):
                if key in d:
                    kwargs[key] = d[key]
        qc = d.get("quantization_config") or {}
        if "scale_fmt" in qc:
            kwargs["scale_fmt"] = qc["scale_fmt"]
        kwargs["extra"] = {k: d[k] for k in ("quantization_config", "expert_dtype", "torch_dtype") if k in d}
        kwargs.update(overrides)
        return cls(**kwargs)

    @classmethod
    def from_preset(cls, name: str, **overrides: Any) -> "DeepseekV4Config":
        """A bundled published config: ``deepseek_v4_flash`` or ``deepseek_v4_pro``."""
        return cls.from_hf_dict(load_hf_config(preset_path(name)), **overrides)

    def to_hf_dict(self) -> dict[str, Any]:
        """The inverse of ``from_hf_dict`` (HF key names); used to write tiny checkpoints."""
        out: dict[str, Any] = {"architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4"}
        for fname, hf_key, _ in _KEYS:
            value = getattr(self, fname)
            out[hf_key] = list(value) if isinstance(value, tuple) else value
        out["num_key_value_heads"] = 1
        if self.original_seq_len > 0:
            out["rope_scaling"] = {"type": "yarn", "factor": self.rope_factor,
                                   "original_max_position_embeddings": self.original_seq_len,
                                   "beta_fast": self.beta_fast, "beta_slow": self.beta_slow}
        out.update(self.extra)
        return out

    @classmethod
    def tiny(cls, **overrides: Any) -> "DeepseekV4Config":
        """The tiny test preset of dsv4_model.md section 6 (6 layers + 1 MTP, Flash-like ratios, fp32-friendly)."""
        base: dict[str, Any] = dict(
            vocab_size=512, dim=64, moe_inter_dim=32, n_layers=6, n_hash_layers=2, n_mtp_layers=1, n_heads=4,
            n_routed_experts=8, n_shared_experts=1, n_activated_experts=2, score_func="sqrtsoftplus",
            route_scale=1.5, swiglu_limit=10.0, head_dim=32, rope_head_dim=8, o_groups=2, o_lora_rank=16,
            q_lora_rank=32, window_size=8, compress_ratios=(0, 4, 16, 4, 16, 4, 0), compress_rope_theta=160000.0,
            rope_theta=10000.0, index_n_heads=4, index_head_dim=16, index_topk=3, hc_mult=4,
            hc_sinkhorn_iters=20, hc_eps=1e-6, norm_eps=1e-6, original_seq_len=65536, rope_factor=16.0,
            beta_fast=32.0, beta_slow=1.0,
        )
        base.update(overrides)
        return cls(**base)

    def replace(self, **changes: Any) -> "DeepseekV4Config":
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

"""Time and memory of a streamed checkpoint load: resident bytes vs bytes on disk, peak RSS, and load time
against a plain ``safetensors`` read of the same files.

``python -m atom.bench.load [--experts E] [--dim D] [--shard-mib S] [--dtype bfloat16|float32] [--dir DIR]``
``python -m atom.bench.load --tensors N [--shards S] [--dim D]`` (many tensors per shard)

Writes a DeepSeek-V4 checkpoint in the release layout (FP8 linears, MXFP4 routed experts, BF16 / F32 rest, MTP
block) with the tiny model's depth scaled up in width and expert count, then loads it in a fresh process with
:func:`atom.models.deepseek_v4.loader.load_checkpoint` and prints

* ``disk``: tensor bytes in the safetensors files (headers excluded) and the files' sizes;
* ``resident``: bytes of every parameter and buffer of the loaded model (quantized weights stay quantized);
* ``peak RSS over the start``: the process's high-water mark (``VmHWM``) minus its RSS just before loading,
  against the target ``resident + 2 x largest tensor``;
* ``load time`` (wall and CPU) next to a plain sequential read of the same files (``safe_open`` once per file,
  ``get_tensor`` and a copy into process memory for every tensor, nothing else; timed after the load, in the same
  process) and their ratio (target <= 2).  On a shared machine the CPU ratio is the steadier one.

By default the shards are ``--shard-mib`` large.  ``--tensors N`` instead picks the expert count that gives at
least ``N`` tensors and splits them over ``--shards`` files of equal tensor counts: the case where a loader's
per-tensor cost (an open or a header parse per tensor) shows.  The tensor values are random bit patterns of the
right formats (a load does not look at them), so writing a few GiB is quick.  Run on the CPU; ``--dtype
bfloat16`` is what a GPU load keeps for the dense weights.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator

import torch

from atom.models.deepseek_v4.checkpoint import hf_config, release_format, stored_dtype, write_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.model import DeepseekV4Model

GIB = 2**30


def scaled_config(dim: int, experts: int) -> DeepseekV4Config:
    """The tiny model's 6 + 1 blocks and ratios at width ``dim`` with ``experts`` routed experts."""
    return DeepseekV4Config.tiny(vocab_size=16 * dim, dim=dim, moe_inter_dim=dim, n_routed_experts=experts,
                                 n_activated_experts=min(6, experts), n_heads=8, head_dim=128, rope_head_dim=64,
                                 o_groups=4, o_lora_rank=dim // 4, q_lora_rank=dim // 2, index_n_heads=8,
                                 index_head_dim=64, window_size=128)


def tensor_count(cfg: DeepseekV4Config) -> int:
    """Tensors in the release-format checkpoint of ``cfg`` (a quantized weight and its scale count as two)."""
    names = DeepseekV4Model(cfg, device="meta").state_dict()
    return sum(2 if release_format(n, fp8=True, fp4_experts=True) != "dense" else 1 for n in names)


def many_tensor_config(tensors: int, dim: int) -> DeepseekV4Config:
    """``scaled_config(dim, E)`` with the fewest routed experts E (at least 8) that give ``tensors`` tensors or more;
    each expert adds the same number of tensors, so two counts give E."""
    low, high = tensor_count(scaled_config(dim, 8)), tensor_count(scaled_config(dim, 9))
    experts = 8 + max(0, -(-(tensors - low) // (high - low)))
    return scaled_config(dim, experts)


def synthetic_tensors(cfg: DeepseekV4Config) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of ``cfg`` encoded as the release stores it, with random bits of the right format."""
    gen = torch.Generator().manual_seed(0)
    shapes = {k: tuple(v.shape) for k, v in DeepseekV4Model(cfg, device="meta").state_dict().items()}
    for name in sorted(shapes):
        n_out, n_in = (shapes[name] + (1,))[:2]
        fmt = release_format(name, fp8=True, fp4_experts=True)
        scale_name = name[: -len("weight")] + "scale"
        if fmt == "mxfp4":
            yield name, torch.randint(-128, 128, (n_out, n_in // 2), generator=gen, dtype=torch.int8)
            yield scale_name, _e8m0((n_out, n_in // 32), gen)
        elif fmt == "fp8":  # e4m3 bytes without the NaN patterns 0x7f / 0xff
            q = torch.randint(0, 0x7F, (n_out, n_in), generator=gen, dtype=torch.uint8)
            yield name, q.view(torch.float8_e4m3fn)
            yield scale_name, _e8m0((-(-n_out // 128), -(-n_in // 128)), gen)
        elif name.endswith("tid2eid"):
            yield name, torch.randint(0, cfg.n_routed_experts, shapes[name], generator=gen, dtype=torch.int64)
        else:
            yield name, (torch.randn(shapes[name], generator=gen) * 0.02).to(stored_dtype(name))


def _e8m0(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return torch.randint(115, 125, shape, generator=gen, dtype=torch.uint8).view(torch.float8_e8m0fnu)


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"{key} not in /proc/self/status")


def measure(directory: Path, dtype: torch.dtype) -> dict:
    """Load ``directory`` in this process and report bytes and peak RSS (call in a fresh process)."""
    from atom.models.deepseek_v4.loader import CheckpointIndex, load_checkpoint

    index = CheckpointIndex(directory)
    largest = max(e.nbytes for e in index.entries.values())
    before = _status_kib("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    model = load_checkpoint(directory, dtype=dtype, device="cpu")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = _status_kib("VmHWM") - before
    resident = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    del model
    plain, plain_cpu = plain_read_seconds(index.files)
    return {"disk_tensor_bytes": index.nbytes, "disk_file_bytes": sum(f.stat().st_size for f in index.files),
            "shards": len(index.files), "tensors": len(index.entries), "resident_bytes": resident,
            "largest_tensor_bytes": largest, "peak_rss_over_start": peak, "load_seconds": round(seconds, 3),
            "load_cpu_seconds": round(cpu, 3), "plain_read_seconds": round(plain, 3),
            "plain_read_cpu_seconds": round(plain_cpu, 3)}


def plain_read_seconds(files: list[Path]) -> tuple[float, float]:
    """(wall, CPU) seconds to read every tensor of ``files`` with ``safetensors`` alone: each file opened once,
    tensors in header order, each copied out of the file mapping and kept until the end, as a load keeps them.

    ``get_tensor`` only maps the file (no byte is read until one is touched), hence the copy; dropping each copy
    would let the allocator hand the same pages back for the next tensor, skipping the cost of fresh memory
    that a load pays."""
    from safetensors import safe_open

    kept: list[torch.Tensor] = []
    start, cpu = time.perf_counter(), time.process_time()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            kept.extend(f.get_tensor(name).clone() for name in f.keys())
    return time.perf_counter() - start, time.process_time() - cpu


def report(r: dict) -> str:
    budget = r["resident_bytes"] + 2 * r["largest_tensor_bytes"]
    ratio = r["resident_bytes"] / r["disk_tensor_bytes"]
    speed = r["load_seconds"] / max(r["plain_read_seconds"], 1e-9)
    speed_cpu = r["load_cpu_seconds"] / max(r["plain_read_cpu_seconds"], 1e-9)
    return "\n".join([
        f"checkpoint: {r['shards']} shards, {r['tensors']} tensors, {r['disk_tensor_bytes'] / GIB:.3f} GiB of tensor "
        f"data ({r['disk_file_bytes'] / GIB:.3f} GiB files)",
        f"resident parameters: {r['resident_bytes'] / GIB:.3f} GiB = {ratio:.4f} x disk "
        f"({'within' if abs(ratio - 1) <= 0.05 else 'NOT within'} 5%)",
        f"peak RSS over the start of the load: {r['peak_rss_over_start'] / GIB:.3f} GiB; target resident + 2 x largest "
        f"tensor ({r['largest_tensor_bytes'] / 2**20:.1f} MiB) = {budget / GIB:.3f} GiB "
        f"({'met' if r['peak_rss_over_start'] <= budget else 'NOT met'})",
        f"load time: {r['load_seconds']:.2f} s wall, {r['load_cpu_seconds']:.2f} s CPU; plain sequential "
        f"safetensors read of the same files: {r['plain_read_seconds']:.2f} s wall, "
        f"{r['plain_read_cpu_seconds']:.2f} s CPU",
        f"load / plain read: {speed:.2f} wall, {speed_cpu:.2f} CPU (target <= 2: "
        f"{'met' if speed <= 2 else 'NOT met'} on wall time)"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, default=64, help="routed experts per block (default: %(default)s)")
    parser.add_argument("--dim", type=int, default=2048, help="hidden size = expert width (default: %(default)s)")
    parser.add_argument("--shard-mib", type=int, default=256, help="shard size in MiB (default: %(default)s)")
    parser.add_argument("--tensors", type=int, default=0,
                        help="at least this many tensors (routed experts added to reach it; overrides --experts) "
                             "split into --shards files of equal tensor counts instead of --shard-mib sizes")
    parser.add_argument("--shards", type=int, default=1, help="files for --tensors (default: %(default)s)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    parser.add_argument("--dir", help="write the checkpoint here and keep it (default: a temporary folder)")
    parser.add_argument("--measure", help=argparse.SUPPRESS)  # internal: the fresh process that loads
    args = parser.parse_args(argv)
    if args.tensors < 0 or args.shards < 1:
        parser.error(f"--tensors must be >= 0 and --shards >= 1 (got {args.tensors} and {args.shards})")
    dtype = getattr(torch, args.dtype)
    if args.measure:
        print(json.dumps(measure(Path(args.measure), dtype)))
        return 0
    with tempfile.TemporaryDirectory(prefix="atom-load-bench-") as tmp:
        directory = Path(args.dir or tmp)
        cfg = many_tensor_config(args.tensors, args.dim) if args.tensors else scaled_config(args.dim, args.experts)
        start = time.perf_counter()
        split = {"shards": args.shards} if args.tensors else {"shard_bytes": args.shard_mib << 20}
        write_checkpoint(directory, hf_config(cfg, fp8=True, fp4_experts=True), synthetic_tensors(cfg), **split)
        print(f"wrote dim {args.dim}, {cfg.n_routed_experts} experts x 7 blocks in {time.perf_counter() - start:.1f} s "
              f"to {directory}")
        proc = subprocess.run([sys.executable, "-m", "atom.bench.load", "--measure", str(directory), "--dtype",
                               args.dtype], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            print(proc.stderr, file=sys.stderr)
            return proc.returncode
        print(report(json.loads(proc.stdout.strip().splitlines()[-1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Atom's control plane in two source trees, timed back to back: ``python -m atom.bench.control_plane_ab --old TREE``.

    python -m atom.bench.control_plane_ab --old /path/to/old/checkout [--new .] [--traces decode-heavy,shared-prefix]
        [--block 128] [--decode-steps 16] [--reps 5] [--rounds 2]

Compares atom's block manager on the side-by-side traces (:mod:`atom.bench.control_plane_trace`,
replayed atom alone by :func:`atom.bench.control_plane_side.compare`) between this tree and another
checkout of the project, for example an older commit in a ``git worktree``. Each round runs one fresh
process per tree (this file run as a script with the tree first on ``sys.path``, so it imports that
tree's ``atom``), old then new, the next round new then old, so both trees see the same load on a
shared machine and neither always runs first. A process replays every trace ``--reps`` times and
reports each figure as ``compare`` makes it (per call the lowest run, then the median call; per step
the mean of the lowest). The driver prints per trace and figure every round's figure of each tree and
the median over rounds of the per-round ratio new / old, then the hit tokens of each tree (a change
that moves them changed behaviour, not only speed).

Machine drift over minutes moves both trees alike within a round; only the ratios of one round are
compared. A figure of a few microseconds needs several rounds before its ratio means anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def _worker(tree: str, traces: list[str], block: int, decode_steps: int, reps: int) -> None:
    """Replay ``traces`` on the tree first on ``sys.path`` and print its figures as one JSON line."""
    import atom
    from atom.bench.control_plane_side import compare
    from atom.bench.control_plane_trace import TRACES

    here = Path(atom.__file__).resolve().parent.parent
    if here != Path(tree).resolve():
        raise SystemExit(f"the worker imported atom from {here}, not from the tree {tree}")
    by_name = {t.name: t for t in TRACES}
    out = {}
    for name in traces:
        atom_figs, _ = compare(by_name[name], block, decode_steps, reps, False)
        out[name] = {key: fig for key, (fig, _spread) in atom_figs.items()}
    print(json.dumps(out), flush=True)


def _run(tree: Path, args: argparse.Namespace) -> dict[str, dict[str, float]]:
    cmd = [sys.executable, __file__, "--worker", "--tree", str(tree), "--traces", args.traces,
           "--block", str(args.block), "--decode-steps", str(args.decode_steps), "--reps", str(args.reps)]
    done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the replay in {tree} failed (exit {done.returncode}):\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _report(traces: list[str], rounds: dict[str, list[dict[str, dict[str, float]]]]) -> None:
    print("| trace | figure | old us (each round) | new us (each round) | new / old (median of rounds) |")
    print("|---|---|---|---|---|")
    for name in traces:
        for key in rounds["old"][0][name]:
            if key == "hits":
                continue
            old = [r[name][key] for r in rounds["old"]]
            new = [r[name][key] for r in rounds["new"]]
            ratio = statistics.median(n / o for o, n in zip(old, new))
            print(f"| {name} | {key} | {' / '.join(f'{v:.1f}' for v in old)} | "
                  f"{' / '.join(f'{v:.1f}' for v in new)} | {ratio:.3f} |", flush=True)
    for name in traces:
        old, new = rounds["old"][0][name]["hits"], rounds["new"][0][name]["hits"]
        same = "same" if old == new else "DIFFERENT"
        print(f"hit tokens, {name}: old {old:.0f}, new {new:.0f} ({same})")


def main(argv: list[str] | None = None) -> None:
    # (imported here, not at the top: a worker first puts its tree on the path, in ``__main__`` below)
    from atom.bench.control_plane_trace import TRACES

    names = [t.name for t in TRACES]
    ap = argparse.ArgumentParser(prog="python -m atom.bench.control_plane_ab", description=__doc__.split("\n")[0])
    ap.add_argument("--old", type=Path, help="the other checkout (its root)")
    ap.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[2], help="default: this tree")
    ap.add_argument("--traces", default=",".join(names), help=f"comma-separated, of {', '.join(names)}")
    ap.add_argument("--block", type=int, default=128, help="block size (a multiple of 128)")
    ap.add_argument("--decode-steps", type=int, default=16, help="decode steps per request")
    ap.add_argument("--reps", type=int, default=5, help="replays of each trace in one process")
    ap.add_argument("--rounds", type=int, default=2, help="processes per tree, alternating which goes first")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)  # the worker's tree (first on its sys.path)
    args = ap.parse_args(argv)
    traces = [t.strip() for t in args.traces.split(",") if t.strip()]
    if not traces or any(t not in names for t in traces):
        raise SystemExit(f"--traces {args.traces!r}: give one or more of {', '.join(names)}, comma-separated")
    if args.block < 128 or args.block % 128 or args.decode_steps < 1 or args.reps < 1 or args.rounds < 1:
        raise SystemExit("--block must be a positive multiple of 128; --decode-steps, --reps and --rounds >= 1")
    if args.worker:
        _worker(args.tree, traces, args.block, args.decode_steps, args.reps)
        return
    for flag, tree in (("--old", args.old), ("--new", args.new)):
        if tree is None or not (tree / "atom" / "bench" / "control_plane_side.py").is_file():
            raise SystemExit(f"{flag} {tree}: give the root of a checkout of the project that has "
                             "atom/bench/control_plane_side.py")
    print(f"atom's block manager alone, block {args.block}, {args.decode_steps} decode steps, {args.reps} replays "
          f"per process, {args.rounds} round(s); old {args.old}, new {args.new}", flush=True)
    rounds: dict[str, list] = {"old": [], "new": []}
    for r in range(args.rounds):
        for name in ("old", "new") if r % 2 == 0 else ("new", "old"):
            rounds[name].append(_run(getattr(args, name), args))
    _report(traces, rounds)


if __name__ == "__main__":
    # A worker must import the timed tree's atom, so the path is set here, before anything imports
    # atom (which is also why this cannot be a helper shared with decode_ab: the helper would be atom).
    if "--worker" in sys.argv[1:]:
        sys.path[0] = sys.argv[sys.argv.index("--tree") + 1]  # (in place of this file's folder)
    main()

"""The KV memory: one elastic arena of pages, the prefix index over it, and what each request holds.

Pure Python (imports without torch). It imports nothing of the step loop, the output side or
speculative decoding; see docs/architecture.md.

The per-step paths (growth, publication, release, admission) clamp with conditional expressions, not
``min()`` / ``max()``: in CPython 3.11 each call of those builtins parses keyword arguments, about
1,300 instructions against a few bytecodes (docs/benchmarks.md, "no min() / max() on hot paths").
"""

"""The KV memory: one elastic arena of pages, the prefix index over it, and what each request holds.

Pure Python (imports without torch). It imports nothing of the step loop, the output side or
speculative decoding; see docs/architecture.md.
"""

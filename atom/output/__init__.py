"""The output side of the engine: what a request gets back (tokens, released text, log-probabilities)
and the engine's statistics. Pure Python; see docs/architecture.md.
"""

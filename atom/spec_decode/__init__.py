"""Speculative decoding: where drafts come from (draft sources, the MTP drafter), how they are
verified (the rejection sampler) and counted. The draft sources and counters are pure Python; the
drafter and the sampler use torch. See docs/architecture.md.
"""

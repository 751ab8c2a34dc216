"""Test and benchmark scaffolding that drives the real control plane without a model.

``FakeRunner`` stands in for the model runner (deterministic tokens, the runner's table
bookkeeping); ``KvContentModel`` checks that every KV row a step reads holds what a cold run wrote;
``ReplayDraft`` is an oracle draft source (an earlier run's outputs, or always-wrong drafts).
Nothing in the engine imports this package.
"""

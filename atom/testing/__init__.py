"""Test and benchmark scaffolding that drives the real control plane without a model.

``FakeRunner`` stands in for the model runner (deterministic tokens, the runner's table
bookkeeping); ``KvContentModel`` checks that every KV row a step reads holds what a cold run wrote.
Nothing in the engine imports this package.
"""

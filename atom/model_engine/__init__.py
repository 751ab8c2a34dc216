"""The step loop: requests (``Sequence``), the scheduler that builds each step's batch, and the
engine that runs steps and turns them into outputs. Pure Python; see docs/architecture.md.
"""

"""atom: a DeepSeek-V4 inference engine built around one elastic KV-memory arena."""
__version__ = "0.1.0"

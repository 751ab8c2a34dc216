"""Model operators that run on the paged KV arena."""

"""The torch side of the engine: binds the KV arena buffer, builds step inputs, runs the model, samples."""

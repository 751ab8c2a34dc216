"""Published DeepSeek-V4 ``config.json`` files (values from the model card), used as fixtures and presets."""

"""Encoders: backbones, pooling, towers and fast batched inference."""

"""Sharding layouts run for real: a layout applied to a model on a process group of N ranks
(`apply`), the ranks started by PyTorch's own launcher (`launch`), and the numerics of a sharded
training step checked against the single-device fp32 reference (`check`). See docs/sharding.md.
"""

"""Measurement arithmetic: FLOPs, MFU and timing statistics."""

"""Models tpu-tune builds itself: a generic decoder from a shape, so a shape needs no code."""

"""What compiles: the user's model as a sharded JAX training step (`program.py` and its parts), the
compile pool of worker processes, and the compiler's figures (HBM, loop costs)."""

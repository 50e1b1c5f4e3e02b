"""How to run: isolated workers that measure candidates and compare them interleaved."""

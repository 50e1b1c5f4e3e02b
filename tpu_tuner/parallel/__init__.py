"""Layer 4: sharding layouts applied for real to a model on a process group (`apply_layout`), and
a plan's layouts mapped onto the ranks at hand. See docs/sharding.md."""

"""Layer 6: one step built and timed under a candidate on a backend, its accuracy against the
fp32 reference, the operator table, and what a trial measured (`Measurement`)."""

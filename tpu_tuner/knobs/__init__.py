"""Layer 5: the knobs. One module per knob (its choices, how it applies, why it may not), the
explicit `registry`, the `Candidate` that holds a setting of every knob, the workload traits
that decide which knobs apply, and the tuned config that writes a candidate out."""

"""Layer 1: the user's workload and its model: loading, batches, structure (repeated blocks,
placements, the `Layout` vocabulary), input-length samples and bucket arithmetic."""

"""The TPU planner: sharding layouts for a TPU slice, from the TPU compiler, without a TPU."""

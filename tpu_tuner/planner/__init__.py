"""The TPU planner: sharding layouts for a TPU slice, from the TPU compiler, without a TPU.

Its rooms: `plans/` (what plans: the entry, options, space, search, result, rankings), `compiler/`
(what compiles: the JAX step and the compile pool), `prediction/` (what predicts: step time, MFU,
band, HBM estimate), `calibration/` (what calibrates: the fit to published runs); `topology.py`,
the slices by name, is every room's vocabulary."""

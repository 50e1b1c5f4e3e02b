"""Layer 1: the user's model, in four rooms. A room imports its own modules and the rooms below it
(docs/design.md, "Layers"; `tests/test_layers.py` checks it):

* `meshes/`: how a model is laid over devices (the `Layout` vocabulary, placements, a layout's
  mesh across hosts), pure arithmetic;
* `buckets/`: padded shape buckets (length samples, a bucketing's cost, the optimiser, the
  runtime padding helper);
* `decoders/`: the generic decoder the planner builds from a shape or a Hugging Face config, and
  the attention shape every transformer declares (`TransformerDims`);
* `workloads/`: the user's workload and its loading (the `Workload` contract, the loader, batches
  and input sizes, the workload as profiled, a model's blocks and dimensions), above the others:
  the loader builds a shape's decoder, a model's dimensions are read as the layouts need them.

`meshes/`, `buckets/` and `decoders/` import no other room.
"""

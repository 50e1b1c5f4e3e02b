"""The user's workload and its loading: what a model file (or a shape, or an ``hf:`` source)
provides, and what tpu-tune knows of it. The top room of `model/`: it imports `decoders/` (the
loader builds a shape's decoder; a Hugging Face model's positions) and `meshes/` (a model's
dimensions as the layouts read them).

* `workload.py`: the `Workload` contract (build the model, make a batch, the loss and optimizer)
  and how a step calls it;
* `loader.py`: `load_workload` from a file of either convention, a shape or an ``hf:`` source;
  `model_argument.py` checks the argument first without importing torch;
* `hf_source.py`, `hf_workload.py`: an ``hf:`` source to a transformers config, and the native
  contract built from it; `hf_causal_mask.py`: its ``sdpa`` attention with a plain causal mask
  left to ``is_causal`` (so a mask-free kernel, splash, serves a compiled transformers model);
* `batch.py`, `input_dims.py`: a batch resized or sliced, and which input sizes are the batch and
  the sequence;
* `profiled.py`: the workload as the profiler ran it (`Profile.workload`); `summary.py`: what the
  parent process knows of a model file without importing it;
* `blocks.py`, `structure.py`: a model's repeated blocks (and which of them are compiled on their
  own) and its dimensions (width, depth, heads, vocabulary), read off its module tree.
"""

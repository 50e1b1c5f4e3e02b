"""The generic decoder the planner builds: from a shape (``decoder:...``, a ``shape.toml``) or
a Hugging Face config, with every layer's attention as today's models define it. Imports no other
room of `model/` (the workloads room's loader builds a shape's workload from here).

* `decoder_shape.py`: the shape (`DecoderShape`) read from TOML or an inline spec, with its keys
  (`shape_keys.py`) and its family checks (`shape_checks.py`: gpt-oss, Gemma 3n / 4's small models);
* `decoder.py`: the `Decoder` module and the native contract built from a shape (`shape_module`);
* `layer_parts.py`, `attention.py`, `latent_attention.py`, `experts.py`: its layers (norms, rotary
  turn, MLP; local and chunked attention with sinks; MLA; the dropping and dropless MoE);
* `attention_pattern.py`: which attention each layer of a Hugging Face config runs;
* `hf_decoder.py`: a Hugging Face decoder's config as a `DecoderShape`;
* `transformer_dims.py`: the attention shape any transformer declares for the model-FLOPs formula
  (`TransformerDims`, each layer's `AttentionSpan`), which the decoder builds for its shapes.
"""

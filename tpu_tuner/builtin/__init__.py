"""Built-in declarative definitions: the repository's agents/ and search_spaces/ folders.

pyproject.toml maps those top-level folders onto ``tpu_tuner.builtin.agents`` and
``tpu_tuner.builtin.search_spaces`` so that an installed tpu-tune ships them.
"""

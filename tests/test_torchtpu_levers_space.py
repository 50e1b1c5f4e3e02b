"""The opt-in ``torchtpu`` space: default.toml's TPU choices plus TorchTPU's levers that did not
move a chip's step beyond noise (or were not measured), which stay out of the default space;
shipped like the other spaces; the TorchTPU names the levers use are in the table checked against
the released package. Pure bf16 training moved a v5e chip's Llama-class step 2.25x (1.90-2.66),
so it is in the default space on TPU (docs/knobs.md, "TorchTPU's levers")."""

from __future__ import annotations

from tpu_tuner.core.definitions import builtin_names, load_definition
from tpu_tuner.devices import torchtpu_api
from tpu_tuner.tuning.search.search_space import SearchSpace

LEVERS = {"xla_optimization_level", "libtpu_flags"}
# Splash moved a chip's step beyond noise (docs/knobs.md): in the default TPU space at torch-tpu's
# own blocks; its other block sizes stay opt-in here.
SPLASH_BLOCKS = {"splash:256", "splash:1024"}


def _entries(space: str) -> dict[str, dict]:
    return {entry["name"]: entry for entry in load_definition("search_spaces", space)["param"]}


def test_the_torchtpu_space_is_the_default_tpu_space_plus_the_levers() -> None:
    default, levers = _entries("default"), _entries("torchtpu")
    for name, entry in default.items():
        if name == "attention_kernel":
            assert set(levers[name]["choices"]["tpu"]) == set(entry["choices"]["tpu"]) | SPLASH_BLOCKS
        elif "tpu" in entry["choices"]:
            assert levers[name]["choices"]["tpu"] == entry["choices"]["tpu"], name
        else:
            assert name not in levers, name
    assert set(levers) - set(default) == LEVERS
    assert set(levers["param_dtype"]["choices"]) == {"cpu", "cuda", "tpu"}


def test_the_levers_are_not_in_the_default_space_on_any_device() -> None:
    for kind in ("cpu", "cuda", "tpu"):
        assert not LEVERS & {p.name for p in SearchSpace.load("default", kind).params}, kind
    tpu = {p.name for p in SearchSpace.load("torchtpu", "tpu").params}
    assert tpu >= LEVERS
    assert [p.name for p in SearchSpace.load("torchtpu", "cpu").params] == ["param_dtype"]


def test_splash_attention_is_in_the_default_space_on_tpu_alone() -> None:
    """Measured on the chip (1.22x on the 335M decoder, 1.05x on the README example)."""
    tpu = {p.name: p for p in SearchSpace.load("default", "tpu").params}
    assert list(tpu["attention_kernel"].choices) == ["default", "splash"]
    for kind in ("cpu", "cuda"):
        assert "attention_kernel" not in {p.name for p in SearchSpace.load("default", kind).params}, kind


def test_pure_bf16_training_is_in_the_default_space_on_tpu_alone() -> None:
    """Measured on the chip, not on CPU or CUDA: only TPU's default space searches it."""
    assert "param_dtype" in {p.name for p in SearchSpace.load("default", "tpu").params}
    for kind in ("cpu", "cuda"):
        assert "param_dtype" not in {p.name for p in SearchSpace.load("default", kind).params}, kind


def test_the_space_ships_with_the_package_and_its_names_are_checked() -> None:
    assert "torchtpu" in builtin_names("search_spaces")  # `--space torchtpu`, installed too (*.toml)
    assert ("torch.tpu.compiler", "custom_compiler_options") in torchtpu_api.PUBLIC_NAMES
    assert ("torch.tpu.ops", "splash_sdpa") in torchtpu_api.PUBLIC_NAMES
    assert "block_kv" in torchtpu_api.PARAMETERS[("torch.tpu.ops", "splash_sdpa")]
    assert "LIBTPU_INIT_ARGS" in torchtpu_api.ENVIRONMENT_VARIABLES

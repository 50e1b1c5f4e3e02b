"""The loader on both conventions and on every kind of bad file."""

from __future__ import annotations

import pytest
from conftest import EXAMPLES, FIXTURES

from tpu_tuner.core.errors import WorkloadError
from tpu_tuner.model.workloads.loader import load_workload


def test_native_training_workload() -> None:
    workload = load_workload(FIXTURES / "tiny_gpt.py")
    assert workload.convention == "native" and workload.is_training
    assert (workload.batch_size, workload.seq_len) == (2, 32)
    assert workload.transformer is not None and workload.transformer.head_dim == 16
    inputs, target = workload.split_batch(workload.batch(3, 8))
    assert tuple(inputs.shape) == (3, 8) and tuple(target.shape) == (3, 8)


def test_benchmark_convention_is_inference() -> None:
    workload = load_workload(FIXTURES / "tiny_mlp_benchmark.py")
    assert workload.convention == "benchmark" and not workload.is_training
    model = workload.build_model()
    assert model.fc1.in_features == 16  # get_init_inputs() reached the constructor
    (x,) = workload.batch()
    assert tuple(model(x).shape) == (4, 16)


@pytest.mark.parametrize("example", ["gpt.py", "mlp.py", "cnn.py"])
def test_shipped_examples_load(example: str) -> None:
    workload = load_workload(EXAMPLES / example)
    assert workload.name == example[:-3]


@pytest.mark.parametrize(
    ("file", "message"),
    [
        ("does_not_exist.py", "file not found"),
        ("syntax_error.py", "syntax error at line 3"),
        ("import_error.py", "error while importing: RuntimeError: boom at import"),
        ("no_workload.py", "no workload found"),
        ("bad_batch_size.py", "BATCH_SIZE must be a positive integer"),
    ],
)
def test_bad_files_name_the_file_and_the_problem(file: str, message: str) -> None:
    with pytest.raises(WorkloadError) as info:
        load_workload(FIXTURES / file)
    assert message in str(info.value)
    assert str(FIXTURES / file) in str(info.value)
    assert info.value.exit_status == 2


def test_not_a_python_file(tmp_path) -> None:
    path = tmp_path / "model.txt"
    path.write_text("x")
    with pytest.raises(WorkloadError, match="must be a Python file"):
        load_workload(path)


def test_two_files_with_the_same_name_do_not_collide(tmp_path) -> None:
    for folder, width in (("a", 3), ("b", 5)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "model.py").write_text(
            "import torch\nfrom torch import nn\nBATCH_SIZE = 1\n"
            f"def build_model():\n    return nn.Linear({width}, 1)\n"
            f"def make_batch(b, s):\n    return torch.randn(b, {width})\n"
        )
    first = load_workload(tmp_path / "a" / "model.py").build_model()
    second = load_workload(tmp_path / "b" / "model.py").build_model()
    assert (first.in_features, second.in_features) == (3, 5)

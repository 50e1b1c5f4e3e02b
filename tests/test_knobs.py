"""The knob registry and the contract every registered knob keeps.

For each knob and each of its CPU choices in the default space: applying it makes `observe`
read it back (the hooks do what they say) on the trial path (`Backend.applied` / `prepare_model` /
`compile` / `autocast`, what `execution/step.py` uses) and on the `tpu_tuner.apply` path alike;
process-wide settings are restored afterwards; the value survives `TunedConfig.save/load`; its
`code()` runs in a fresh interpreter against a tiny model and applies the same value there.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from tpu_tuner.core.definitions import load_definition
from tpu_tuner.core.errors import DefinitionError
from tpu_tuner.devices.cpu import CpuBackend
from tpu_tuner.devices.torchtpu import TorchTpuBackend
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.capabilities import Conditional, TrainingStep
from tpu_tuner.knobs.tuned_config import TunedConfig, apply
from tpu_tuner.tuning.search.search_space import SearchSpace

# torch.compile with inductor builds C++ (tens of seconds on 2 cores): kept out of the quick run.
SLOW_VALUES = {("execution", "inductor")}
# Knobs whose other values act on a transformers model only (TinyNet has no attention switch):
# their contract runs on one, in tests/test_hf_models.py.
TRANSFORMERS_ONLY = {"attn_implementation"}


# Opt-in spaces holding knobs not yet measured where they apply (search_spaces/README.md).
OPT_IN_SPACES = ("torchtpu",)


def _entries() -> dict[str, dict]:
    """Each knob's space entry: the default space's, else an opt-in space's."""
    entries: dict[str, dict] = {}
    for space in (*OPT_IN_SPACES, "default"):
        entries.update({entry["name"]: entry for entry in load_definition("search_spaces", space).get("param", [])})
    return entries


def _cpu_cases() -> list[object]:
    """(knob, value) for every registered knob and every CPU choice the default space (or, for a
    knob it does not hold, an opt-in space) gives it."""
    entries = _entries()
    cases = []
    for name, knob in knobs.REGISTRY.items():
        for value in knob.choices("cpu", entries.get(name, {})) or (knob.default,):
            if name in TRANSFORMERS_ONLY and value != knob.default:
                continue
            marks = [pytest.mark.slow] if (name, value) in SLOW_VALUES else []
            cases.append(pytest.param(name, value, id=f"{name}={value}", marks=marks))
    return cases


CASES = _cpu_cases()


class TinyNet(nn.Module):
    """A convolution, a linear layer and two repeated blocks: every knob has something to act on."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Linear(4 * 8 * 8, 5)
        self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(5, 5), nn.Tanh()) for _ in range(2)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.head(torch.relu(self.conv(x)).flatten(1)))


def test_the_registry_holds_each_knob_under_its_own_name_in_position_order() -> None:
    """What the registry promises (knobs/registry.py, docs/knobs.md): every knob class once, under
    its own name, from the module of this package named after it; listed by `position` (lower
    first, ties by name), which puts a conditional knob after the one it depends on (the space
    asks in this order); the default space sets these knobs and no others, the opt-in spaces the
    rest; a candidate sets exactly these knobs, in it."""
    registered = knobs.names()
    assert {"execution", "matmul_precision", "autocast"} <= set(registered)
    assert sorted(registered) == sorted(cls.name for cls in knobs.KNOB_CLASSES)
    for name in registered:
        knob = knobs.get(name)
        assert isinstance(knob, knobs.Knob) and knob.name == name, name
        assert type(knob).__module__ == f"tpu_tuner.knobs.{name}", name
    order = [(knobs.get(name).position, name) for name in registered]
    assert order == sorted(order)
    assert registered.index("execution") < registered.index("compile_options")  # active only under inductor
    space = load_definition("search_spaces", "default").get("param", [])
    assert {entry["name"] for entry in space} <= set(registered)
    assert sorted(_entries()) == sorted(registered)  # every knob has a shipped space that searches it
    assert tuple(Candidate().to_dict()) == registered  # a candidate sets every knob, in registry order
    with pytest.raises(ValueError, match="unknown candidate settings: \\['threads'\\]"):
        Candidate(threads="2")


# A knob added to the registry, then everything that lists knobs imported (some list them once, at
# import): the knob is a searchable parameter, a trials.csv column before the measurements, a
# dashboard knob, a candidate setting, a tuned config's [settings] entry and, as it declares a
# flag (`PickedByFlags`), a flag of `tpu-tune profile`, with no other edit.
ADDED_KNOB = textwrap.dedent("""\
    import argparse, json, pathlib, sys
    from tpu_tuner.knobs import registry
    from tpu_tuner.knobs.capabilities import Flag, PickedByFlags
    from tpu_tuner.knobs.memory_format import MemoryFormatKnob

    class Added(MemoryFormatKnob, PickedByFlags):
        name = "added_knob"
        position = 1000
        flags = (Flag("--added", "added_field", "the added knob", choices=MemoryFormatKnob.values),)

        def from_fields(self, fields):
            return fields.get("added_field")

    registry.REGISTRY[Added.name] = Added()
    from tpu_tuner.dashboard.collect import KNOBS
    from tpu_tuner.cli import profile
    from tpu_tuner.knobs.candidate import Candidate
    from tpu_tuner.knobs.tuned_config import TunedConfig
    from tpu_tuner.tuning.search.trials_table import TRIAL_COLUMNS
    from tpu_tuner.tuning.search.search_space import SearchSpace

    folder = pathlib.Path(sys.argv[1])
    (folder / "space.toml").write_text(
        '[[param]]\\nname = "added_knob"\\nchoices.cpu = ["contiguous", "channels_last"]\\n'
    )
    space = SearchSpace.load(folder / "space.toml", "cpu")
    candidate = space.to_candidate({"added_knob": "channels_last"})
    loaded = TunedConfig.load(TunedConfig(candidate, "cpu").save(folder / "tuned_config.toml"))
    parser = argparse.ArgumentParser()
    profile.add_arguments(parser)
    picked = vars(parser.parse_args(["model.py", "--added", "channels_last", "--precision", "medium"]))
    print(json.dumps({
        "searched": [p.name for p in space.searched],
        "column_before_measurements": TRIAL_COLUMNS.index("added_knob") < TRIAL_COLUMNS.index("amortised_step_s"),
        "dashboard": "added_knob" in KNOBS,
        "candidate": candidate.to_dict()["added_knob"],
        "tuned_config": loaded.candidate["added_knob"],
        "profile_flag": Candidate.from_fields(picked).changed,
    }))
    """)


def test_a_knob_added_to_the_registry_reaches_everything_that_lists_knobs(tmp_path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", ADDED_KNOB, str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {
        "searched": ["added_knob"],
        "column_before_measurements": True,
        "dashboard": True,
        "candidate": "channels_last",
        "tuned_config": "channels_last",
        "profile_flag": {"matmul_precision": "medium", "added_knob": "channels_last"},
    }
    assert 'added_knob = "channels_last"' in (tmp_path / "tuned_config.toml").read_text()


def test_space_refuses_a_knob_the_registry_lacks(tmp_path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[[param]]\nname = "threads"\nchoices.cpu = ["1", "2"]\n')
    with pytest.raises(DefinitionError, match="unknown parameter 'threads'; known: execution"):
        SearchSpace.load(bad, "cpu")


def _observe(candidate: Candidate, model: nn.Module, forward, backend, autocast) -> dict[str, str | None]:
    with autocast():
        return {name: knob.observe(model, forward, backend) for name, knob in knobs.REGISTRY.items()}


@pytest.mark.parametrize(("name", "value"), CASES)
def test_knob_contract(name: str, value: str, tmp_path) -> None:
    knob = knobs.get(name)
    candidate = Candidate({name: value})
    expected = knob.check(value)
    backend = CpuBackend()
    if isinstance(knob, TrainingStep):
        if isinstance(knob, Conditional):  # checked where it is active: under a compiled forward
            candidate = Candidate({name: value, "execution": "aot_eager"})
        _training_step_contract(knob, candidate, expected, backend, tmp_path)
        return
    before = torch.get_float32_matmul_precision()
    baseline = _observe(Candidate(), TinyNet(), TinyNet(), backend, lambda: Candidate().step(backend))
    assert baseline[name] == knob.default  # nothing applied: the default reads back

    # The trial path: what execution/step.py and the worker's jobs do.
    with candidate.process(backend):
        model = candidate.prepare_model(TinyNet(), backend)
        forward = candidate.wrap_forward(model, backend)
        trial = _observe(candidate, model, forward, backend, lambda: candidate.step(backend))
    assert trial[name] == expected
    assert torch.get_float32_matmul_precision() == before  # process-wide settings restored

    # Describe, and the round trip through tuned_config.toml.
    label = candidate.describe()
    assert isinstance(label, str) and label and (not knob.describe(expected) or knob.describe(expected) in label)
    path = TunedConfig(candidate, "cpu").save(tmp_path / "tuned_config.toml")
    loaded = TunedConfig.load(path)
    assert loaded.candidate == candidate and loaded.candidate[name] == expected

    # The apply path gives the same state as the trial path.
    applied = apply(TinyNet(), loaded)
    try:
        state = _observe(
            candidate,
            applied.model if isinstance(applied.model, nn.Module) else TinyNet(),
            applied.model,
            backend,
            applied.autocast,
        )
        if isinstance(applied.model, nn.Module):
            assert state == trial
        assert state[name] == expected
    finally:
        applied.restore()
    assert torch.get_float32_matmul_precision() == before


def _training_step_contract(knob: knobs.Knob, candidate: Candidate, expected: str, backend, tmp_path) -> None:
    """A knob of the training step only: the step that execution/step.py builds (the trial path)
    reads the value back from its optimizer / micro-batch count; the model is left alone; the value
    round-trips through tuned_config.toml. (Its printed code: tests/test_training_step_knobs.py.)"""
    from tpu_tuner.execution.step import prepare_step
    from tpu_tuner.model.workloads.workload import Workload

    workload = Workload(
        name="tiny",
        source=tmp_path / "tiny.py",
        build_model=TinyNet,
        make_batch=lambda b, s: (torch.randn(b, 3, 8, 8), torch.randint(0, 5, (b,))),
        batch_size=4,
        seq_len=None,
        convention="native",
        loss_fn=nn.functional.cross_entropy,
    )
    for tried, wanted in ((Candidate(), knob.default), (candidate, expected)):
        step = prepare_step(workload, backend, tried)
        assert knob.observe_training(step.optimizer, tried.micro_batches(backend), step.loss) == wanted
        assert knob.observe(step.model, step.forward, backend) is None  # the model is untouched
        step.run()
    loaded = TunedConfig.load(TunedConfig(candidate, "cpu").save(tmp_path / "tuned_config.toml"))
    assert loaded.candidate == candidate and loaded.candidate[knob.name] == expected
    assert not knob.describe(expected) or knob.describe(expected) in candidate.describe()


def test_printed_code_runs_and_applies_the_value() -> None:
    """Every quick (knob, value)'s `code()` runs as printed, in one fresh interpreter, and the knob
    then reads its value back there (inside the step's context)."""
    sections = []
    for case in CASES:
        name, value = case.values
        if case.marks or isinstance(knobs.get(name), TrainingStep):  # a training loop's code: its own test
            continue
        code = Candidate({name: value}).code("cpu")
        body = "\n".join(code).replace(
            "output = model(inputs)",
            f"output = model(inputs); "
            f"observed[{name + '=' + value!r}] = get({name!r}).observe(model, model, CpuBackend)",
        )
        sections.append(
            f"model = TinyNet()\ninputs = torch.randn(2, 3, 8, 8)\n{body}\n"
            "torch.set_float32_matmul_precision('highest')\n"
            # printed compiler options are process-wide too: back to the defaults
            "torch._inductor.config.freezing = torch._inductor.config.max_autotune = False\n"
            "torch._dynamo.error_on_graph_break(False).__enter__()\n"
        )
    script = (
        textwrap.dedent("""\
        import json
        import torch
        from torch import nn
        from tpu_tuner.devices.cpu import CpuBackend
        from tpu_tuner.knobs.registry import get

        class TinyNet(nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = nn.Conv2d(3, 4, 3, padding=1)
                self.head = nn.Linear(4 * 8 * 8, 5)
                self.blocks = nn.Sequential(*(nn.Sequential(nn.Linear(5, 5), nn.Tanh()) for _ in range(2)))

            def forward(self, x):
                return self.blocks(self.head(torch.relu(self.conv(x)).flatten(1)))

        observed = {}
        """)
        + "\n".join(sections)
        + "\nprint(json.dumps(observed))\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    observed = json.loads(done.stdout.strip().splitlines()[-1])
    for case in CASES:
        name, value = case.values
        if not case.marks and not isinstance(knobs.get(name), TrainingStep):
            assert observed[f"{name}={value}"] == knobs.get(name).check(value), (name, value)


def test_start_up_environment_comes_from_the_backend() -> None:
    """TorchTPU's eager modes are start-up variables the backend names; the study and the tuned
    config ask the backend (by class: the device need not be present)."""
    fused = Candidate(execution="eager:defer_and_fuse")
    assert fused.environment(TorchTpuBackend) == {"TORCH_TPU_DEFER_AND_FUSE": "1"}
    assert fused.environment(CpuBackend) == {}  # no such variables off TPU
    assert Candidate(execution="eager:strict") == Candidate()  # the default eager mode is plain eager
    config = TunedConfig(fused, "tpu")
    assert config.environment() == {"TORCH_TPU_DEFER_AND_FUSE": "1"}
    assert "export TORCH_TPU_DEFER_AND_FUSE=1" in "\n".join(config.instructions("c.toml"))
    with pytest.raises(ValueError, match="eager mode must be one of strict"):
        Candidate(execution="eager:fastest")


def test_older_field_style_candidates_still_load(tmp_path) -> None:
    """Run folders and tuned_config.toml written before the registry keep loading."""
    old = {
        "eager_mode": "strict",
        "compile_backend": "inductor",
        "compile_mode": None,
        "matmul_precision": "medium",
        "autocast_dtype": "bfloat16",
    }
    assert Candidate.from_dict(old) == Candidate(execution="inductor", matmul_precision="medium", autocast="bfloat16")
    assert (
        Candidate.from_dict({**old, "compile_backend": None, "eager_mode": "defer_and_fuse"})["execution"]
        == "eager:defer_and_fuse"
    )
    path = tmp_path / "tuned_config.toml"
    path.write_text(
        'format_version = 1\ndevice_kind = "cpu"\n[settings]\neager_mode = "strict"\n'
        'compile_backend = "aot_eager"\nmatmul_precision = "highest"\n'
    )
    assert TunedConfig.load(path).candidate == Candidate(execution="aot_eager")
    assert Candidate.from_dict(Candidate(autocast="bfloat16").to_dict()) == Candidate(autocast="bfloat16")


def test_memory_format_relays_conv_weights_and_inputs() -> None:
    """channels_last: 4-D weights and the 4-D input the convolution sees are NHWC, the output is
    unchanged; a model without 4-D weights is left as it was."""
    backend, candidate = CpuBackend(), Candidate(memory_format="channels_last")
    torch.manual_seed(0)
    reference = TinyNet()
    model = candidate.prepare_model(TinyNet(), backend)
    model.load_state_dict(reference.state_dict())
    seen = []
    model.conv.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    inputs = torch.randn(2, 3, 8, 8)
    output = model(inputs)
    assert model.conv.weight.is_contiguous(memory_format=torch.channels_last) and not model.conv.weight.is_contiguous()
    assert seen[0].is_contiguous(memory_format=torch.channels_last) and not seen[0].is_contiguous()
    torch.testing.assert_close(output, reference(inputs))
    linear = candidate.prepare_model(nn.Linear(4, 4), backend)
    assert knobs.get("memory_format").observe(linear, linear, backend) is None
    assert not knobs.get("memory_format").applies_to("tpu")
    assert "memory_format" not in SearchSpace.load("default", "tpu").grid()
    assert candidate.describe() == "eager, matmul highest, channels_last"


def _profile_with(**shares: float) -> object:
    from types import SimpleNamespace

    from tpu_tuner.execution.operators import OperatorTime
    from tpu_tuner.model.workloads.profiled import ProfiledWorkload

    return SimpleNamespace(
        operators=[OperatorTime(name, 1.0, share * 10, share) for name, share in shares.items()],
        workload=ProfiledWorkload("m", "m.py", "native", training=False),
    )


def test_compile_agent_seeds_channels_last_only_for_convolution_heavy_profiles() -> None:
    from tpu_tuner.tuning.agents import load_agents

    space = SearchSpace.load("default", "cpu")
    (agent,) = load_agents(["compile"], "cpu")
    seeds = agent.seeds(_profile_with(**{"aten::mkldnn_convolution": 0.7, "aten::addmm": 0.1}), space)
    assert seeds[0] == {"execution": "inductor", "memory_format": "channels_last"}  # the combined seed carries it
    assert {"memory_format": "channels_last"} in seeds
    assert agent.validate(Candidate(memory_format="channels_last")) is None

    (agent,) = load_agents(["compile"], "cpu")
    seeds = agent.seeds(_profile_with(**{"aten::addmm": 0.8}), space)
    assert all("memory_format" not in seed for seed in seeds)
    assert "no convolution operator" in agent.validate(Candidate(memory_format="channels_last"))

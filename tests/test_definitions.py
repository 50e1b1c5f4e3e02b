"""Declarative definitions: built-ins by name, files by path, clear errors; strict schemas
(issue 13, item 4): unknown, missing and mistyped keys refused with a one-line error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES
from tpu_tuner.core import definitions
from tpu_tuner.core.definitions import builtin_names, load_agent_definition, load_definition
from tpu_tuner.core.errors import DefinitionError
from tpu_tuner.profiling import ProfilerSettings
from tpu_tuner.profiling.settings import ProfilerDefinition
from tpu_tuner.tuning.agents.schema import AGENT_DEFINITIONS, load_tuning_agent_definition


def test_builtin_profiler_agent_loads_by_name() -> None:
    assert "profiler" in builtin_names("agents")
    settings = ProfilerSettings.load("profiler")
    assert settings.timing_min_steps >= 10  # the floor: at least 10 timed steps


def test_file_overrides_and_unknown_keys(tmp_path) -> None:
    good = tmp_path / "fast.toml"
    good.write_text("[timing]\nmin_steps = 12\nmin_seconds = 0\n")
    settings = ProfilerSettings.load(good)
    assert settings.timing_min_steps == 12 and settings.timing_min_seconds == 0.0
    assert settings.warmup_max_steps == ProfilerSettings().warmup_max_steps

    bad = tmp_path / "bad.toml"
    bad.write_text("[timing]\nmin_step = 12\n")
    with pytest.raises(DefinitionError, match=r"unknown key \[timing\].min_step "):
        ProfilerSettings.load(bad)

    wrong_type = tmp_path / "wrong.toml"
    wrong_type.write_text('[timing]\nmin_steps = "ten"\n')
    with pytest.raises(DefinitionError, match=r"\[timing\].min_steps must be an integer, not 'ten'"):
        ProfilerSettings.load(wrong_type)


def test_missing_and_malformed_definitions(tmp_path) -> None:
    with pytest.raises(DefinitionError, match="no built-in agents definition 'nope'"):
        load_definition("agents", "nope")
    broken = tmp_path / "broken.toml"
    broken.write_text("[timing\n")
    with pytest.raises(DefinitionError, match="invalid TOML"):
        load_definition("agents", broken)


# --- issue 13, item 4: definitions are strict --------------------------------------------------

SHIPPED_AGENTS = Path(__file__).parent.parent / "agents"


@pytest.fixture
def agents_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped agents/ folder that the built-in look-up reads instead."""
    folder = tmp_path / "agents"
    folder.mkdir()
    for path in SHIPPED_AGENTS.glob("*.toml"):
        shutil.copy(path, folder / path.name)
    real = definitions.builtin_folder
    monkeypatch.setattr(definitions, "builtin_folder", lambda kind: folder if kind == "agents" else real(kind))
    return folder


def _edit(folder: Path, agent: str, old: str, new: str) -> None:
    path = folder / f"{agent}.toml"
    text = path.read_text()
    assert text.count(old) == 1, f"{old!r} not once in {path.name}"
    path.write_text(text.replace(old, new))


def _load(agent: str):
    if agent == "profiler":
        return ProfilerSettings.load()
    return load_tuning_agent_definition(agent)


def _refusal(agent: str) -> str:
    with pytest.raises(DefinitionError) as info:
        _load(agent)
    message = str(info.value)
    assert "\n" not in message and info.value.exit_status == 2
    return message


def test_every_shipped_definition_loads_and_states_every_key() -> None:
    assert set(builtin_names("agents")) == {"profiler", *AGENT_DEFINITIONS}
    for agent in AGENT_DEFINITIONS:
        assert load_tuning_agent_definition(agent).agent.name == agent
    # The dataclass defaults, used where settings are built in code, are the shipped file's.
    assert ProfilerSettings.load() == ProfilerSettings()
    assert load_agent_definition(ProfilerDefinition, "profiler").agent.name == "profiler"
    for space in builtin_names("search_spaces"):
        assert load_definition("search_spaces", space)["param"]


def test_agent_classes_match_the_schemas() -> None:
    from tpu_tuner.tuning.agents import agent_classes

    classes = agent_classes()
    assert set(classes) == set(AGENT_DEFINITIONS)
    assert all(classes[name].definition_schema is AGENT_DEFINITIONS[name] for name in classes)


@pytest.mark.parametrize(
    "agent, old, new, message",
    [
        (
            "precision",
            "skip_high_on_cpu = true",
            "skip_hihg_on_cpu = true",
            "agents/precision.toml: unknown key [validate].skip_hihg_on_cpu "
            "(known: skip_high_on_cpu, skip_float16_on_cpu)",
        ),
        (
            "precision",
            "[hardware]",
            "[hardwear]",
            "agents/precision.toml: unknown table [hardwear] (known: agent, diagnose, seeds, validate, hardware)",
        ),
        (
            "compile",
            "overhead_bound_hint = true",
            "overhead_bound_hnt = true",
            "agents/compile.toml: unknown key [diagnose].overhead_bound_hnt (known: overhead_bound_hint)",
        ),
        (
            "compile",
            'cpu = ["inductor"]',
            'cpu = ["inductor"]\ngpu = ["inductor"]',
            "agents/compile.toml: unknown key [seeds].gpu (known: cpu, cuda, tpu)",
        ),
        (
            "profiler",
            "cv_max = 0.25",
            "cv_maximum = 0.25",
            "agents/profiler.toml: unknown key [verdict].cv_maximum (known: explained_share_min, cv_max)",
        ),
    ],
)
def test_a_typo_in_each_agent_definition_is_refused_naming_file_and_key(
    agents_folder: Path, agent: str, old: str, new: str, message: str
) -> None:
    _edit(agents_folder, agent, old, new)
    assert _refusal(agent) == message


@pytest.mark.parametrize(
    "agent, old, message",
    [
        ("precision", 'name = "precision"', "agents/precision.toml: missing key [agent].name"),
        (
            "compile",
            "require_cxx_for_inductor_on_cpu = true",
            "agents/compile.toml: missing key [validate].require_cxx_for_inductor_on_cpu",
        ),
        ("precision", "[seeds]", "agents/precision.toml: missing table [seeds]"),
        ("profiler", "max_profile_seconds = 300.0", "agents/profiler.toml: missing key [budget].max_profile_seconds"),
    ],
)
def test_a_missing_key_is_refused(agents_folder: Path, agent: str, old: str, message: str) -> None:
    # A removed table header leaves its keys to the table above: remove the keys with it.
    if old == "[seeds]":
        _edit(agents_folder, agent, old, "")
        for key in ("cpu", "cuda", "tpu"):
            text = (agents_folder / f"{agent}.toml").read_text().splitlines()
            (agents_folder / f"{agent}.toml").write_text(
                "\n".join(line for line in text if not line.startswith(f"{key} ="))
            )
    else:
        _edit(agents_folder, agent, old, "")
    assert _refusal(agent) == message


@pytest.mark.parametrize(
    "agent, old, new, message",
    [
        (
            "precision",
            "seed_bf16_min_ratio = 1.0",
            'seed_bf16_min_ratio = "one"',
            "agents/precision.toml: [hardware].seed_bf16_min_ratio must be a number, not 'one'",
        ),
        (
            "precision",
            "skip_float16_on_cpu = true",
            "skip_float16_on_cpu = 1",
            "agents/precision.toml: [validate].skip_float16_on_cpu must be true or false, not 1",
        ),
        (
            "compile",
            'cpu = ["inductor"]',
            "cpu = [3]",
            "agents/compile.toml: [seeds].cpu[0] must be a string or a table, not 3",
        ),
        (
            "precision",
            'cpu = [{ autocast = "bfloat16" }',
            "cpu = [{ autocast = 16 }",
            "agents/precision.toml: [seeds].cpu[0].autocast must be a string, not 16",
        ),
        ("profiler", "top = 10", "top = true", "agents/profiler.toml: [operators].top must be an integer, not True"),
    ],
)
def test_a_wrong_type_is_refused(agents_folder: Path, agent: str, old: str, new: str, message: str) -> None:
    _edit(agents_folder, agent, old, new)
    assert _refusal(agent) == message


def test_an_integer_is_a_number_and_a_user_file_overrides_the_profiler_keys_it_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    override = tmp_path / "slow.toml"
    override.write_text("[budget]\nmax_step_seconds = 600\n")
    settings = ProfilerSettings.load(override)
    assert settings.max_step_seconds == 600.0 and isinstance(settings.max_step_seconds, float)
    assert settings.max_profile_seconds == ProfilerSettings().max_profile_seconds
    (tmp_path / "agents").mkdir()  # a user's own agents/profiler.toml is an override file too
    (tmp_path / "agents" / "profiler.toml").write_text("[warmup]\nmax_steps = 5\n")
    monkeypatch.chdir(tmp_path)
    assert ProfilerSettings.load("agents/profiler.toml").warmup_max_steps == 5
    typo = tmp_path / "typo.toml"
    typo.write_text("[timng]\nmin_steps = 50\n")
    with pytest.raises(DefinitionError, match=rf"^{typo}: unknown table \[timng\] \(known: agent, warmup, timing,"):
        ProfilerSettings.load(typo)


def test_another_agents_definition_is_refused_by_its_name() -> None:
    with pytest.raises(
        DefinitionError,
        match=r"^agents/precision.toml: \[agent\].name is 'precision': this file "
        r"defines the precision agent, not the profiler agent$",
    ):
        ProfilerSettings.load("precision")
    with pytest.raises(DefinitionError, match="unknown agent 'compiel'; known: compile, precision"):
        load_tuning_agent_definition("compiel")


def test_an_agent_given_parsed_toml_checks_it() -> None:
    from tpu_tuner.tuning.agents import PrecisionAgent

    data = load_definition("agents", "precision")
    assert PrecisionAgent(data, "cpu").definition.validate.skip_high_on_cpu is True
    data["validate"]["skip_hihg_on_cpu"] = False
    with pytest.raises(DefinitionError, match=r"unknown key \[validate\].skip_hihg_on_cpu"):
        PrecisionAgent(data, "cpu")


@pytest.mark.parametrize(
    "text, message",
    [
        ('[spaec]\nname = "x"\n', "unknown table [spaec] (known: param, space)"),
        ('[space]\nnmae = "x"\n', "unknown key [space].nmae (known: name, description)"),
        ("[space]\nname = 3\n", "[space].name must be a string, not 3"),
        ("params = []\n", "unknown key params (known: param, space)"),
    ],
)
def test_a_typo_in_a_search_space_top_level_is_refused(tmp_path: Path, text: str, message: str) -> None:
    from tpu_tuner.tuning.search.search_space import SearchSpace

    path = tmp_path / "space.toml"
    path.write_text(text + '[[param]]\nname = "autocast"\nagent = "precision"\nchoices.cpu = ["none", "bfloat16"]\n')
    with pytest.raises(DefinitionError) as info:
        SearchSpace.load(path, "cpu")
    assert str(info.value) == f"{path}: {message}"


def _no_worker(self, env):
    raise AssertionError("a worker was started: the model would have run")


def test_tune_refuses_a_bad_agent_definition_before_any_worker_starts(
    agents_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpu_tuner.cli import main
    from tpu_tuner.runner.trial_runner import TrialRunner

    monkeypatch.setattr(TrialRunner, "_start", _no_worker)
    _edit(agents_folder, "compile", "require_cxx_for_inductor_on_cpu = true", "require_cxx_for_inductor_on_cpus = true")
    status = main(["tune", str(EXAMPLES / "mlp.py"), "--out", str(tmp_path / "results")])
    assert status == 2
    assert (
        "agents/compile.toml: unknown key [validate].require_cxx_for_inductor_on_cpus "
        "(known: require_cxx_for_inductor_on_cpu)"
    ) in capsys.readouterr().err
    assert not (tmp_path / "results").exists()


def test_profile_refuses_a_bad_agent_file_before_any_worker_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpu_tuner.cli import main
    from tpu_tuner.runner.trial_runner import TrialRunner

    monkeypatch.setattr(TrialRunner, "_start", _no_worker)
    bad = tmp_path / "fast.toml"
    bad.write_text("[timing]\nmin_steps = 5\nmax_step = 50\n")
    status = main(["profile", str(EXAMPLES / "mlp.py"), "--agent", str(bad), "--out", str(tmp_path / "results")])
    assert status == 2
    assert f"{bad}: unknown key [timing].max_step (known: min_steps, min_seconds, max_steps)" in capsys.readouterr().err
    assert not (tmp_path / "results").exists()

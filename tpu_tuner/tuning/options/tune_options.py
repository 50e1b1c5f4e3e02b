"""Options of a tuning run: immutable, in sections, each with its defaults, checks and flags.

`TuneOptions` holds five frozen sections: `search` (what to search, how long), `objective` (what
a setting is judged by), `runner` (how a trial runs), `store` (where the study is stored, whether
shared or resumed) and `outputs` (where the run folder goes), defined in `search_options.py` and
`runner_options.py`. A section checks itself when built
(`UserInputError` naming the flag), `TuneOptions` what spans sections; each field that has a flag
names it (`tpu_tuner.core.flags`), so `tpu-tune tune`'s flags are generated from here. A run never
changes its options: what it resolves (the budget, the trial settings, a shared study's options)
is a new value (``dataclasses.replace(options, search=replace(options.search, trials=12))``).
Stored forms (result.json, a shared study's record) are flat, one key a field: `to_plain` and
`from_plain`, their keys `PLAIN_KEYS` (a file format: they never change).

This module imports no torch (the CLI checks options before torch is loaded); the sampler names
come from the sampler factory, with optuna.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.field_types import check_field_types
from tpu_tuner.tuning.options.runner_options import OutputOptions, RunnerOptions, StoreOptions, default_trial_settings
from tpu_tuner.tuning.options.search_options import ObjectiveOptions, SearchOptions


@dataclass(frozen=True)
class TuneOptions:
    """How long to search, what to search, and the guardrails: five frozen sections
    (``TuneOptions(search=SearchOptions(trials=20), runner=RunnerOptions(device="cpu"))``)."""

    search: SearchOptions = field(default_factory=SearchOptions)
    objective: ObjectiveOptions = field(default_factory=ObjectiveOptions)
    runner: RunnerOptions = field(default_factory=RunnerOptions)
    store: StoreOptions = field(default_factory=StoreOptions)
    outputs: OutputOptions = field(default_factory=OutputOptions)

    def __post_init__(self) -> None:
        """What spans sections: a plan needs several ranks, hosts meet under a study's name."""
        check_field_types(self)  # the Python API may pass any value
        if self.search.plan is not None and self.runner.ranks == 1:
            raise UserInputError("--plan seeds sharding layouts, which need several ranks: give --nproc N (N > 1)")
        if self.runner.nnodes > 1 and self.store.study is None:
            raise UserInputError(
                f"--nnodes {self.runner.nnodes}: give --study NAME (with --storage): the hosts meet under "
                "the study's name, and relaunching the same commands resumes it"
            )

    def to_plain(self) -> dict[str, Any]:
        """The flat JSON form (result.json, a shared study's record): every option by its key,
        the storage URL without its password (a record is read by anyone who can read the study)."""
        from tpu_tuner.core.credentials import without_password
        from tpu_tuner.core.plain_data import json_default

        sections = {section: dataclasses.asdict(getattr(self, section)) for section in SECTIONS}
        plain = {key: sections[section][name] for key, (section, name) in PLAIN_KEYS.items()}
        plain["storage"] = without_password(self.store.url) if self.store.url else None
        return json.loads(json.dumps(plain, default=json_default))

    @classmethod
    def from_plain(cls, data: Mapping[str, Any], base: TuneOptions | None = None) -> TuneOptions:
        """Options from their flat JSON form (`to_plain`, or a file of an earlier version): the
        keys it holds over `base` (default: the defaults); keys no section declares are ignored."""
        from tpu_tuner.core.plain_data import from_plain
        from tpu_tuner.profiling.settings import ProfilerSettings

        names = {"ProfilerSettings": ProfilerSettings}
        base = base or cls()
        changes: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
        for key, value in data.items():
            if key in PLAIN_KEYS:
                section, name = PLAIN_KEYS[key]
                hint = get_type_hints(SECTIONS[section], localns=names)[name]
                changes[section][name] = from_plain(hint, value, names)
        return cls(**{section: dataclasses.replace(getattr(base, section), **changes[section]) for section in SECTIONS})

    def preflight(self) -> TuneOptions:
        """Everything that can be checked without running the model, in seconds and without
        importing torch: the search space, the agents' definitions, the length sample's file and
        the storage URL (parsed, driver installed, server reachable); the numbers were checked
        when the sections were built. Called before any run folder exists, so a refused start
        leaves nothing behind (docs/run-safety.md). Returns the options the run uses: with the
        storage URL of $TPU_TUNE_STORAGE where none was given (and the run does not resume)."""
        from tpu_tuner.studies.storage import check_storage, storage_from_environment

        checked = self
        if self.store.url is None and self.store.resume is None:
            checked = dataclasses.replace(self, store=dataclasses.replace(self.store, url=storage_from_environment()))
        _check_space(self.search.space, self.runner.device)
        _check_agents(self.search.agents)
        lengths_file = self.objective.lengths_file
        if lengths_file is not None and not Path(lengths_file).is_file():
            raise UserInputError("length sample file not found", lengths_file)
        if self.search.plan is not None and not (Path(self.search.plan) / "plan.json").is_file():
            raise UserInputError("not a plan folder (no plan.json; `tpu-tune plan` writes one)", self.search.plan)
        if self.store.resume is not None:
            if not (Path(self.store.resume) / "run.json").is_file():
                raise UserInputError("not a tuning run folder (no run.json)", self.store.resume)
            from tpu_tuner.studies.run_file import check_resumable

            check_resumable(Path(self.store.resume))  # damaged, newer or held: before the model loads
        if checked.store.url is not None:
            check_storage(checked.store.url)
        return checked


# The sections by attribute name: TuneOptions' fields, each typed by its section's class.
SECTIONS: dict[str, type] = get_type_hints(TuneOptions)
# The stored form's key of each field, (section, field): the field's name, but `storage` for the URL.
PLAIN_KEYS: dict[str, tuple[str, str]] = {
    ("storage" if f.name == "url" else f.name): (section, f.name)
    for section, cls in SECTIONS.items()
    for f in dataclasses.fields(cls)
}


def _check_space(space: str | Path, device: str | None) -> None:
    """Load the space as a run would: on the named device, or (auto) on at least one registered backend."""
    from tpu_tuner.core.errors import DefinitionError
    from tpu_tuner.devices import names as backend_names
    from tpu_tuner.tuning.search.search_space import SearchSpace

    kinds = [device] if device and device != "auto" else sorted(backend_names())
    errors: list[DefinitionError] = []
    for kind in kinds:
        try:
            SearchSpace.load(space, kind)
            return
        except DefinitionError as exc:
            if not str(exc).endswith(f"no parameters for device {kind!r}"):
                raise  # malformed: wrong on every device
            errors.append(exc)
    raise errors[0]


def _check_agents(agents: tuple[str, ...]) -> None:
    """Load each agent's definition against its schema (torch-free), so that a typo in an
    agents/*.toml file is refused before the baseline profile runs, not after it."""
    from tpu_tuner.tuning.agents.schema import load_tuning_agent_definition

    for agent in agents:
        load_tuning_agent_definition(agent)


__all__ = [
    "PLAIN_KEYS",
    "SECTIONS",
    "ObjectiveOptions",
    "OutputOptions",
    "RunnerOptions",
    "SearchOptions",
    "StoreOptions",
    "TuneOptions",
    "default_trial_settings",
]

"""Search spaces: declarative TOML (search_spaces/*.toml) replayed as Optuna define-by-run calls.

A parameter is a registered knob (`tpu_tuner.knobs`) searched as a categorical with choices per
device kind; its first choice is the baseline. A knob may be conditional (`Conditional`: inductor's
options only under ``execution = inductor``): `suggest` asks for it only where it is active, as
Optuna's define-by-run allows (TPE models the parameter over the trials that have it), and a
setting where it is inactive leaves it out. `settings()` enumerates only valid settings, each once;
`size()` counts them and the grid sampler walks them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import optuna

from tpu_tuner.core.definitions import load_definition
from tpu_tuner.core.errors import DefinitionError
from tpu_tuner.knobs import registry as knobs
from tpu_tuner.knobs.candidate import Candidate
from tpu_tuner.knobs.capabilities import (
    CANNOT_RUN,
    Conditional,
    DeviceBaseline,
    NarrowedByWorkload,
    SpreadsOverRanks,
)
from tpu_tuner.knobs.traits import WorkloadTraits, of_profile

if TYPE_CHECKING:
    from tpu_tuner.profiling.profile import Profile

# The parameters a space may search: the registered knobs.
KNOWN_PARAMS = knobs.names()


@dataclass(frozen=True)
class Param:
    """One searched knob: its name, owning agent and choices on this device."""

    name: str
    agent: str
    choices: tuple[str, ...]
    help: str = ""


@dataclass(frozen=True)
class SearchSpace:
    """The knobs searched on one device kind."""

    name: str
    device_kind: str
    params: tuple[Param, ...]
    # What `for_workload` left out and why, one line each ("memory_format: ...").
    left_out: tuple[str, ...] = ()
    # The processes each trial runs on (--nproc): the sharding layouts are those of this many.
    ranks: int = 1

    @classmethod
    def load(cls, name_or_path: str | Path, device_kind: str, ranks: int = 1) -> SearchSpace:
        data = load_definition("search_spaces", name_or_path)
        where = str(name_or_path)
        params = []
        for entry in data.get("param", []):
            name = entry.get("name")
            if name not in KNOWN_PARAMS:
                raise DefinitionError(f"unknown parameter {name!r}; known: {', '.join(KNOWN_PARAMS)}", where)
            unknown = set(entry) - {"name", "agent", "choices", "help"}
            if unknown:
                raise DefinitionError(f"parameter {name}: unknown keys {sorted(unknown)}", where)
            wrong = _wrong_entry(entry)
            if wrong:
                raise DefinitionError(f"parameter {name}: {wrong}", where)
            knob = knobs.get(name)
            try:
                choices = knob.choices(device_kind, entry, ranks)  # rejects bad choices at load time
            except ValueError as exc:
                bad = next((c for c in entry.get("choices", {}).get(device_kind, []) if not _valid(knob, c)), None)
                raise DefinitionError(f"parameter {name}: bad choice {bad!r}: {exc}", where) from exc
            if not choices:
                continue  # not searched on this device
            params.append(Param(name, entry.get("agent", knob.agent), choices, entry.get("help", "")))
        if not params:
            raise DefinitionError(f"no parameters for device {device_kind!r}", where)
        return cls(
            name=data.get("space", {}).get("name", where), device_kind=device_kind, params=tuple(params), ranks=ranks
        )

    @classmethod
    def for_profile(cls, name_or_path: str | Path, profile: Profile, ranks: int = 1) -> SearchSpace:
        """The space on the profiled device, narrowed to what can change the profiled workload's
        step (`for_workload` with the traits the profile recorded, knobs/traits.py)."""
        loaded = cls.load(name_or_path, profile.device.kind, ranks).starting_from(profile.fitted_to_memory)
        return loaded.for_workload(of_profile(profile.workload))

    def starting_from(self, values: dict[str, str]) -> SearchSpace:
        """This space with `values` as its first choices (the baseline's): a step too large for
        the device is tuned from the memory setting it was profiled under (profiling/memory_fit.py).
        A value the space does not list is added, first; a knob the space lacks is added fixed."""
        if not values:
            return self
        params = []
        for p in self.params:
            first = values.get(p.name)
            choices = p.choices if first is None else (first, *(c for c in p.choices if c != first))
            params.append(Param(p.name, p.agent, choices, p.help))
        listed = {p.name for p in self.params}
        params += [Param(n, knobs.get(n).agent, (v,), "fitted to memory") for n, v in values.items() if n not in listed]
        return replace(self, params=tuple(params))

    def for_workload(self, traits: WorkloadTraits | None) -> SearchSpace:
        """This space narrowed to what can change `traits`' step: knobs that cannot
        and choices that cannot run (`NarrowedByWorkload` knobs) are left out, each noted in
        `left_out`. A knob left out keeps its baseline value, so every setting
        of the narrowed space is a setting of this one. No traits (a profile written before
        they were recorded): the space as it is."""
        if traits is None:
            return self
        params, left_out = [], list(self.left_out)
        for p in self.params:
            knob = knobs.get(p.name)
            if not isinstance(knob, NarrowedByWorkload):
                params.append(p)
                continue
            if len(p.choices) > 1 and not knob.applies_to_workload(traits):
                left_out.append(f"{p.name}: {knob.not_applicable} (kept at {p.choices[0]})")
                params.append(Param(p.name, p.agent, p.choices[:1], p.help))
                continue
            refusals = {
                c: reason
                for i, c in enumerate(p.choices)
                if i > 0 and (reason := knob.choice_refusal(knob.check(c), traits)) is not None
            }
            kept = tuple(c for c in p.choices if c not in refusals)
            generic = [c for c, reason in refusals.items() if reason == CANNOT_RUN]
            if generic:
                left_out.append(f"{p.name}: {', '.join(generic)} {CANNOT_RUN}")
            left_out += [f"{p.name}: {c}: {reason}" for c, reason in refusals.items() if c not in generic]
            params.append(Param(p.name, p.agent, kept, p.help))
        return SearchSpace(self.name, self.device_kind, tuple(params), tuple(left_out), self.ranks)

    def tensor_within_hosts(self, nproc: int) -> SearchSpace:
        """This space without the layouts whose tensor groups would span hosts of `nproc` ranks
        each (`SpreadsOverRanks.within_hosts`), each noted in `left_out`: tensor parallelism
        all-reduces activations in every block, traffic for a host's own interconnect rather than
        the network between hosts (--tensor-across-hosts)."""
        params, left_out = [], list(self.left_out)
        for p in self.params:
            knob = knobs.get(p.name)
            if not isinstance(knob, SpreadsOverRanks):
                params.append(p)
                continue
            kept = tuple(c for c in p.choices if knob.within_hosts(knob.check(c), nproc))
            dropped = [c for c in p.choices if c not in kept]
            if dropped:
                left_out.append(
                    f"{p.name}: {', '.join(dropped)}: the tensor axis would span hosts ({nproc} rank"
                    f"{'s' if nproc > 1 else ''} a host; --tensor-across-hosts allows it)"
                )
            params.append(Param(p.name, p.agent, kept, p.help))
        return SearchSpace(self.name, self.device_kind, tuple(params), tuple(left_out), self.ranks)

    @property
    def searched(self) -> tuple[Param, ...]:
        """Parameters with more than one choice here."""
        return tuple(p for p in self.params if len(p.choices) > 1)

    def baseline_params(self) -> dict[str, str]:
        """The baseline's searched parameters (first choices; conditional ones only where active)."""
        return self.normalize({p.name: p.choices[0] for p in self.searched})

    def baseline_value(self, name: str) -> str:
        """The baseline choice of parameter `name` (also of a conditional one the baseline lacks)."""
        return next(p.choices[0] for p in self.params if p.name == name)

    def spreads_over_ranks(self) -> bool:
        """Whether a parameter spreads a step over processes (`SpreadsOverRanks`: the layout); a
        run of N ranks without one would time N unsharded copies of one step."""
        return bool(self.placements())

    def placements(self) -> tuple[str, ...]:
        """The choices of the parameters that place a step across ranks and hosts (the layouts)."""
        return tuple(c for p in self.params if isinstance(knobs.get(p.name), SpreadsOverRanks) for c in p.choices)

    def _active(self, name: str, settings: dict[str, Any]) -> bool:
        """Whether knob `name` means anything under `settings` (`Conditional`; others always do)."""
        knob = knobs.get(name)
        return not isinstance(knob, Conditional) or knob.active(settings)

    def _fixed(self) -> dict[str, str]:
        """The values of parameters with one choice here (conditions may read them)."""
        return {p.name: p.choices[0] for p in self.params if len(p.choices) == 1}

    def _ordered(self) -> list[Param]:
        """Searched parameters in registry order, so a knob's condition is decided before it."""
        order = {name: i for i, name in enumerate(KNOWN_PARAMS)}
        return sorted(self.searched, key=lambda p: order[p.name])

    def normalize(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` without the conditional parameters that are inactive under the others (a
        setting has them only where they mean something), in registry order."""
        context = {**self._fixed(), **params}
        return {p.name: params[p.name] for p in self._ordered() if p.name in params and self._active(p.name, context)}

    def complete(self, params: dict[str, Any]) -> dict[str, Any]:
        """`params` with every active searched parameter it lacks at its baseline choice (a seed
        naming ``execution = inductor`` gets inductor's default options), inactive ones left out:
        a whole setting, as an enqueued trial must be (a sampler is not asked for the rest)."""
        context = {**self._fixed(), **params}
        for p in self._ordered():
            if p.name not in context and self._active(p.name, context):
                context[p.name] = p.choices[0]
        return self.normalize({p.name: context[p.name] for p in self._ordered() if p.name in context})

    def suggest(self, trial: optuna.Trial) -> dict[str, str]:
        """Define-by-run: ask the trial for every searched parameter that is active under the
        values suggested before it (registry order)."""
        chosen: dict[str, str] = {}
        context = self._fixed()
        for p in self._ordered():
            if self._active(p.name, context):
                chosen[p.name] = context[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        return chosen

    def settings(self) -> list[dict[str, str]]:
        """Every valid setting of the searched parameters, each once (a conditional parameter
        appears only where active), in grid order. Walked as `suggest` asks: a parameter
        inactive under the values before it is skipped, not multiplied out and merged again
        (docs/many-workers.md has its time)."""
        ordered, fixed, found = self._ordered(), self._fixed(), []

        def walk(index: int, context: dict[str, str]) -> None:
            if index == len(ordered):
                found.append({name: value for name, value in context.items() if name not in fixed})
                return
            param = ordered[index]
            if not self._active(param.name, context):
                walk(index + 1, context)
                return
            for choice in param.choices:
                walk(index + 1, {**context, param.name: choice})

        walk(0, fixed)
        return found

    def grid(self) -> dict[str, list[str]]:
        """Every searched parameter's choices (the product; `settings()` is what a grid walks)."""
        return {p.name: list(p.choices) for p in self.searched}

    def size(self) -> int:
        """The number of valid settings."""
        return len(self.settings())

    def to_candidate(self, params: dict[str, Any]) -> Candidate:
        """A Candidate from parameter values (unsearched parameters take their only choice;
        conditional ones inactive under the others their knob's default; a knob the space does
        not list, the device's own value where it has one: a space without matmul_precision runs
        TorchTPU's medium, as the user's code does, not fp32's highest)."""
        try:
            values = {p.name: params.get(p.name, p.choices[0]) for p in self.params}
            context = {**self._fixed(), **values}
            unlisted = {
                name: knob.device_default(self.device_kind)
                for name, knob in knobs.REGISTRY.items()
                if isinstance(knob, DeviceBaseline) and name not in values
            }
            active = {name: value for name, value in values.items() if self._active(name, context)}
            return Candidate({**unlisted, **active})
        except ValueError as exc:
            raise DefinitionError(f"bad parameter values {params}: {exc}", self.name) from exc

    def to_params(self, candidate: Candidate) -> dict[str, str]:
        """The inverse of `to_candidate` for the searched parameters: each knob's value spelled
        as this space's choice (e.g. "eager:strict" on TPU for plain eager); inactive
        conditional parameters left out."""
        result = {}
        for p in self.searched:
            knob, value = knobs.get(p.name), candidate[p.name]
            result[p.name] = next((c for c in p.choices if knob.check(c) == value), value)
        return self.normalize(result)


def _wrong_entry(entry: dict[str, Any]) -> str | None:
    """What is malformed in a [[param]] entry's keys (None: nothing), before a knob reads them."""
    choices = entry.get("choices", {})
    if not isinstance(choices, dict) or not all(isinstance(listed, list) for listed in choices.values()):
        return f'choices must be a list per device, e.g. choices.cpu = ["a", "b"], not {choices!r}'
    return next(
        (
            f"{key} must be text, not {entry[key]!r}"
            for key in ("agent", "help")
            if key in entry and not isinstance(entry[key], str)
        ),
        None,
    )


def _valid(knob: knobs.Knob, choice: Any) -> bool:
    try:
        knob.check(choice)
    except ValueError:
        return False
    return True

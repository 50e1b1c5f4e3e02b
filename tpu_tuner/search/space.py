"""Search spaces: declarative TOML (search_spaces/*.toml) replayed as Optuna define-by-run calls.

A parameter is a registered knob (`tpu_tuner.knobs`) searched as a flat categorical with choices
per device kind; its first choice is the baseline. Flat categoricals keep grid search exact and
need no conditionals.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner import knobs
from tpu_tuner.candidate import Candidate
from tpu_tuner.definitions import load_definition
from tpu_tuner.errors import DefinitionError

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

    @classmethod
    def load(cls, name_or_path: str | Path, device_kind: str) -> "SearchSpace":
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
            knob = knobs.get(name)
            try:
                choices = knob.choices(device_kind, entry)  # rejects bad choices at load time
            except ValueError as exc:
                bad = next((c for c in entry.get("choices", {}).get(device_kind, []) if not _valid(knob, c)), None)
                raise DefinitionError(f"parameter {name}: bad choice {bad!r}: {exc}", where) from exc
            if not choices:
                continue  # not searched on this device
            params.append(Param(name, entry.get("agent", knob.agent), choices, entry.get("help", "")))
        if not params:
            raise DefinitionError(f"no parameters for device {device_kind!r}", where)
        return cls(name=data.get("space", {}).get("name", where), device_kind=device_kind, params=tuple(params))

    @property
    def searched(self) -> tuple[Param, ...]:
        """Parameters with more than one choice here."""
        return tuple(p for p in self.params if len(p.choices) > 1)

    def baseline_params(self) -> dict[str, str]:
        return {p.name: p.choices[0] for p in self.searched}

    def suggest(self, trial: optuna.Trial) -> dict[str, str]:
        """Define-by-run: ask the trial for every searched parameter."""
        return {p.name: trial.suggest_categorical(p.name, list(p.choices)) for p in self.searched}

    def grid(self) -> dict[str, list[str]]:
        """The search space as Optuna's GridSampler wants it."""
        return {p.name: list(p.choices) for p in self.searched}

    def size(self) -> int:
        return len(list(itertools.product(*(p.choices for p in self.searched))))

    def to_candidate(self, params: dict[str, Any]) -> Candidate:
        """A Candidate from parameter values (unsearched parameters take their only choice)."""
        try:
            return Candidate({p.name: params.get(p.name, p.choices[0]) for p in self.params})
        except ValueError as exc:
            raise DefinitionError(f"bad parameter values {params}: {exc}", self.name) from exc

    def to_params(self, candidate: Candidate) -> dict[str, str]:
        """The inverse of `to_candidate` for the searched parameters: each knob's value spelled
        as this space's choice (e.g. "eager:strict" on TPU for plain eager)."""
        result = {}
        for p in self.searched:
            knob, value = knobs.get(p.name), candidate[p.name]
            result[p.name] = next((c for c in p.choices if knob.check(c) == value), value)
        return result


def _valid(knob: knobs.Knob, choice: Any) -> bool:
    try:
        knob.check(choice)
    except ValueError:
        return False
    return True

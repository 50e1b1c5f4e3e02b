"""Search spaces: declarative TOML (search_spaces/*.toml) replayed as Optuna define-by-run calls.

A parameter is a flat categorical with choices per device kind; its first choice is the
baseline. Flat categoricals keep grid search exact and need no conditionals.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna

from tpu_tuner.candidate import Candidate
from tpu_tuner.definitions import load_definition
from tpu_tuner.errors import DefinitionError

KNOWN_PARAMS = ("execution", "matmul_precision", "autocast")


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
            choices = entry.get("choices", {}).get(device_kind)
            if not choices:
                continue  # not searched on this device
            for choice in choices:
                _apply_choice(Candidate(), name, choice, where)  # reject bad choices at load time
            params.append(Param(name, entry.get("agent", ""), tuple(choices), entry.get("help", "")))
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
        candidate = Candidate()
        for p in self.params:
            candidate = _apply_choice(candidate, p.name, params.get(p.name, p.choices[0]), self.name)
        return candidate

    def to_params(self, candidate: Candidate) -> dict[str, str]:
        """The inverse of `to_candidate` for the searched parameters."""
        values = {
            "execution": _execution_label(candidate, self.device_kind),
            "matmul_precision": candidate.matmul_precision,
            "autocast": candidate.autocast_dtype or "none",
        }
        return {p.name: values[p.name] for p in self.searched}


def _apply_choice(candidate: Candidate, name: str, choice: str, where: str) -> Candidate:
    settings = candidate.to_dict()
    if name == "execution":
        head, _, tail = choice.partition(":")
        if head == "eager":
            settings.update(compile_backend=None, compile_mode=None, eager_mode=tail or "strict")
        else:
            settings.update(compile_backend=head, compile_mode=tail or None)
    elif name == "matmul_precision":
        settings["matmul_precision"] = choice
    elif name == "autocast":
        settings["autocast_dtype"] = None if choice == "none" else choice
    try:
        return Candidate.from_dict(settings)
    except ValueError as exc:
        raise DefinitionError(f"parameter {name}: bad choice {choice!r}: {exc}", where) from exc


def _execution_label(candidate: Candidate, device_kind: str) -> str:
    if candidate.compile_backend is None:
        return f"eager:{candidate.eager_mode}" if device_kind == "tpu" else "eager"
    return candidate.compile_backend + (f":{candidate.compile_mode}" if candidate.compile_mode else "")

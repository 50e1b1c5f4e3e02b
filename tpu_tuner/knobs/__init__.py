"""The knob registry: every module of this package that defines a `Knob` subclass adds a knob.

Everything that lists knobs reads this registry (the search space's known parameters, the trials
table's columns, the dashboard, the tuned config's [settings], provenance), so adding a knob is
one new module here plus its choices in ``search_spaces/default.toml``.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from tpu_tuner.knobs.base import Knob

__all__ = ["Knob", "REGISTRY", "get", "names"]


def _discover() -> dict[str, Knob]:
    found: list[Knob] = []
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name == "base":
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Knob) and cls is not Knob and cls.__module__ == module.__name__:
                found.append(cls())
    found.sort(key=lambda knob: (knob.position, knob.name))
    registry: dict[str, Knob] = {}
    for knob in found:
        if knob.name in registry:
            raise RuntimeError(f"two knobs are named {knob.name!r}")
        registry[knob.name] = knob
    return registry


# name -> knob, in `position` order.
REGISTRY: dict[str, Knob] = _discover()


def names() -> tuple[str, ...]:
    """The registered knob names, in order."""
    return tuple(REGISTRY)


def get(name: str) -> Knob:
    """The knob called `name`; KeyError naming the known knobs otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown knob {name!r}; known: {', '.join(REGISTRY)}") from None

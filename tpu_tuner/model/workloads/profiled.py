"""The workload as the profiler ran it: `Profile.workload`, typed.

One `training` flag answers "is it a training step" for every reader (the agents, the knob
traits); profile.json keeps its table (name, source, convention, step, batch_size, seq_len,
notes, traits, and dims where recorded) key for key, so files written before read back and files
written now read the same in the dashboard and the warm start, which read profile.json as plain
JSON.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from tpu_tuner.model.workloads.input_dims import InputDims, recorded_dims

TRAINING_STEP = "training step"
INFERENCE_STEP = "inference (forward)"


def step_kind(training: bool) -> str:
    """The step's words in reports and profile.json ("training step" or "inference (forward)")."""
    return TRAINING_STEP if training else INFERENCE_STEP


@dataclass(frozen=True)
class ProfiledWorkload(Mapping[str, Any]):
    """Name, file, step kind and sizes of the profiled workload, and the knob traits recorded.

    Reads as the profile.json table too (``workload["batch_size"]``, ``.get("notes")``), so code
    that indexes it as a dict keeps working.
    """

    name: str
    source: str
    convention: str  # "native" or "benchmark" (model/workloads/loader.py)
    training: bool  # a training step (forward, backward, optimizer), not inference
    batch_size: int | None = None  # the batch the step ran (after any resize)
    seq_len: int | None = None
    notes: tuple[str, ...] = ()
    # What knobs are narrowed by (knobs/traits.py owns their schema), less `training`, which is
    # the flag above; None for a profile written before traits were recorded.
    traits: dict[str, Any] | None = None
    # Which input sizes are the batch and the sequence, as the file declares them (model/workloads/input_dims.py,
    # read where the file was imported); None where not recorded.
    dims: InputDims | None = None

    @property
    def step(self) -> str:
        return step_kind(self.training)

    def sizes(self, signature: Any = None, requested: tuple[int | None, int | None] = (None, None)) -> str:
        """Batch and sequence for a header, as the workload declares them: the recorded `dims`,
        else what its convention and sizes allow (`signature`: its inputs' recorded shapes;
        `requested`: the run's --batch-size and --seq-len), never a batch it cannot tell."""
        return (
            self.dims or recorded_dims(self.convention, self.batch_size, self.seq_len, signature, requested)
        ).describe()

    def to_dict(self) -> dict[str, Any]:
        """The profile.json table, keys in the order profile.json has always had them."""
        data: dict[str, Any] = {
            "name": self.name,
            "source": self.source,
            "convention": self.convention,
            "step": self.step,
            "batch_size": self.batch_size,
            "seq_len": self.seq_len,
            "notes": list(self.notes),
        }
        if self.traits is not None:
            data["traits"] = {"training": self.training, **self.traits}
        if self.dims is not None:
            data["dims"] = self.dims.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfiledWorkload:
        """From a profile.json table. The flag is the traits' where they hold one, else the step's
        words (profiles written before traits were recorded); TypeError when a name is missing."""
        missing = [key for key in ("name", "source", "convention") if key not in data]
        if missing:
            raise TypeError(f"profile workload table without {', '.join(missing)}")
        traits = data.get("traits")
        traits = dict(traits) if isinstance(traits, Mapping) else None
        recorded = traits.pop("training", None) if traits is not None else None
        training = recorded if isinstance(recorded, bool) else str(data.get("step", "")).startswith("training")
        return cls(
            name=str(data["name"]),
            source=str(data["source"]),
            convention=str(data["convention"]),
            training=training,
            batch_size=_int_or_none(data.get("batch_size")),
            seq_len=_int_or_none(data.get("seq_len")),
            notes=tuple(str(note) for note in data.get("notes") or ()),
            traits=traits,
            dims=InputDims.from_dict(data["dims"]) if isinstance(data.get("dims"), Mapping) else None,
        )

    # Read-only mapping access to the profile.json table.
    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_dict())

    def __len__(self) -> int:
        return len(self.to_dict())


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)

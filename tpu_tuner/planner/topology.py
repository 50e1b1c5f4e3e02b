"""TPU slice names as users write them, mapped to chips, devices and a physical torus shape.

* ``v5p-256``, ``v4-64``: v4 and v5p slice names count TensorCores (two per chip), so v5p-256
  is 128 chips;
* ``v5e-16``, ``v6e-64``: v5e and v6e names count chips;
* ``tpu7x-128``: counted in chips here (Google's TPU7x slice naming was not verifiable; the
  docs/planner.md says so); each TPU7x chip is two devices;
* ``v5p:8x8x8``, ``v6e:16x16``, ``tpu7x:2x2x1``: an explicit physical shape in chips.

The physical shape is what ``jax.experimental.topologies.get_topology_desc`` takes; with
``slices`` > 1 the topology is that many such slices joined by the data-center network (DCN),
which the same call compiles for through its ``num_slices`` (docs/planner.md, "The whole mesh").
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from tpu_tuner.core.errors import UserInputError
from tpu_tuner.core.flags import at_least
from tpu_tuner.core.hardware import TPU_CHIPS, TpuChip
from tpu_tuner.model.meshes.layouts import Layout

# Generations that JAX and TorchTPU run as megacore: one device per chip driving both TensorCores
# with the chip's whole HBM (v4; MaxText's v4 scripts set TPU_MEGACORE=MEGACORE_DENSE,
# https://github.com/AI-Hypercomputer/maxtext/blob/main/MaxText/configs/v4/22b.sh). libtpu's
# compile-only default is one device per TensorCore, so the planner asks for the megacore chip
# configuration (request.topology_devices): the compiler then partitions for 64 devices of
# 30.75 GiB each on a v4-128 instead of 128 of 15.25 GiB.
MEGACORE = ("v4",)

# Standard slice shapes by chip count: 2D tori for v5e/v6e, 3D for v4/v5p/TPU7x.
# 1: one-chip machines (v5litepod-1: https://cloud.google.com/tpu/docs/v5e; v6e-1: .../tpu/docs/v6e).
_SHAPES_2D = {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16), 256: (16, 16)}
_SHAPES_3D = {
    4: (2, 2, 1),
    8: (2, 2, 2),
    16: (2, 2, 4),
    32: (2, 4, 4),
    64: (4, 4, 4),
    128: (4, 4, 8),
    256: (4, 8, 8),
    512: (8, 8, 8),
    1024: (8, 8, 16),
    2048: (8, 16, 16),
    4096: (16, 16, 16),
    8192: (16, 16, 32),
    9216: (16, 24, 24),
}


# Data-center network bandwidth per chip, Gbit/s, from Google Cloud's spec pages (2026-12-02):
# v5p states it ("Data center network (DCN) bandwidth per chip (Gbps): 50",
# https://cloud.google.com/tpu/docs/v5p); v5e and v6e state it per host, 8 chips each ("Per-host NIC
# configuration": 2 x 100 and 4 x 200 Gbps, the same as "Data center network bandwidth per Pod" 6.4
# and 25.6 Tbps over 256 chips, https://cloud.google.com/tpu/docs/v6e). v4 and TPU7x state none
# found here: v5p's figure stands in (DCN_FALLBACK_GBITS), and the plan says so.
DCN_GBITS_PER_CHIP = {"v5e": 25.0, "v5p": 50.0, "v6e": 100.0}
DCN_FALLBACK_GBITS = 50.0


@dataclass(frozen=True)
class Topology:
    """A TPU slice: its generation, chip and device counts, and physical shape in chips."""

    name: str  # as the user wrote it
    chip: TpuChip
    shape: tuple[int, ...]
    # What the TPU compiler says once asked (`as_compiled`): its device count (libtpu's
    # compile-only v4 has one device per TensorCore, where TorchTPU counts one per chip) and its
    # HBM limit per device (planner/compiler/hbm.py). None: the published figures stand in.
    compiler_devices: int | None = None
    compiler_hbm_bytes: int | None = None
    slices: int = 1  # slices of `shape` joined by DCN (multi-slice)

    @property
    def chips(self) -> int:
        """Chips of every slice together."""
        return math.prod(self.shape) * self.slices

    @property
    def dcn_stated(self) -> bool:
        """Whether Google states this generation's DCN bandwidth (else DCN_FALLBACK_GBITS stands in)."""
        return self.chip.generation in DCN_GBITS_PER_CHIP

    @property
    def dcn_gbits_per_chip(self) -> float:
        """The generation's DCN bandwidth per chip, Gbit/s (each way): Google's, else DCN_FALLBACK_GBITS."""
        return DCN_GBITS_PER_CHIP.get(self.chip.generation, DCN_FALLBACK_GBITS)

    @property
    def dcn_bytes_per_s_per_device(self) -> float:
        """Each device's share of its host's DCN bandwidth, bytes/s (each way)."""
        return self.dcn_gbits_per_chip * 1e9 / 8 / self.devices_per_chip

    def with_slices(self, slices: int) -> Topology:
        """This slice taken `slices` times (one line of error where that is no count of slices)."""
        at_least(1, ("--slices", slices))  # the slice count's one check (options.PlanTarget parses through here)
        return replace(self, slices=slices)

    def check_layout(self, layout: Layout) -> None:
        """Refuse, in one line, a `--layout` whose DCN ways are not this slice count or whose axes do
        not place its devices (a point the search or the enumeration makes does by construction)."""
        across = f" x {self.slices} slices" if self.slices > 1 else ""
        if layout.slices != self.slices:
            why = f"spans {layout.slices} slice(s) (dcn_data x dcn_fsdp), --slices is {self.slices}: the DCN ways'"
            raise UserInputError(f"--layout {layout.short()} {why} product must be the slice count")
        if layout.devices != self.devices:
            why = f"places {layout.devices} devices; {self.name}{across} has {self.devices}: the axes'"
            raise UserInputError(f"--layout {layout.short()} {why} product must be the device count")

    @property
    def devices(self) -> int:
        return self.compiler_devices or self.chips * self.chip.devices_per_chip

    @property
    def devices_per_chip(self) -> int:
        return self.devices // self.chips

    @property
    def jax_name(self) -> str:
        """The name ``get_topology_desc`` accepts, e.g. "v5p:4x4x8"."""
        return f"{self.chip.generation}:{'x'.join(map(str, self.shape))}"

    @property
    def hbm_bytes_per_device(self) -> float:
        """The compiler's limit where known, else the chip's published HBM split over its devices."""
        if self.compiler_hbm_bytes is not None:
            return float(self.compiler_hbm_bytes)
        return self.chip.hbm_bytes_per_chip / self.devices_per_chip

    @property
    def peak_flops_per_device(self) -> float:
        return self.chip.bf16_tflops_per_chip * 1e12 / self.devices_per_chip

    @property
    def hbm_bytes_per_s_per_device(self) -> float:
        """Each device's share of its chip's HBM bandwidth, bytes/s (half the chip's on TPU7x)."""
        return self.chip.hbm_gbytes_per_s * 1e9 / self.devices_per_chip

    def as_compiled(self, device_count: int, hbm_limit: int | None) -> Topology:
        """This topology as the TPU compiler sees it: `device_count` devices (a whole number per
        chip, else a one-line error: the slice name and the compiler disagree) and its HBM limit."""
        if device_count % self.chips or device_count < self.chips:
            raise UserInputError(
                f"topology {self.name!r}: the TPU compiler sees {device_count} devices for "
                f"{self.chips} {self.chip.generation} chips ({self.jax_name})"
            )
        return replace(self, compiler_devices=device_count, compiler_hbm_bytes=hbm_limit)

    @property
    def megacore(self) -> bool:
        """One device per chip driving both TensorCores (v4 as JAX and TorchTPU run it)."""
        return self.chip.generation in MEGACORE and self.devices_per_chip == 1

    def describe(self) -> str:
        per_chip = f", {self.devices_per_chip} devices per chip" if self.devices_per_chip > 1 else ""
        if self.megacore:
            per_chip = ", megacore: one device per chip, both TensorCores"
        slices = (
            (
                f" x {self.slices} slices over DCN ({self.dcn_gbits_per_chip:.0f} "
                f"Gbit/s per chip{'' if self.dcn_stated else ', v5p figure assumed'})"
            )
            if self.slices > 1
            else ""
        )
        return (
            f"{self.name}{slices}: {self.chips} {self.chip.generation} chips ({self.jax_name}{per_chip}), "
            f"{self.devices} devices"
        )


def parse_topology(text: str) -> Topology:
    """Parse a slice name (``v5p-256``) or an explicit shape (``v5p:8x8x8``)."""
    if not isinstance(text, str):  # the Python API's caller
        raise UserInputError(f"topology must be text such as v5p-256, not {text!r}")
    cleaned = text.strip().lower()
    explicit = re.fullmatch(r"(v4|v5e|v5p|v6e|tpu7x):(\d+(?:x\d+)+)", cleaned)
    if explicit:
        chip = TPU_CHIPS[explicit.group(1)]
        shape = tuple(int(d) for d in explicit.group(2).split("x"))
        if len(shape) != chip.torus_dims:
            raise UserInputError(f"topology {text!r}: {chip.generation} is a {chip.torus_dims}D torus")
        if min(shape) < 1:
            raise UserInputError(f"topology {text!r}: every dimension must be at least 1 chip")
        topology = Topology(text, chip, shape)
    else:
        named = re.fullmatch(r"(v4|v5e|v5p|v5litepod|v6e|tpu7x|v7x)-(\d+)", cleaned)
        if not named:
            raise UserInputError(
                f"unknown topology {text!r}: write a slice name such as v5p-256, v6e-64, v5e-16, tpu7x-128, "
                "or a shape such as v5p:8x8x8"
            )
        generation = {"v5litepod": "v5e", "v7x": "tpu7x"}.get(named.group(1), named.group(1))
        chip = TPU_CHIPS[generation]
        count = int(named.group(2))
        if chip.slice_name_counts_cores:
            if count % 2:
                raise UserInputError(
                    f"topology {text!r}: {generation} slice names count TensorCores (2 per chip); use an even number"
                )
            count //= 2
        shapes = _SHAPES_3D if chip.torus_dims == 3 else _SHAPES_2D
        if count not in shapes:
            raise UserInputError(
                f"topology {text!r}: no standard {generation} slice of {count} chips; "
                f"known chip counts: {', '.join(map(str, sorted(shapes)))}"
            )
        topology = Topology(text, chip, shapes[count])
    if topology.chips > topology.chip.max_chips:
        raise UserInputError(
            f"topology {text!r}: {topology.chips} chips exceed the "
            f"{topology.chip.max_chips}-chip maximum of {topology.chip.generation}"
        )
    return topology


def parse_slices(text: str, slices: int = 1) -> list[Topology]:
    """--topology with --slices: one slice (the text as written), or several separated by commas
    that a ranking plans each; an empty or repeated entry is refused in one line."""
    parsed: dict[str, Topology] = {}
    for number, entry in enumerate([e.strip() for e in text.split(",")] if "," in text else [text], 1):
        if not entry:
            raise UserInputError(f"--topology {text!r}: entry {number} is empty")
        topology = parse_topology(entry).with_slices(slices)
        if (same := parsed.setdefault(topology.jax_name, topology)) is not topology:
            raise UserInputError(f"--topology {text!r}: {entry} is the same slice as {same.name} ({topology.jax_name})")
    return list(parsed.values())

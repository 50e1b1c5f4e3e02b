"""One iteration's work in a compiled program's scanned block loops, read from its optimised HLO.

XLA's cost analysis, and the HLO text the collectives are parsed from, hold a while loop's body
once, whatever its trip count. The planner compiles the model's blocks as one `jax.lax.scan`
(forward) and its transpose (backward), so the compiler's totals are the step's "ends"
(embedding, head, loss, optimizer) plus one block. This module finds those loops in the
optimised HLO and measures one iteration of each, so the step's work is the compiler's total
plus (blocks - 1) more iterations, from a single compile.

How one iteration is measured: the loop's body computation is made the entry of a copy of the
module and handed to XLA's own HloCostAnalysis (jaxlib's `hlo_module_cost_analysis`, run by the
CPU client, as no TPU client exists here). FLOPs are exact: that analysis counts the same FLOPs as
the TPU compiler's except Pallas kernels (custom calls), whose FLOPs the TPU analysis takes from
the kernel's own cost estimate in its backend config; this module adds those estimates the same way.
HBM bytes are XLA's generic count (each op's operands and results once, unpadded); the TPU analysis
also counts tile padding and matmul operands re-read between tiles, so these are lower (figures:
docs/planner.md, "One compile a layout").

The compiler makes while loops of its own too: FSDP's windowed einsums
(``windowed_dot_general_body_ag`` / ``_rs``), an all-gather or reduce-scatter decomposed into
collective-permutes around slices of a matmul, a few iterations each. They are counted once as
well, inside the block loops and outside them; `windowed_uncounted` measures their other
iterations' FLOPs and collectives (trip count read from the loop's counter) so that a step's
work is whole. Not their HBM bytes: the generic count of a windowed body (its whole output
accumulator read and written each iteration) times its trips exceeds what the published steps
allow (docs/planner.md, "What the windowed einsums hide").
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

from tpu_tuner.core.errors import first_line
from tpu_tuner.planner.prediction.collectives import Collective, add_collectives, parse_collectives

log = logging.getLogger(__name__)

# A computation's first line: "ENTRY %main.26_spmd (p: f32[8]) -> f32[8] {" or "%region_0.4 (...) {".
_HEADER = re.compile(r"^(?P<entry>ENTRY )?%(?P<name>[\w.\-]+) \(")
_CALLED = re.compile(r"\b(?:to_apply|calls|body|condition|select|scatter|comparator)=%([\w.\-]+)")
_CALLED_LISTS = re.compile(r"\b(?:branch_computations|called_computations)=\{([^}]*)\}")
_WHILE = re.compile(r"\bwhile\(.*?body=%(?P<body>[\w.\-]+).*?op_name=\"(?P<op>[^\"]*)\"")
# A windowed einsum's loop: "while(%tuple.590), condition=%wide.windowed_dot_general_cond_ag.3,
# body=%wide.windowed_dot_general_body_ag.3.sunk".
_WINDOWED_WHILE = re.compile(
    r"\bwhile\(%(?P<init>[\w.\-]+)\), condition=%(?P<condition>[\w.\-]+), "
    r"body=%(?P<body>[\w.\-]*windowed_dot_general[\w.\-]*)"
)
_DEFINED = re.compile(r"^(?:ROOT )?%([\w.\-]+) = ")
_OPERANDS = re.compile(r"%([\w.\-]+)")
_TUPLE_INDEX = re.compile(r" get-tuple-element\(%[\w.\-]+\), index=(\d+)")
_SCALAR_CONSTANT = re.compile(r"^(?:ROOT )?%[\w.\-]+ = [su]\d+\[\]\S* constant\((-?\d+)\)")
_COPY = re.compile(r" copy\(%([\w.\-]+)\)")
# A Pallas kernel's estimate, compact ("cost_estimate":{"flops":"123",...) or, for kernels inside
# called computations (megablox's grouped matmuls), spread over lines
# ("cost_estimate": {\n"bytes_accessed":...,\n"flops":123,).
_KERNEL_FLOPS = re.compile(r"\"cost_estimate\":\s*\{[^{}]*?\"flops\":\"?(\d+)")


@dataclass(frozen=True)
class LoopIteration:
    """The work of one iteration of every block loop together (forward and backward).

    With gradient accumulation the block loops sit inside the micro-batch loop; `micro_batch`
    is then one iteration of that loop, its block loops counted once (as the compiler counts
    them), so a step is the compiler's total + (micro-batches - 1) x micro_batch + micro-batches
    x (blocks - 1) x this iteration."""

    flops: float
    bytes_accessed: float
    collectives: list[Collective] = field(default_factory=list)
    loops: int = 0  # how many block loops were found
    micro_batch: LoopIteration | None = None


def block_loop_iteration(hlo_text: str) -> LoopIteration | None:
    """One iteration of the program's scan loops, or None when it has none or cannot be measured.

    The scan loops are the entry computation's while loops that JAX emitted (their op_name ends
    in "/while"). An iteration includes every iteration of the windowed-einsum loops inside it."""
    module = _Module(hlo_text)
    if module.entry is None:
        return None
    loops = _scan_loops(module, module.entry)
    if len(loops) == 1 and (inner := _scan_loops(module, loops[0])):
        # The micro-batch loop of gradient accumulation, the block loops inside it.
        outer, blocks = _measure(module, loops), _measure(module, inner)
        if outer is None or blocks is None:
            return None
        return LoopIteration(blocks.flops, blocks.bytes_accessed, blocks.collectives, blocks.loops, micro_batch=outer)
    return _measure(module, loops)


def _scan_loops(module: _Module, computation: str) -> list[str]:
    """The bodies of the while loops JAX emitted (op_name ending in "/while") in `computation`."""
    return [
        m.group("body")
        for line in module.lines(computation)
        if (m := _WHILE.search(line)) and m.group("op").endswith("/while")
    ]


def _measure(module: _Module, loops: list[str]) -> LoopIteration | None:
    """One iteration of each loop in `loops`, summed."""
    if not loops:
        return None
    flops = bytes_accessed = 0.0
    texts = []
    # The bodies only: a scan's condition is one compare of the counter.
    for body in loops:
        measured = _body_cost(module, body)
        if measured is None:
            return None
        body_flops, body_bytes, text = measured
        flops += body_flops
        bytes_accessed += body_bytes
        texts.append(text)
    collectives = parse_collectives("\n".join(texts))
    for body in loops:
        windowed = _windowed(module, body)
        if windowed is None:
            return None
        flops += windowed.flops
        collectives = add_collectives(collectives, windowed.collectives, 1)
    return LoopIteration(flops, bytes_accessed, collectives, loops=len(loops))


def _body_cost(module: _Module, body: str) -> tuple[float, float, str] | None:
    """One run of the computation `body`: its FLOPs (Pallas kernels' estimates added), its HBM
    bytes and its text with everything it calls (for the collectives); None when XLA's cost
    analysis cannot measure it."""
    reachable = module.reachable(body)
    cost = _cost_as_entry(module.as_entry(body, reachable), body)
    if cost is None:
        return None
    text = "\n".join(module.blocks[name] for name in reachable)
    flops = cost.get("flops", 0.0) + sum(float(f) for f in _KERNEL_FLOPS.findall(text))
    return flops, cost.get("bytes accessed", 0.0), text


def windowed_uncounted(hlo_text: str) -> LoopIteration | None:
    """The FLOPs and collectives of the windowed-einsum loops' iterations beyond the first,
    anywhere in the program (the compiler's totals count each loop's body once); None when the
    program has none, or one cannot be measured. `loops` is how many windowed loops there are;
    `bytes_accessed` is 0 (the module's docstring says why)."""
    module = _Module(hlo_text)
    if module.entry is None:
        return None
    found = _windowed(module, module.entry)
    return found if found is not None and found.loops else None


def _windowed(module: _Module, root: str) -> LoopIteration | None:
    """The uncounted iterations of every windowed loop reachable from `root` (each loop's body
    times its trip count - 1), FLOPs and collectives; None when a loop's body cannot be measured."""
    flops = 0.0
    collectives: list[Collective] = []
    loops = 0
    for caller in module.reachable(root):
        for line in module.lines(caller):
            loop = _WINDOWED_WHILE.search(line)
            if loop is None:
                continue
            body, trips = loop.group("body"), _trip_count(module, caller, loop)
            if trips is None:
                log.warning("the windowed loop %s has no trip count to read: counted once", body)
                continue
            measured = _body_cost(module, body)
            if measured is None:
                return None
            body_flops, _, text = measured
            more = trips - 1
            flops += more * body_flops
            collectives = add_collectives(collectives, parse_collectives(text), more)
            loops += 1
    return LoopIteration(flops, 0.0, collectives, loops=loops)


def _trip_count(module: _Module, caller: str, loop: re.Match[str]) -> int | None:
    """Iterations of a counted while loop: its condition compares a tuple element with a constant
    (``LT``), its body adds a constant to that element, and the caller starts it at a constant
    (through copies). None where the loop is not of that form."""
    condition = _definitions(module, loop.group("condition"))
    compare = next((d for d in condition.values() if d.startswith("ROOT") and " compare(" in d), "")
    operands = _call_operands(compare, "compare") if "direction=LT" in compare else []
    if len(operands) != 2:
        return None
    index = _TUPLE_INDEX.search(condition.get(operands[0], ""))
    limit = _constant(condition, operands[1])
    body = _definitions(module, loop.group("body"))
    root = next((d for d in body.values() if d.startswith("ROOT") and " tuple(" in d), "")
    updated = _tuple_operands(root)
    caller_definitions = _definitions(module, caller)
    start = _tuple_operands(caller_definitions.get(loop.group("init"), ""))
    if index is None or limit is None:
        return None
    position = int(index.group(1))
    if position >= min(len(updated), len(start)):
        return None
    step_operands = _call_operands(body.get(updated[position], ""), "add")
    step = next((v for name in step_operands if (v := _constant(body, name)) is not None), None)
    first = _constant(caller_definitions, start[position])
    if not step or first is None or step < 0:
        return None
    return max(1, -(-(limit - first) // step))  # ceil


def _definitions(module: _Module, computation: str) -> dict[str, str]:
    """Each instruction of `computation` by name, its line from "ROOT" or "%name =" on."""
    found = {}
    for line in module.lines(computation):
        stripped = line.strip()
        name = _DEFINED.match(stripped)
        if name:
            found[name.group(1)] = stripped
    return found


def _constant(definitions: dict[str, str], name: str) -> int | None:
    """The integer a scalar constant (or a chain of copies of one) holds; None otherwise."""
    for _ in range(8):  # copies chain a few deep at most
        line = definitions.get(name, "")
        value = _SCALAR_CONSTANT.search(line)
        if value:
            return int(value.group(1))
        copied = _COPY.search(line)
        if copied is None:
            return None
        name = copied.group(1)
    return None


def _tuple_operands(line: str) -> list[str]:
    """The operands of a ``tuple(...)`` instruction, in order."""
    return _call_operands(re.sub(r"/\*[^*]*\*/", "", line), "tuple")


def _call_operands(line: str, op: str) -> list[str]:
    """The operand names of `line`'s instruction if it is an `op`, else []."""
    if f" {op}(" not in line:
        return []
    return _OPERANDS.findall(line.split(f" {op}(", 1)[1].split(")", 1)[0])


class _Module:
    """An HLO module's text cut into its computations, in their order (callees before callers)."""

    def __init__(self, hlo_text: str) -> None:
        lines: dict[str, list[str]] = {}  # name -> the computation's lines, header to closing brace
        preamble: list[str] = []  # between the module line and the first computation (stack frames)
        self.entry: str | None = None
        current: list[str] | None = None
        for line in hlo_text.splitlines()[1:]:
            header = _HEADER.match(line)
            if header:
                if header.group("entry"):
                    self.entry, line = header.group("name"), line[len("ENTRY ") :]
                current = lines[header.group("name")] = [line]
            elif current is not None:
                current.append(line)
                if line.rstrip() == "}":  # a computation's end; a kernel's config may start a line with "},"
                    current = None
            elif not lines:
                preamble.append(line)
        self.blocks = {name: "\n".join(block) for name, block in lines.items()}
        self.preamble = "\n".join(preamble)

    def lines(self, name: str) -> list[str]:
        return self.blocks[name].splitlines()

    def reachable(self, root: str) -> list[str]:
        """`root` and every computation it calls, directly or not, in the module's order."""
        seen, stack = {root}, [root]
        while stack:
            block = self.blocks.get(stack.pop(), "")
            called = _CALLED.findall(block) + [
                n.strip().lstrip("%") for group in _CALLED_LISTS.findall(block) for n in group.split(",") if n.strip()
            ]
            for name in called:
                if name not in seen and name in self.blocks:
                    seen.add(name)
                    stack.append(name)
        return [name for name in self.blocks if name in seen]

    def as_entry(self, root: str, reachable: list[str]) -> str:
        """A module of `root` (as its entry) and the computations it calls."""
        return "\n\n".join(
            ["HloModule loop_iteration", self.preamble]
            + [self.blocks[name] for name in reachable if name != root]
            + ["ENTRY " + self.blocks[root]]
        )


def _cost_as_entry(module_text: str, computation: str) -> dict[str, float] | None:
    """XLA's HloCostAnalysis of a module (`computation` made its entry), by the CPU client."""
    try:
        import jax
        import jaxlib._hlo as hlo
        from jax._src.lib import _jax

        module = hlo.hlo_module_from_text(module_text)
        return dict(_jax.hlo_module_cost_analysis(jax.devices("cpu")[0].client, module))
    except Exception as exc:
        log.warning("cannot measure the loop body %s with XLA's cost analysis: %s", computation, first_line(exc))
        return None

"""Which attention each layer of a Hugging Face config runs, whatever the model type: `read_attention`.

transformers' config classes spell one idea many ways. Read here (docs/planner.md, "Attention
patterns from the config"):

- the window: ``sliding_window`` (Mistral, Gemma 2/3, Cohere 2, Olmo 3, gpt-oss, ...),
  ``sliding_window_size`` (Inkling), ``attention_window_size`` (RecurrentGemma),
  ``attention_window`` (Longformer: one int, or one a layer), ``local_attention`` (ModernBERT),
  GPT-Neo's ``window_size``; a window no shorter than the config's positions is global attention;
- the chunk: ``attention_chunk_size`` (Llama 4);
- which layers are local: ``layer_types`` ("sliding_attention", "chunked_attention",
  "full_attention", ...), GPT-Neo's ``attention_layers`` ("local" / "global"), else a period:
  ``sliding_window_pattern`` (an int N: every N-th layer global; or "LLLG" repeated),
  ``global_attn_every_n_layers``; else Qwen2's ``use_sliding_window`` with ``max_window_layers``
  (a window only on layers from that index on, and only where ``use_sliding_window`` is true);
  else every layer takes the window or chunk;
- sinks: ``attention_sinks`` / ``use_attention_sinks`` / ``use_sinks``, or a model type whose
  attention has a learned sink per head (gpt-oss and the like): no matmul, said in the line.

A field whose name looks like attention (window, sliding, chunk, local_attention, global_attn,
sink) with a value, that the reader neither read nor knows to be something else, is listed in
`AttentionPattern.unread`; `warn_unread` logs it (the plan then counts that attention as global).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tpu_tuner.model.decoders.transformer_dims import AttentionSpan

log = logging.getLogger(__name__)

LayerKind = tuple[int, int]  # (window, chunk) of one layer; (0, 0): global attention
WINDOW_FIELDS = (
    "sliding_window",
    "sliding_window_size",
    "attention_window_size",
    "attention_window",
    "local_attention",
)
SINK_FIELDS = ("attention_sinks", "use_attention_sinks", "use_sinks")
# Every field the reader knows (read where it decides the pattern, else superseded by another).
KNOWN_FIELDS = frozenset(
    {
        *WINDOW_FIELDS,
        *SINK_FIELDS,
        "window_size",
        "attention_chunk_size",
        "layer_types",
        "attention_layers",
        "sliding_window_pattern",
        "global_attn_every_n_layers",
        "use_sliding_window",
        "max_window_layers",
    }
)
# Model types whose attention has a learned sink per head without a config field saying so
# (transformers' modeling files with ``self.sinks = nn.Parameter``).
SINK_TYPES = frozenset(
    {"gpt_oss", "granite_swa", "granitemoe_swa", "mimo_v2_flash", "flint", "deepseek_v4", "hy_v4", "hy_v4_vl"}
)
# Names that look like attention and are not: feed-forward chunking, a router's sink, sparse
# attention's index, vision windows, rope settings per layer kind, audio chunks.
NOT_ATTENTION = frozenset(
    {
        "chunk_size_feed_forward",
        "shared_expert_sink",
        "index_num_sink_tokens",
        "index_num_local_tokens",
        "hc_sinkhorn_iters",
        "window_kernel_size",
        "acoustic_tokenizer_chunk_size",
        "chunk_length",
        "chunk_length_s",
        "chunk_size",
    }
)
_LOOKS_LIKE = ("window", "sliding", "chunk", "local_attention", "global_attn", "sink")
_LOCAL_KINDS = {
    "sliding_attention": "window",
    "hybrid_sliding": "window",
    "local": "window",
    "chunked_attention": "chunk",
}
_GLOBAL_KINDS = {"full_attention", "attention", "global"}
# layer_types values of layers that are not attention layers' kinds of mask (MLP kinds): no warning.
_NOT_MASKS = {"dense", "sparse", "moe", "conv"}


@dataclass(frozen=True)
class AttentionPattern:
    """Every layer's attention as a config defines it: `layers` holds (window, chunk) a layer,
    (0, 0) where it is global; `read` the fields it came from; `unread` the attention-looking
    fields (name = value) it did not understand, counted as global."""

    layers: tuple[LayerKind, ...]
    sinks: bool = False
    read: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()

    @property
    def has_local(self) -> bool:
        return any(window or chunk for window, chunk in self.layers)

    def spans(self, heads: int, head_dim: int) -> tuple[AttentionSpan, ...]:
        """The FLOPs formula's spans (metrics/flops.py): () where every layer is global."""
        return tuple(AttentionSpan(heads, head_dim, w, c) for w, c in self.layers) if self.has_local else ()

    def describe(self) -> str:
        """One line: each group of like layers and where they sit, then sinks (docs/planner.md)."""
        return describe_layers(self.layers) + ("; a learned sink per head in every layer" if self.sinks else "")

    def periodic(self) -> tuple[int, int, int]:
        """(window, chunk, global_every) as the generic decoder's shape keys hold the pattern: one
        window or chunk, every N-th layer global (0: all local); `ValueError` naming the pattern
        otherwise. An all-global pattern is (0, 0, 0)."""
        local = sorted({kind for kind in self.layers if kind != (0, 0)})
        if not local:
            return 0, 0, 0
        if len(local) > 1:
            raise ValueError(f"local layers of different windows or chunks ({describe_layers(self.layers)})")
        full = [kind == (0, 0) for kind in self.layers]
        every = full.index(True) + 1 if any(full) else 0
        if every and any(is_full != ((i + 1) % every == 0) for i, is_full in enumerate(full)):
            raise ValueError(f"the layer pattern ({describe_layers(self.layers)}) is not every N-th layer global")
        return local[0][0], local[0][1], every


def read_attention(config: Any, layers: int | None = None) -> AttentionPattern:
    """The attention pattern of `config` (a transformers config, or any object with its fields);
    `layers` where the config names its depth otherwise than ``num_hidden_layers``/``num_layers``."""
    fields = _fields(config)
    depth = layers or _int(fields.get("num_hidden_layers")) or _int(fields.get("num_layers")) or 1
    read: list[str] = []
    window, chunk = _size(fields, read)
    switched_off = fields.get("use_sliding_window") is False  # Qwen2 style: no window, whatever its size
    if switched_off:
        read.append("use_sliding_window")
        window = 0
    limit = _positions(fields)
    # A sliding layer whose window is switched off or empty (a size field there, None) is global,
    # as transformers runs it; one with no window field at all is a kind the reader cannot size.
    sized = switched_off or bool(window) or any(name in fields for name in WINDOW_FIELDS)
    kinds, unread = _layer_kinds(fields, read, depth, (window, chunk), sized)
    # A window or chunk as long as every sequence the config allows is global attention.
    kinds = [(0, 0) if limit and max(kind) >= limit else kind for kind in kinds]
    sinks = fields.get("model_type") in SINK_TYPES or any(bool(fields.get(name)) for name in SINK_FIELDS)
    read += [name for name in SINK_FIELDS if name in fields]
    unread += [
        f"{name} = {value!r}"
        for name, value in fields.items()
        if any(word in name.lower() for word in _LOOKS_LIKE)
        and name.lstrip("_") not in KNOWN_FIELDS | NOT_ATTENTION
        and _given(value)
    ]
    return AttentionPattern(tuple(kinds), sinks, tuple(dict.fromkeys(read)), tuple(unread))


def warn_unread(pattern: AttentionPattern, model_type: str) -> None:
    """Log a warning for each attention-looking field `pattern` did not read (never silent)."""
    for entry in pattern.unread:
        log.warning(
            "the %s config's %s is not an attention setting tpu-tune reads: the plan treats that attention as global",
            model_type,
            entry,
        )


def describe_layers(layers: Sequence[LayerKind]) -> str:
    """ "36 layers sliding window 4096, 12 layers global (every 4th)": each kind of layer, in the
    order the kinds first appear, with where its layers sit when not every layer."""
    groups: dict[LayerKind, list[int]] = {}
    for index, kind in enumerate(layers):
        groups.setdefault(kind, []).append(index)
    places = {kind: _where(where, len(layers)) for kind, where in groups.items()}
    if len(places) == 2 and any(place.startswith("every") for place in places.values()):
        places = {kind: place if place.startswith("every") else "" for kind, place in places.items()}  # the rest
    parts = []
    for (window, chunk), where in groups.items():
        what = f"sliding window {window}" if window else f"chunked attention {chunk}" if chunk else "global"
        place = places[(window, chunk)]
        parts.append(f"{len(where)} layer{'s' if len(where) != 1 else ''} {what}" + (f" ({place})" if place else ""))
    return ", ".join(parts)


def describe_spans(spans: Sequence[AttentionSpan], layers: int) -> str:
    """`describe_layers` of a plan's spans (() : `layers` global layers)."""
    return describe_layers([(s.window, s.chunk) for s in spans] if spans else [(0, 0)] * layers)


def _fields(config: Any) -> dict[str, Any]:
    """The config's settings by name: a transformers config's own (its private derived ones too,
    Gemma 3's ``_sliding_window_pattern``), or a dict's."""
    if isinstance(config, dict):
        return dict(config)
    if callable(getattr(config, "get_text_config", None)):  # a multimodal config: its text model's
        config = config.get_text_config()
    found = {k: v for k, v in vars(config).items() if not callable(v)}
    found.setdefault("model_type", getattr(config, "model_type", None))
    for name in ("num_hidden_layers", "sliding_window", "layer_types", "max_position_embeddings"):
        if name not in found and getattr(config, name, None) is not None:  # attribute_map's aliases
            found[name] = getattr(config, name)
    return found


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _given(value: Any) -> bool:
    return value not in (None, False, 0, "", [], {}, ()) and not (isinstance(value, int) and value < 0)


def _positions(fields: dict[str, Any]) -> int:
    return _int(fields.get("max_position_embeddings")) or _int(fields.get("n_positions"))


def _size(fields: dict[str, Any], read: list[str]) -> tuple[int, int]:
    """(window, chunk) of the local layers: the first window field with a size, and the chunk."""
    window = 0
    for name in WINDOW_FIELDS:
        value = fields.get(name)
        if isinstance(value, (list, tuple)) and value:  # Longformer: one window a layer; the widest stands
            value = max(_int(v) for v in value)
        if _int(value):
            window = _int(value)
            read.append(name)
            break
    if not window and _int(fields.get("window_size")) and fields.get("attention_layers"):  # GPT-Neo
        window = _int(fields["window_size"])
        read.append("window_size")
    chunk = _int(fields.get("attention_chunk_size"))
    if chunk:
        read.append("attention_chunk_size")
    return window, chunk


def _layer_kinds(
    fields: dict[str, Any], read: list[str], depth: int, sizes: LayerKind, sized: bool
) -> tuple[list[LayerKind], list[str]]:
    """Each layer's (window, chunk) and the layer kinds not understood, from the first of the
    per-layer lists, the periods and Qwen2's max_window_layers that the config sets."""
    window, chunk = sizes
    local: LayerKind = (window, 0) if window else (0, chunk)
    types = fields.get("layer_types") or fields.get("attention_layers")
    if isinstance(types, (list, tuple)) and types:
        read.append("layer_types" if fields.get("layer_types") else "attention_layers")
        kinds, unread = [], []
        for index, name in enumerate(types):
            form = _LOCAL_KINDS.get(str(name))
            size = (window, 0) if form == "window" else (0, chunk) if form == "chunk" else (0, 0)
            unsized = form == "window" and not sized or form == "chunk" and "attention_chunk_size" not in fields
            if unsized or (not form and name not in _GLOBAL_KINDS | _NOT_MASKS):
                unread.append(f"layer_types[{index}] = {name!r}")  # a kind without its size, or unknown
            kinds.append(size)
        return kinds, _merged(unread)
    if not window and not chunk:
        return [(0, 0)] * depth, []
    pattern = fields.get("sliding_window_pattern") or fields.get("_sliding_window_pattern")
    if isinstance(pattern, str) and pattern.strip():  # EXAONE 4's "LLLG": the letters repeat from layer 0
        read.append("sliding_window_pattern")
        letters = pattern.strip().upper()
        return [local if letters[i % len(letters)] == "L" else (0, 0) for i in range(depth)], []
    every = _int(pattern) or _int(fields.get("global_attn_every_n_layers"))
    if every:
        read.append("sliding_window_pattern" if _int(pattern) else "global_attn_every_n_layers")
        return [(0, 0) if (i + 1) % every == 0 else local for i in range(depth)], []
    if "max_window_layers" in fields and "use_sliding_window" in fields:
        read.append("max_window_layers")
        first = _int(fields.get("max_window_layers"))
        return [local if i >= first else (0, 0) for i in range(depth)], []
    return [local] * depth, []


def _merged(unread: list[str]) -> list[str]:
    """One entry a unknown layer kind, naming its first layer and how many (not one a layer)."""
    by_kind: dict[str, list[str]] = {}
    for entry in unread:
        by_kind.setdefault(entry.split(" = ", 1)[1], []).append(entry)
    return [
        f"{entries[0]}" + (f" (and {len(entries) - 1} more layers)" if len(entries) > 1 else "")
        for entries in by_kind.values()
    ]


def _where(indices: list[int], layers: int) -> str:
    """Where a group's layers sit: '' (all of them), 'every 4th', 'layers 28-35', or a list."""
    if len(indices) == layers:
        return ""
    step = indices[0] + 1
    if step > 1 and indices == list(range(step - 1, layers, step)):
        return f"every {_ordinal(step)}"
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i - 1:
            runs[-1] = (runs[-1][0], i)
        else:
            runs.append((i, i))
    if len(runs) > 4:
        return f"layers {', '.join(str(i) for i in indices[:6])}{', ...' if len(indices) > 6 else ''}"
    return "layer" + ("s " if len(indices) > 1 else " ") + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in runs)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


__all__ = [
    "NOT_ATTENTION",
    "SINK_FIELDS",
    "SINK_TYPES",
    "WINDOW_FIELDS",
    "AttentionPattern",
    "LayerKind",
    "describe_layers",
    "describe_spans",
    "read_attention",
    "warn_unread",
]

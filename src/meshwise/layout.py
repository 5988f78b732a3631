"""Layout: the one contract between the planner and the runtime (docs/design.md).

Text form: comma-separated ``key=value`` with keys dp, zero, shard, ep, cp, tp, sp, pp, vpp, schedule, mbs, ac,
and ``etp=1`` (expert TP 1: Megatron-Core's MoE parallel folding, given only where a run states it).
Owns "can this layout run here?" (:func:`check_runnable`, torch-free; every entry point calls it)
and the pipeline stage split, which the cost model and the runtime both read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import NamedTuple

from meshwise.errors import MeshwiseError
from meshwise.spec import ModelSpec

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")
AC_MODES = ("none", "selective", "full")
KEYS = ("dp", "zero", "shard", "ep", "cp", "tp", "sp", "pp", "vpp", "schedule", "mbs", "ac")
EXTRA_KEYS = ("etp",)  # written only when set: etp=1
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "cp", "tp")  # outermost first
EP_FROM = ("dp_shard", "cp")  # the adjacent mesh dims expert parallelism is carved from (expert_mesh_shape)


@dataclass(frozen=True)
class Layout:
    """A fully resolved layout. World size = dp * cp * tp * pp; the sharding group has ``shard`` ranks
    (times cp: FSDP shards over dp_shard x cp, see docs/runtime.md); ``ep`` of the ``shard * cp`` ranks
    hold disjoint experts (expert parallelism, :func:`expert_mesh_shape`)."""

    dp: int = 1
    zero: int = 0
    shard: int = 1
    cp: int = 1  # context-parallel degree: the sequence is split over cp ranks
    tp: int = 1
    sp: bool = False
    pp: int = 1
    vpp: int = 1
    schedule: str = "1f1b"
    mbs: int = 1
    ac: str = "none"
    ep: int = 1
    etp: int = 0  # expert TP size: 0 the runtime's default (Megatron-Core's: tp), 1 experts whole (folding)

    @property
    def world_size(self) -> int:
        return self.dp * self.cp * self.tp * self.pp

    @property
    def replicate(self) -> int:
        """Size of the dp_replicate mesh dimension: dp / shard (1 unless HSDP)."""
        return self.dp // self.shard

    @property
    def mesh_shape(self) -> dict[str, int]:
        """Mesh dimensions, outermost first: pp, dp_replicate, dp_shard, cp, tp."""
        return {"pp": self.pp, "dp_replicate": self.replicate, "dp_shard": self.shard, "cp": self.cp, "tp": self.tp}

    @property
    def ep_folds_tp(self) -> bool:
        """Expert parallelism folded over the tensor-parallel ranks (Megatron-Core's MoE parallel
        folding with expert-TP 1, torchtitan's expert TP = 1): an ``ep`` that does not divide
        dp_shard x cp is carved from dp_shard x cp x tp, ``tp`` consecutive ranks at a time, each
        TP rank routing its own share of the sequence (:func:`check_shape`); or any ``ep`` under tp > 1
        where the layout states expert TP 1 (``etp=1``: Megatron's ``--expert-tensor-parallel-size 1``)."""
        return self.ep > 1 and ((self.shard * self.cp) % self.ep != 0 or (self.etp == 1 and self.tp > 1))

    @property
    def expert_dp(self) -> int:
        """Expert data-parallel ranks: those of the ep group's ranks' dp_shard x cp (x tp when folded)
        that hold the same experts, over which ZeRO shards them."""
        return self.shard * self.cp * (self.tp if self.ep_folds_tp else 1) // self.ep

    @property
    def stages(self) -> int:
        """Pipeline chunks in all: pp * vpp."""
        return self.pp * self.vpp

    def accum(self, global_batch: int) -> int:
        """Micro-batches per replica per step: global_batch / (mbs * dp)."""
        return global_batch // (self.mbs * self.dp)

    def format(self) -> str:
        """Canonical text, every key present (``etp`` where set); ``parse(format())`` gives the same layout."""
        return ",".join(f"{k}={_field_text(getattr(self, k))}" for k in KEYS) + (f",etp={self.etp}" if self.etp else "")

    def short(self) -> str:
        """Only what differs from a plain DDP layout: ``dp=8,zero=3,tp=2``."""
        parts = [f"dp={self.dp}"]
        if self.zero:
            parts.append(f"zero={self.zero}")
            if self.shard != self.dp:
                parts.append(f"shard={self.shard}")
        if self.ep > 1:
            parts.append(f"ep={self.ep}" + (f",etp={self.etp}" if self.etp else ""))
        if self.cp > 1:
            parts.append(f"cp={self.cp}")
        if self.tp > 1:
            parts.append(f"tp={self.tp}" + ("" if self.sp else ",sp=off"))
        if self.pp > 1:
            parts.append(f"pp={self.pp}")
            if self.vpp > 1:
                parts.append(f"vpp={self.vpp}")
            parts.append(f"schedule={self.schedule}")
        parts.append(f"mbs={self.mbs}")
        if self.ac != "none":
            parts.append(f"ac={self.ac}")
        return ",".join(parts)

    def to_json(self, global_batch: int) -> dict:
        d = asdict(self)
        d["sp"] = "on" if self.sp else "off"
        d["accum"] = self.accum(global_batch)
        return {k: d[k] for k in (*KEYS[:-1], "accum", "ac")} | ({"etp": self.etp} if self.etp else {})

    def __str__(self) -> str:
        return self.short()

    @property
    def degrees(self) -> Degrees:
        """Its degrees and schedule: every field but mbs and ac."""
        d = self.__dict__
        return Degrees(
            d["dp"], d["zero"], d["shard"], d["cp"], d["tp"], d["sp"], d["pp"], d["vpp"], d["schedule"], d["ep"]
        )


class Degrees(NamedTuple):
    """A layout's parallel degrees and pipeline schedule: the fields of :class:`Layout` but the
    micro-batch size, the checkpointing mode and ``etp`` (a run's stated expert TP, never searched: its
    layouts take the runtime's default), in Layout's order and under its names. One structure
    of the search (plan/candidates.py), which keys its memos by it and by its projections
    (plan/memo_keys.py); a NamedTuple because the search makes one per structure, tens of thousands,
    and hashes them. :meth:`layout` makes the Layout at a micro-batch size and checkpointing mode."""

    dp: int
    zero: int
    shard: int
    cp: int
    tp: int
    sp: bool
    pp: int
    vpp: int
    schedule: str
    ep: int

    def layout(self, mbs: int = 1, ac: str = "none") -> Layout:
        """The Layout of these degrees at ``mbs`` and ``ac`` (:func:`layout_from_fields`)."""
        dp, zero, shard, cp, tp, sp, pp, vpp, schedule, ep = self
        return layout_from_fields(
            {
                "dp": dp,
                "zero": zero,
                "shard": shard,
                "cp": cp,
                "tp": tp,
                "sp": sp,
                "pp": pp,
                "vpp": vpp,
                "schedule": schedule,
                "mbs": mbs,
                "ac": ac,
                "ep": ep,
            }
        )


def layout_from_fields(fields: dict) -> Layout:
    """The one fast factory: a Layout holding ``fields`` (a dict of its fields, in their declared
    order), equal to ``Layout(**fields)`` but without the frozen ``__init__``'s ``setattr`` per field.
    Layout has no ``__post_init__`` and its fields are plain values, so nothing is skipped but the
    setattrs; ``Layout(**fields)`` and ``dataclasses.replace`` are several times slower, and the
    search builds tens of thousands. The dict is the layout's own from then on: pass a fresh one."""
    new = object.__new__(Layout)
    object.__setattr__(new, "__dict__", fields)
    return new


def _field_text(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _int(key: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise MeshwiseError(f"layout: {key}={text!r} is not a whole number") from None
    if value < (0 if key == "zero" else 1):
        raise MeshwiseError(f"layout: {key}={value} must be at least {0 if key == 'zero' else 1}")
    return value


def parse(text: str, world_size: int | None = None, explicit: bool = False) -> Layout:
    """Parse ``key=value,...``; dp defaults to world_size / (cp * tp * pp), shard to dp, sp to (tp > 1).
    ``explicit``: the text is what a user typed (``--layout``), so an empty item and a key that does
    not apply (:func:`check_applies`) are refused rather than passed over."""
    given: dict[str, str] = {}
    items = [p.strip() for p in text.split(",")]
    if explicit and text.strip() and not all(items):
        raise MeshwiseError(
            f"layout: {text!r} has an empty item; give key=value pairs separated by single commas, e.g. dp=8,tp=8"
        )
    for item in items:
        if not item:
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise MeshwiseError(f"layout: {item!r} is not key=value (keys: {', '.join(KEYS)})")
        if key not in KEYS + EXTRA_KEYS:
            raise MeshwiseError(f"layout: unknown key {key!r}; valid keys: {', '.join(KEYS + EXTRA_KEYS)}")
        if key in given:
            raise MeshwiseError(f"layout: {key} given twice")
        given[key] = value
    ints = {
        k: _int(k, v)
        for k, v in given.items()
        if k in ("dp", "zero", "shard", "ep", "cp", "tp", "pp", "vpp", "mbs", "etp")
    }
    if ints.get("etp", 1) != 1:
        raise MeshwiseError(f"layout: etp={ints['etp']} must be 1 (experts whole on each rank); leave it out for tp")
    tp, pp, cp = ints.get("tp", 1), ints.get("pp", 1), ints.get("cp", 1)
    if "dp" in ints:
        dp = ints["dp"]
    elif world_size is not None:
        if world_size % (cp * tp * pp):
            raise MeshwiseError(f"layout: cp*tp*pp = {cp * tp * pp} does not divide the world size {world_size}")
        dp = world_size // (cp * tp * pp)
    else:
        dp = 1
    zero = ints.get("zero", 0)
    if zero > 3:
        raise MeshwiseError(f"layout: zero={zero} must be 0, 1, 2 or 3")
    shard = ints.get("shard", dp)
    if "shard" in given and zero == 0 and shard != dp:
        raise MeshwiseError("layout: shard is the ZeRO sharding group; it needs zero=1, 2 or 3")
    sp_text = given.get("sp", "on" if tp > 1 else "off")
    if sp_text not in ("on", "off"):
        raise MeshwiseError(f"layout: sp={sp_text!r} must be on or off")
    vpp = ints.get("vpp", 1)
    schedule = given.get("schedule", "interleaved-1f1b" if vpp > 1 else "1f1b")
    if schedule not in SCHEDULES:
        raise MeshwiseError(f"layout: schedule={schedule!r} must be one of {', '.join(SCHEDULES)}")
    ac = given.get("ac", "none")
    if ac not in AC_MODES:
        raise MeshwiseError(f"layout: ac={ac!r} must be one of {', '.join(AC_MODES)}")
    layout = Layout(
        dp=dp,
        zero=zero,
        shard=shard,
        cp=cp,
        tp=tp,
        sp=sp_text == "on" and tp > 1,
        pp=pp,
        vpp=vpp,
        schedule=schedule,
        mbs=ints.get("mbs", 1),
        ac=ac,
        ep=ints.get("ep", 1),
        etp=ints.get("etp", 0),
    )
    check_shape(layout)
    if explicit:
        check_applies(given, layout)
    return layout


def check_applies(given: dict[str, str], layout: Layout) -> None:
    """Keys the user wrote that would do nothing are refused, as ``vpp`` without ``pp`` is:
    ``sp=on`` without tp > 1, a pipeline ``schedule`` other than the default without pp > 1."""
    if given.get("sp") == "on" and layout.tp == 1:
        raise MeshwiseError(
            "layout: sp=on splits the sequence over the tensor-parallel ranks; it needs tp > 1 "
            "(drop sp, or add tp=2 or more)"
        )
    if "etp" in given and (layout.ep == 1 or layout.tp == 1 or layout.ep % layout.tp):
        raise MeshwiseError(
            "layout: etp=1 folds expert parallelism over the TP ranks; it needs tp > 1 and ep a multiple of tp"
        )
    if "schedule" in given and layout.pp == 1 and layout.schedule != "1f1b":
        raise MeshwiseError(
            f"layout: schedule={layout.schedule} is a pipeline schedule; it needs pp > 1 "
            "(drop schedule, or add pp=2 or more)"
        )


def check_shape(layout: Layout) -> None:
    """What the layout alone can get wrong (no model, world size or batch needed)."""
    if layout.dp % layout.shard:
        raise MeshwiseError(f"layout: shard={layout.shard} must divide dp={layout.dp}")
    carved = layout.shard * layout.cp
    if carved % layout.ep and (layout.ep % layout.tp or (carved * layout.tp) % layout.ep):
        source = f"dp_shard x cp = {layout.shard} x {layout.cp} = {carved}" if layout.cp > 1 else f"dp_shard = {carved}"
        fold = (
            f", or be folded over tp={layout.tp} (a multiple of tp dividing {carved * layout.tp})"
            if layout.tp > 1
            else ""
        )
        raise MeshwiseError(
            f"layout: ep={layout.ep} must divide the ranks it is carved from ({source}){fold}; "
            f"valid ep: {', '.join(map(str, _valid_ep(layout)))}"
        )
    if layout.vpp > 1 and layout.pp == 1:
        raise MeshwiseError(f"layout: vpp={layout.vpp} needs pp > 1")
    if layout.vpp > 1 and layout.schedule in ("gpipe", "1f1b"):
        raise MeshwiseError(
            f"layout: vpp={layout.vpp} needs schedule=interleaved-1f1b or zero-bubble, not {layout.schedule}"
        )
    if layout.schedule == "interleaved-1f1b" and layout.pp > 1 and layout.vpp < 2:
        raise MeshwiseError("layout: schedule=interleaved-1f1b needs vpp >= 2")


def _valid_ep(layout: Layout) -> list[int]:
    carved = layout.shard * layout.cp
    return [
        e
        for e in range(1, carved * layout.tp + 1)
        if carved % e == 0 or (e % layout.tp == 0 and (carved * layout.tp) % e == 0)
    ]


def validate(layout: Layout, model: ModelSpec, world_size: int, global_batch: int) -> None:
    """Refuse a layout that cannot run, in one line naming the field and what would be valid."""
    check_shape(layout)
    if layout.world_size != world_size:
        raise MeshwiseError(
            f"layout: dp*cp*tp*pp = {layout.dp}*{layout.cp}*{layout.tp}*{layout.pp} = {layout.world_size}, "
            f"but the world size is {world_size}"
        )
    if not model.states_only:
        for name, size in (
            ("heads", model.heads),
            ("kv_heads", model.kv_heads),
            ("ffn_hidden", model.ffn_hidden),
            ("vocab", model.vocab),
        ):
            if size % layout.tp:
                valid = [t for t in range(1, size + 1) if size % t == 0 and world_size % t == 0]
                raise MeshwiseError(
                    f"layout: tp={layout.tp} does not divide the model's {name} ({size}); "
                    f"valid tp: {', '.join(map(str, valid[:8]))}"
                )
        if layout.stages > model.layers:
            raise MeshwiseError(f"layout: pp*vpp = {layout.stages} is more than the model's {model.layers} layers")
    if layout.ep > 1 and not model.moe:
        raise MeshwiseError(
            f"layout: ep={layout.ep} needs a mixture-of-experts model; {model.name!r} has no experts, use ep=1"
        )
    if layout.ep > 1 and model.experts % layout.ep:
        valid = [e for e in _valid_ep(layout) if model.experts % e == 0]
        raise MeshwiseError(
            f"layout: ep={layout.ep} does not divide the model's {model.experts} experts; valid ep: "
            f"{', '.join(map(str, valid))}"
        )
    if global_batch % (layout.mbs * layout.dp):
        raise MeshwiseError(
            f"layout: global batch {global_batch} is not divisible by mbs*dp = "
            f"{layout.mbs}*{layout.dp}; pick a batch that is a multiple of {layout.mbs * layout.dp}"
        )
    check_microbatches(layout, layout.accum(global_batch))


def check_microbatches(layout: Layout, m: int) -> None:
    """What torch.distributed.pipelining's schedules require of the ``m`` micro-batches per step:
    1F1B at least one per stage; the interleaved and zero-bubble schedules a whole number of rounds
    of ``max(1, m // pp)``."""
    if layout.pp == 1:
        return
    if layout.schedule == "1f1b" and m < layout.pp:
        raise MeshwiseError(
            f"layout: schedule=1f1b needs at least pp={layout.pp} micro-batches per step, got "
            f"{m} (global batch / (mbs*dp)); use a larger batch, a smaller mbs, or gpipe"
        )
    rounds = max(1, m // layout.pp)
    if layout.schedule in ("interleaved-1f1b", "zero-bubble") and m % rounds:
        raise MeshwiseError(
            f"layout: schedule={layout.schedule} needs the {m} micro-batches per step to be a "
            f"multiple of {rounds} rounds (m // pp); use a multiple of pp={layout.pp}"
        )


def runtime_refusal(layout: Layout, model: ModelSpec, seq_len: int, runtime: str = "meshwise") -> str | None:
    """Why ``runtime`` cannot run ``layout`` for ``model`` at ``seq_len`` tokens (None: it can).

    Expert parallelism folded over the TP ranks (:attr:`Layout.ep_folds_tp`) is Megatron-Core's: it
    is planned under ``--runtime megatron`` and refused for meshwise's runtime.

    Both runtimes split the sequence: context parallelism into 2*cp chunks (rank i holds chunks i and
    2*cp-1-i), sequence parallelism each rank's part over tp, so both need it divisible. The rest is
    meshwise's own runtime (``train``, ``verify``, ``plan --runtime meshwise``): it keeps one embedding
    per pipeline chunk, so pp > 1 with tied embeddings is refused (Megatron-LM ties the first and last
    stages' copies by an all-reduce); its zero-bubble schedules run a split backward that re-enters each
    checkpointed region twice, which ``torch.utils.checkpoint``'s selective mode forbids; and it shards
    no learned position table over sp or cp (Megatron-LM slices the positions with the sequence).
    """
    if layout.cp > 1 and seq_len % (2 * layout.cp):
        return (
            f"layout: cp={layout.cp} needs the sequence ({seq_len}) divisible by 2*cp = {2 * layout.cp} "
            "(causal load balancing: each cp rank holds two of 2*cp chunks)"
        )
    if layout.sp and (seq_len // layout.cp) % layout.tp:
        per_rank = f"per cp rank ({seq_len} / cp={layout.cp})" if layout.cp > 1 else f"({seq_len})"
        return f"layout: sp=on needs the sequence {per_rank} divisible by tp={layout.tp}"
    if runtime != "meshwise":
        return None
    if layout.ep_folds_tp and layout.etp == 1:
        return f"layout: etp=1 (experts folded over tp={layout.tp}) is planned for --runtime megatron only"
    if layout.ep_folds_tp:
        return (
            f"layout: ep={layout.ep} folded over tp={layout.tp} (it does not divide dp_shard x cp = "
            f"{layout.shard * layout.cp}) is planned for --runtime megatron only; meshwise's runtime carves ep "
            f"from dp_shard x cp: use an ep dividing {layout.shard * layout.cp}"
        )
    if model.tied_embeddings and layout.pp > 1:
        return (
            f"layout: pp={layout.pp} with the tied embeddings of {model.name!r} is not supported by the "
            "runtime; use pp=1"
        )
    if layout.schedule == "zero-bubble" and layout.pp > 1 and layout.ac == "selective":
        return (
            "layout: ac=selective with schedule=zero-bubble is not supported by the runtime (the split "
            "backward runs a selectively checkpointed region twice); use ac=full or another schedule"
        )
    if layout.tp > 1 and not model.states_only and model.qk_norm and model.qk_norm_scope == "projection":
        return (
            f"layout: tp={layout.tp} with {model.family}'s q/k norms over the whole projection (all heads) is not "
            "supported by the runtime; use tp=1"
        )
    if (
        layout.cp > 1
        and not model.states_only
        and (
            (model.sliding_window and model.sliding_window < seq_len)
            or model.attn_sinks
            or (model.query_scale and model.query_scale != model.head_dim)
        )
    ):
        return (
            f"layout: cp > 1 with {model.family}'s sliding-window attention or query scaling is not supported by "
            "the runtime's ring attention; use cp=1"
        )
    if layout.cp > 1 and not model.states_only and model.position == "learned":
        return "layout: cp > 1 with learned positions (GPT-2) is not supported by the runtime; use cp=1"
    if layout.sp and not model.states_only and model.position == "learned":
        return "layout: sp=on with learned positions (GPT-2) is not supported by the runtime; use sp=off"
    return None


def expert_mesh_shape(layout: Layout) -> dict[str, int]:
    """The mesh as expert parallelism sees it, outermost first. The EP group is carved from the
    innermost ranks of :data:`EP_FROM`, the adjacent dims ``dp_shard`` x ``cp`` (as torchtitan and
    Megatron-Core carve it from the data-parallel x context-parallel ranks, which all hold the same
    dense weights): the mesh ``pp, dp_replicate, dp_shard, cp, tp`` read as ``pp, dp_replicate,
    dp_shard_mod_ep, ep, tp`` with ``dp_shard_mod_ep = dp_shard * cp / ep``, the same ranks in the
    same order. The ``ep`` ranks are ``tp`` apart, cp ranks first, then dp_shard ones. Experts are
    sharded ``ep`` ways and, like dense weights, by the layout's ZeRO over the expert data-parallel
    ranks that remain (``dp_replicate`` x ``dp_shard_mod_ep``)."""
    return {
        "pp": layout.pp,
        "dp_replicate": layout.replicate,
        "dp_shard_mod_ep": layout.shard * layout.cp // layout.ep,
        "ep": layout.ep,
        "tp": layout.tp,
    }


def expert_group_ranks(layout: Layout, rank: int, dim: str) -> tuple[int, ...]:
    """The global ranks of ``rank``'s group along ``dim`` of :func:`expert_mesh_shape` (``ep`` or
    ``dp_shard_mod_ep``): the mesh is row-major, outermost first, as runtime/mesh.py builds it."""
    shape = expert_mesh_shape(layout)
    stride = 1
    for d in reversed(list(shape)):
        if d == dim:
            break
        stride *= shape[d]
    base = rank - (rank // stride) % shape[dim] * stride
    return tuple(base + i * stride for i in range(shape[dim]))


def runs_here(model: ModelSpec, seq_len: int) -> Callable[[Layout], bool]:
    """The planner's ``where=`` filter: layouts :func:`runtime_refusal` lets through. The answer is
    remembered by the fields that function reads (never dp, zero, shard, ep or mbs), so a search over
    tens of thousands of layouts asks it once per distinct answer."""
    answers: dict[tuple, bool] = {}

    def runs(layout: Layout) -> bool:
        if layout.ep > 1 and layout.ep_folds_tp:  # the one refusal that reads ep (never among the search's eps)
            return False
        key = (layout.pp, layout.schedule, layout.ac, layout.cp, layout.sp, layout.tp)
        if key not in answers:
            answers[key] = runtime_refusal(layout, model, seq_len) is None
        return answers[key]

    runs.reads = ("pp", "schedule", "ac", "cp", "sp", "tp")  # type: ignore[attr-defined]  # the search caches by these
    return runs


MAX_SEQ_LEN = 2**24  # 16,777,216 tokens: past the longest published context window (10M, Llama 4 Scout, 2025)


def check_seq_len(model: ModelSpec, seq_len: int, field: str = "seq_len", runtime: str = "meshwise") -> None:
    """The one rule for a sequence length, ``field`` as the user spells it: 1 to :data:`MAX_SEQ_LEN`;
    under meshwise's runtime also at most the model's ``max_seq`` (its rotary tables hold that many
    positions). Megatron-LM computes rotary positions for any length, so ``--runtime megatron`` plans
    past ``max_seq`` (long-context extension), as the search does."""
    if seq_len < 1:
        raise MeshwiseError(f"{field}: {seq_len} must be at least 1")
    if seq_len > MAX_SEQ_LEN:
        raise MeshwiseError(
            f"{field}: {seq_len} is past meshwise's bound of {MAX_SEQ_LEN:,} tokens per sequence "
            "(the longest published context window is 10M)"
        )
    if runtime == "meshwise" and not model.states_only and seq_len > model.max_seq:
        raise MeshwiseError(
            f"{field}: {seq_len} is longer than the model's max_seq {model.max_seq} (meshwise's "
            f"runtime holds that many rotary positions); use at most {model.max_seq} ('plan --runtime "
            "megatron' plans a longer context)"
        )


def check_runnable(
    layout: Layout,
    model: ModelSpec,
    world_size: int,
    global_batch: int,
    seq_len: int,
    seq_field: str = "seq_len",
    runtime: str = "meshwise",
) -> None:
    """The one answer to "can this layout run here?": :func:`validate`, the sequence length (named
    ``seq_field``, as the caller's user spells it), then :func:`runtime_refusal` for ``runtime``
    (meshwise's own for train, measure and verify; ``plan --runtime megatron`` asks Megatron's). No torch needed."""
    validate(layout, model, world_size, global_batch)
    check_seq_len(model, seq_len, seq_field, runtime)
    reason = runtime_refusal(layout, model, seq_len, runtime)
    if reason:
        raise MeshwiseError(reason)


# ------------------------------------------------------------------------------- stage split
def stage_layers(layers: int, chunks: int) -> list[int]:
    """Transformer blocks per pipeline chunk, as even as possible.

    The first chunk also holds the embedding and the last the final norm, head and loss, so the
    ``layers % chunks`` extra blocks go to the chunks in between first (then to the last, then the first).
    """
    base, extra = divmod(layers, chunks)
    counts = [base] * chunks
    order = list(range(1, chunks - 1)) + ([chunks - 1, 0] if chunks > 1 else [0])
    for c in order[:extra]:
        counts[c] += 1
    return counts


def chunk_rank(chunk: int, pp: int, vpp: int, schedule: str) -> int:
    """The pipeline rank that runs ``chunk``: round robin (loop), or a V for zero-bubble with vpp=2."""
    if schedule == "zero-bubble" and vpp == 2:
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def rank_chunks(pp_rank: int, pp: int, vpp: int, schedule: str) -> list[int]:
    """Chunks held by one pipeline rank, in execution order."""
    return [c for c in range(pp * vpp) if chunk_rank(c, pp, vpp, schedule) == pp_rank]

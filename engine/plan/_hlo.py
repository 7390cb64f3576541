"""Read what XLA's SPMD partitioner produced: collectives and memory of a compiled program.

``verify`` compares these with the cost model's predictions. The input is the text of
``jax.jit(...).lower(...).compile().as_text()`` (post-optimisation, per-device HLO), parsed
line by line with regexes; no HLO library is needed.

Facts this parser relies on (jax 0.10.x, XLA CPU, checked on 8 simulated devices):

- Shapes in the text are per device: ``f32[4,256]{1,0}``, scalars ``f32[]``, tuples
  ``(f32[4]{0}, /*index=5*/bf16[2,2]{1,0})``. Operands are printed by name only
  (``all-reduce(%fusion.3)``), so operand shapes come from the defining instruction.
- Replica groups come in four spellings: explicit ``{{0,1},{2,3}}``; iota ``[4,2]<=[8]``
  and ``[2,4]<=[4,2]T(1,0)``; empty ``{}`` (one group of everything); and the mesh-based
  form ``mesh['axis_0'=4,'axis_1'=2] {'axis_1'}``, optionally with
  ``device_ids=([4,2]T(1,0))`` and sub-axes ``'axis_0':(1)2``. The mesh in that form is
  XLA's own (``axis_0``, ``axis_1``, ...), *not* the JAX mesh: its axes are only used to
  enumerate the groups.
- The ids in groups (with ``use_global_device_ids=true``: global ids = partition ids, one
  replica) are *partition* numbers, i.e. positions in the jit's device assignment, which is
  ``mesh.devices.flat``. They are not ``Device.id``: on a mesh whose devices are permuted
  the two differ, and only the position reading gives the right axes. On ``make_mesh`` on
  CPU both coincide.
- A ``scan`` lowers to a ``while`` whose ``backend_config`` carries
  ``"known_trip_count":{"n":"5"}``; collectives in its body (or anything the body calls)
  run that many times per step.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Iterable, Sequence

import numpy as np

from .._errors import PartexError
from ..cost import KINDS  # the one list of collective kinds

# opcode -> kind. The async ``-start`` forms count as the collective; ``-done`` is skipped.
_OPCODE_KIND = {k: k for k in KINDS}
_OPCODE_KIND.update({f"{k}-start": k for k in KINDS})
_OPCODE_KIND["ragged-all-to-all"] = "all-to-all"

# Bits per element of each HLO primitive type.
_ELEMENT_BITS = {
    "pred": 8,
    "s1": 1, "u1": 1, "s2": 2, "u2": 2, "s4": 4, "u4": 4,
    "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32, "s64": 64, "u64": 64,
    "f16": 16, "bf16": 16, "f32": 32, "f64": 64,
    "c64": 64, "c128": 128,
    "f4e2m1fn": 4, "f6e2m3fn": 6, "f6e3m2fn": 6, "f8e8m0fnu": 8,
    "f8e3m4": 8, "f8e4m3": 8, "f8e4m3fn": 8, "f8e4m3b11fnuz": 8, "f8e4m3fnuz": 8,
    "f8e5m2": 8, "f8e5m2fnuz": 8,
    "token": 0, "opaque": 0,
}


@dataclasses.dataclass(frozen=True, slots=True)
class Collective:
    """One collective instruction of the compiled (per-device) HLO."""

    kind: str  # one of KINDS
    bytes: int  # per-device bytes of one execution: max(operand bytes, result bytes)
    trips: int  # executions per step: product of enclosing while trip counts
    group_size: int  # devices per replica group (collective-permute: largest cycle/chain)
    axes: tuple[str, ...]  # mesh axes the groups span, in mesh order; () if unknown
    name: str  # HLO instruction name
    computation: str  # HLO computation it sits in

    @property
    def total_bytes(self) -> int:
        return self.bytes * self.trips


# ----------------------------------------------------------------------------- shapes

_ARRAY_SHAPE = re.compile(r"([a-z][a-z0-9]*)\[([^\]]*)\]")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string; tuples are summed (nested tuples too).

    ``f32[4,256]{1,0}`` -> 4096, ``(f32[4]{0}, bf16[2,2]{1,0})`` -> 24, ``f32[]`` -> 4.
    Layouts (``{1,0:T(8,128)}``), index comments and dynamic bounds (``<=8``) are ignored.
    """
    shape = _strip_comments(shape)
    # Drop layouts first: they may contain tiling like T(8,128) that looks like a shape.
    shape = re.sub(r"\{[^{}]*\}", "", shape)
    total = 0
    for m in _ARRAY_SHAPE.finditer(shape):
        dtype, dims = m.group(1), m.group(2)
        bits = _ELEMENT_BITS.get(dtype)
        if bits is None:
            continue  # not an element type (e.g. a stray identifier)
        n = 1
        for d in dims.split(","):
            d = d.strip().lstrip("<=").strip()
            if d:
                n *= int(d) if d.isdigit() else 1
        total += math.ceil(n * bits / 8)
    return total


def _tuple_elements(shape: str) -> list[str]:
    """Top-level elements of a tuple shape string (the shape itself if not a tuple)."""
    s = _strip_comments(shape).strip()
    if not s.startswith("("):
        return [s]
    inner = s[1 : _matching(s, 0)]
    return [p.strip() for p in _split_top(inner) if p.strip()]


# ----------------------------------------------------------------------------- text utils

_COMMENT = re.compile(r"/\*.*?\*/")
_DQ_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_TRIP = re.compile(r'known_trip_count\\?"\s*:\s*\{\s*\\?"n\\?"\s*:\s*\\?"?(\d+)')


def _strip_comments(s: str) -> str:
    return _COMMENT.sub("", s)


def _sanitize(line: str) -> str:
    """Remove /*comments*/ and the contents of double-quoted strings (metadata op names,
    backend configs), which may hold any braces, parentheses or '='."""
    return _DQ_STRING.sub('""', _strip_comments(line))


def _matching(s: str, i: int) -> int:
    """Index of the bracket closing the one at s[i] (or len(s)-1 if unbalanced)."""
    depth = 0
    for j in range(i, len(s)):
        c = s[j]
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def _split_top(s: str) -> list[str]:
    """Split on commas at bracket depth 0."""
    out, depth, start = [], 0, 0
    for j, c in enumerate(s):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            out.append(s[start:j])
            start = j + 1
    out.append(s[start:])
    return out


# ----------------------------------------------------------------------------- HLO lines

_HEADER = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*(\(.*\))?\s*->.*\{\s*$")
_HEADER_NOSIG = re.compile(r"^\s*(ENTRY\s+)?%?([\w.\-]+)\s*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([a-z][\w\-]*)\s*\(")
# Attributes naming called computations.
_CALL_ATTR = re.compile(
    r"\b(body|condition|calls|to_apply|branch_computations|true_computation|"
    r"false_computation|called_computations|scatter|select|comparator)\s*=\s*"
    r"(\{[^{}]*\}|%?[\w.\-]+)"
)


@dataclasses.dataclass(slots=True)
class _Instr:
    name: str
    shape: str
    opcode: str
    operands: list[str]  # operand names
    operand_shapes: list[str | None]  # inline shapes where the text gives them
    attrs: str  # sanitized text after the operand list
    raw: str  # the original line
    computation: str


def _parse_instr(line: str, computation: str) -> _Instr | None:
    clean = _sanitize(line)
    m = _INSTR.match(clean)
    if not m:
        return None
    name, rest = m.group(2), m.group(3).lstrip()
    # Result shape: a balanced tuple or one array token (layout included).
    if rest.startswith("("):
        end = _matching(rest, 0)
        shape, rest = rest[: end + 1], rest[end + 1 :]
    else:
        sm = re.match(r"[a-z][a-z0-9]*\[[^\]]*\](\{[^{}]*(\{[^{}]*\}[^{}]*)*\})?", rest)
        if not sm:
            return None
        shape, rest = sm.group(0), rest[sm.end() :]
    om = _OPCODE.match(rest)
    if not om:
        return None
    opcode = om.group(1)
    start = om.end() - 1
    end = _matching(rest, start)
    args, attrs = rest[start + 1 : end], rest[end + 1 :]
    operands: list[str] = []
    operand_shapes: list[str | None] = []
    for piece in _split_top(args):
        piece = piece.strip()
        if not piece:
            continue
        toks = piece.split()
        operands.append(toks[-1].lstrip("%"))
        operand_shapes.append(" ".join(toks[:-1]) if len(toks) > 1 else None)
    return _Instr(name, shape, opcode, operands, operand_shapes, attrs, line, computation)


@dataclasses.dataclass(slots=True)
class _Module:
    computations: dict[str, list[_Instr]]
    entry: str | None
    shapes: dict[str, dict[str, str]]  # computation -> instruction name -> result shape


def _parse_module(hlo_text: str) -> _Module:
    computations: dict[str, list[_Instr]] = {}
    entry = None
    current: str | None = None
    shapes: dict[str, dict[str, str]] = {}
    for line in hlo_text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("//", "#", "HloModule")):
            continue
        clean = _sanitize(line).strip()
        if clean == "}":
            current = None
            continue
        if clean.endswith("{") and not _INSTR.match(clean):
            h = _HEADER.match(clean) or _HEADER_NOSIG.match(clean)
            if h:
                current = name = h.group(2)
                computations.setdefault(name, [])
                if h.group(1):
                    entry = name
                continue
        if current is None:
            continue
        ins = _parse_instr(line, current)
        if ins is None:
            continue
        computations[current].append(ins)
        shapes.setdefault(current, {})[ins.name] = ins.shape
    return _Module(computations, entry, shapes)


def _call_edges(ins: _Instr) -> list[tuple[str, str]]:
    """(attribute, computation name) for each computation the instruction calls."""
    out = []
    for m in _CALL_ATTR.finditer(ins.attrs):
        attr, val = m.group(1), m.group(2)
        for nm in re.findall(r"%?([\w.\-]+)", val):
            out.append((attr, nm))
    return out


def _trip_count(ins: _Instr) -> int:
    m = _TRIP.search(ins.raw)
    return int(m.group(1)) if m else 1


def _multipliers(mod: _Module) -> dict[str, int]:
    """How many times each computation runs per step.

    A computation's count is the sum over its call sites of the caller's count, times the
    loop's known trip count for a while body/condition (unknown: 1). ``-done`` and
    ``-update`` halves of async pairs are not call sites (they name the same computation as
    their ``-start``). Computations nobody calls (ENTRY) run once. Conditional branches are
    each counted as if taken (an upper bound).
    """
    callers: dict[str, list[tuple[str, int]]] = {c: [] for c in mod.computations}
    for comp, instrs in mod.computations.items():
        for ins in instrs:
            if ins.opcode.endswith("-done") or ins.opcode.endswith("-update"):
                continue
            edges = _call_edges(ins)
            if not edges:
                continue
            trips = _trip_count(ins) if ins.opcode == "while" else 1
            for attr, callee in edges:
                if callee not in callers or callee == comp:
                    continue
                factor = trips if attr in ("body", "condition") else 1
                callers[callee].append((comp, factor))

    memo: dict[str, int] = {}

    def mult(c: str, stack: frozenset[str]) -> int:
        if c in memo:
            return memo[c]
        if c == mod.entry or not callers[c]:
            memo[c] = 1
            return 1
        total = 0
        for caller, factor in callers[c]:
            if caller in stack:  # a cycle: not valid HLO; do not recurse forever
                continue
            total += mult(caller, stack | {c}) * factor
        memo[c] = total or 1
        return memo[c]

    return {c: mult(c, frozenset()) for c in mod.computations}


# ----------------------------------------------------------------------------- groups

_IOTA = re.compile(r"^\[([\d,\s]*)\]\s*<=\s*\[([\d,\s]*)\]\s*(?:T\(([\d,\s]*)\))?$")
_IOTA_ARRAY = re.compile(r"^\[([\d,\s]*)\]\s*(?:T\(([\d,\s]*)\))?$")


def _ints(s: str | None) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", s or "")]


def _iota(reshape: list[int], perm: list[int] | None) -> np.ndarray:
    arr = np.arange(int(np.prod(reshape)) if reshape else 1).reshape(reshape or [1])
    if perm:
        arr = arr.transpose(perm)
    return arr.reshape(-1)


def _extract_attr(attrs: str, key: str) -> str | None:
    """The value of ``key=`` in the sanitized attribute text (brackets balanced)."""
    m = re.search(r"\b" + re.escape(key) + r"\s*=\s*", attrs)
    if not m:
        return None
    i = m.end()
    if i >= len(attrs):
        return ""
    if attrs.startswith("mesh[", i):
        # mesh[...](, device_ids=(...))? {...}
        j = _matching(attrs, i + 4)
        k = j + 1
        dm = re.match(r"\s*,\s*device_ids\s*=\s*", attrs[k:])
        if dm:
            p = k + dm.end()
            k = _matching(attrs, p) + 1
        bm = re.match(r"\s*\{", attrs[k:])
        if bm:
            b = k + bm.end() - 1
            k = _matching(attrs, b) + 1
        return attrs[i:k]
    if attrs[i] in "{[(":
        if attrs[i] == "[":  # iota: [G,S]<=[N]T(...)
            m2 = re.match(r"\[[^\]]*\]\s*<=\s*\[[^\]]*\](\s*T\([^)]*\))?", attrs[i:])
            if m2:
                return m2.group(0)
        return attrs[i : _matching(attrs, i) + 1]
    m3 = re.match(r"[^,\s]+", attrs[i:])
    return m3.group(0) if m3 else ""


def _parse_mesh_groups(text: str) -> list[list[int]] | None:
    """Groups of XLA's mesh-based replica-group form.

    ``mesh['a'=4,'b'=2], device_ids=([2,4]T(1,0)) {'a'}``: lay the device ids (iota, or the
    given order) out on the mesh; a group is the set of devices that agree on every
    coordinate outside the listed axes (a sub-axis ``'a':(pre)size`` is the digit of size
    ``size`` below the first ``pre``-sized part of axis ``a``).
    """
    m = re.match(r"mesh\[([^\]]*)\]", text)
    if not m:
        return None
    axes = re.findall(r"'?([\w.\-]+)'?\s*=\s*(\d+)", m.group(1))
    if not axes:
        return None
    names = [a for a, _ in axes]
    sizes = [int(s) for _, s in axes]
    n = int(np.prod(sizes))
    rest = text[m.end() :]
    ids = np.arange(n)
    dm = re.search(r"device_ids\s*=\s*\(", rest)
    brace_from = 0
    if dm:
        close = _matching(rest, dm.end() - 1)
        spec = rest[dm.end() : close].strip()
        brace_from = close + 1
        im = _IOTA.match(spec)
        am = _IOTA_ARRAY.match(spec)
        if im:
            ids = _iota(_ints(im.group(2)), _ints(im.group(3)) or None)
        elif am:
            ids = _iota(_ints(am.group(1)), _ints(am.group(2)) or None)
        else:
            flat = _ints(spec)
            if len(flat) >= n:
                ids = np.array(flat[-n:])  # a leading dims list, if any, is dropped
            else:
                return None
    bm = re.search(r"\{([^}]*)\}", rest[brace_from:])
    group_axes = bm.group(1) if bm else ""
    refs = re.findall(r"'?([\w.\-]+)'?(?::\((\d+)\)(\d+))?", group_axes)
    coords = np.array(np.unravel_index(np.arange(n), sizes)).T  # (n, ndim)
    # key: coordinates with the grouped (sub-)axes zeroed out
    keys = coords.copy()
    grouped_size = 1
    for ref, pre, size in refs:
        if ref not in names:
            return None
        d = names.index(ref)
        full = sizes[d]
        if pre:
            pre, size = int(pre), int(size)
            stride = full // (pre * size)
            digit = (coords[:, d] // stride) % size
            keys[:, d] -= digit * stride
            grouped_size *= size
        else:
            keys[:, d] = 0
            grouped_size *= full
    groups: dict[tuple[int, ...], list[int]] = {}
    for pos in range(n):
        groups.setdefault(tuple(keys[pos]), []).append(int(ids[pos]))
    out = list(groups.values())
    if any(len(g) != grouped_size for g in out):
        return None
    return out


def parse_replica_groups(text: str | None, num_devices: int) -> list[list[int]] | None:
    """Replica groups in any of XLA's spellings; None if absent or unreadable.

    ``{}`` (or absent on an all-devices collective) means one group of all devices.
    """
    if text is None:
        return None
    t = text.strip()
    if t.startswith("mesh["):
        return _parse_mesh_groups(t)
    im = _IOTA.match(t)
    if im:
        dims = _ints(im.group(1))
        arr = _iota(_ints(im.group(2)), _ints(im.group(3)) or None)
        if len(dims) != 2:
            return None
        return arr.reshape(dims).tolist()
    if t.startswith("{"):
        inner = t[1:-1].strip()
        if not inner:
            return [list(range(num_devices))]
        return [_ints(g) for g in re.findall(r"\{([^{}]*)\}", inner)]
    return None


def _source_target_pairs(text: str | None) -> list[tuple[int, int]]:
    if not text:
        return []
    return [(int(a), int(b)) for a, b in re.findall(r"\{\s*(\d+)\s*,\s*(\d+)\s*\}", text)]


def _varying_axes(members: Sequence[int], mesh_shape: tuple[int, ...]) -> set[int] | None:
    n = int(np.prod(mesh_shape))
    if any(m < 0 or m >= n for m in members):
        return None
    coords = np.array(np.unravel_index(np.asarray(members, dtype=np.int64), mesh_shape)).T
    return {d for d in range(len(mesh_shape)) if len(set(coords[:, d].tolist())) > 1}


def _group_axes(groups: list[list[int]], mesh_shape, axis_names) -> tuple[str, ...]:
    """Mesh axes varying within the groups, if every group spans the same ones."""
    found: set[int] | None = None
    for g in groups:
        v = _varying_axes(g, mesh_shape)
        if v is None:
            return ()
        if found is None:
            found = v
        elif v != found:
            return ()
    return tuple(axis_names[d] for d in sorted(found or ()))


def _permute_info(pairs, mesh_shape, axis_names) -> tuple[int, tuple[str, ...]]:
    """(largest connected set of devices exchanging data, axes along which pairs move)."""
    moving = [(s, t) for s, t in pairs if s != t]
    axes: set[int] = set()
    ok = True
    for s, t in moving:
        v = _varying_axes([s, t], mesh_shape)
        if v is None:
            ok = False
            break
        axes |= v
    # connected components of the pair graph
    parent: dict[int, int] = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for s, t in moving:
        parent[find(s)] = find(t)
    sizes: dict[int, int] = {}
    for x in list(parent):
        r = find(x)
        sizes[r] = sizes.get(r, 0) + 1
    group = max(sizes.values()) if sizes else 1
    return group, (tuple(axis_names[d] for d in sorted(axes)) if ok else ())


# ----------------------------------------------------------------------------- public API


def parse_collectives(hlo_text: str, mesh: Any) -> list[Collective]:
    """Every collective of a compiled module, in text order, with its per-device bytes,
    its executions per step, its group size and the mesh axes it spans.

    ``mesh`` is the ``jax.sharding.Mesh`` the program was compiled for (only its
    ``devices.shape`` and ``axis_names`` are used: group ids are positions in
    ``mesh.devices.flat``).
    """
    mesh_shape = tuple(int(s) for s in np.shape(mesh.devices))
    axis_names = tuple(str(a) for a in mesh.axis_names)
    num_devices = int(np.prod(mesh_shape))
    mod = _parse_module(hlo_text)
    mults = _multipliers(mod)

    # -done instruction of each -start (by operand name): its result is the final result.
    done_shape: dict[str, str] = {}
    for instrs in mod.computations.values():
        for ins in instrs:
            if ins.opcode.endswith("-done") and ins.operands:
                done_shape[ins.operands[0]] = ins.shape

    out: list[Collective] = []
    for comp, instrs in mod.computations.items():
        local = mod.shapes.get(comp, {})
        for ins in instrs:
            kind = _OPCODE_KIND.get(ins.opcode)
            if kind is None:
                continue
            # Operand shapes: inline if printed, else the defining instruction's (names are
            # unique per module in XLA's output; hand-written text may reuse them).
            op_shapes = [
                s or local.get(nm) or _lookup_any(mod.shapes, nm)
                for nm, s in zip(ins.operands, ins.operand_shapes)
            ]
            operand_bytes = sum(shape_bytes(s) for s in op_shapes)
            if ins.opcode.endswith("-start"):
                result_bytes = _start_result_bytes(ins, op_shapes, done_shape.get(ins.name))
            else:
                result_bytes = shape_bytes(ins.shape)
            nbytes = max(operand_bytes, result_bytes)

            if kind == "collective-permute":
                pairs = _source_target_pairs(_extract_attr(ins.attrs, "source_target_pairs"))
                group_size, axes = _permute_info(pairs, mesh_shape, axis_names)
            else:
                rg = _extract_attr(ins.attrs, "replica_groups")
                if rg is None:  # no attribute: one group of every device
                    rg = "{}"
                groups = parse_replica_groups(rg, num_devices)
                if groups:
                    group_size = len(groups[0])
                    axes = _group_axes(groups, mesh_shape, axis_names)
                else:
                    group_size, axes = 0, ()
            out.append(
                Collective(
                    kind=kind,
                    bytes=int(nbytes),
                    trips=int(mults.get(comp, 1)),
                    group_size=int(group_size),
                    axes=axes,
                    name=ins.name,
                    computation=comp,
                )
            )
    return out


def _lookup_any(shapes: dict[str, dict[str, str]], name: str) -> str:
    for table in shapes.values():
        if name in table:
            return table[name]
    return ""


def _start_result_bytes(ins: _Instr, op_shapes: list[str], done: str | None) -> int:
    """Result bytes of the logical collective behind an async ``-start``.

    With the matching ``-done`` present, its result is the collective's result. Otherwise
    read the ``-start``'s own shape: a tuple that begins with the operands (all-gather,
    collective-permute) holds the result after them, followed possibly by u32[]/s32[]
    context scalars; anything else is the result itself (all-reduce-start).
    """
    if done is not None:
        return shape_bytes(done)
    elems = _tuple_elements(ins.shape)
    if len(elems) == 1:
        return shape_bytes(ins.shape)
    def norm(x: str) -> str:
        return re.sub(r"\{[^{}]*\}", "", _strip_comments(x)).replace(" ", "")

    ops = [norm(x) for x in op_shapes]
    # The operands lead the tuple: as its first k elements, or as one nested tuple.
    if [norm(e) for e in elems[: len(ops)]] == ops:
        rest = elems[len(ops) :]
    elif elems[0].startswith("(") and [norm(e) for e in _tuple_elements(elems[0])] == ops:
        rest = elems[1:]
    else:
        return shape_bytes(ins.shape)
    rest = [e for e in rest if not re.fullmatch(r"[su]32\[\]", norm(e))]
    return sum(shape_bytes(e) for e in rest) if rest else shape_bytes(ins.shape)


def collective_bytes_by_kind(colls: Iterable[Collective]) -> dict[str, int]:
    """kind -> sum of total_bytes (bytes x trips), every kind present (0 if none)."""
    out = {k: 0 for k in KINDS}
    for c in colls:
        out[c.kind] = out.get(c.kind, 0) + c.total_bytes
    return out


def memory_stats(compiled: Any) -> dict[str, int]:
    """Per-device memory of a compiled executable, from ``compiled.memory_analysis()``.

    ``total = argument + output + temp - alias``: on CPU ``peak_memory_in_bytes`` leaves
    temporaries out, so it is not used. ``alias`` is the donated (input-output aliased)
    bytes.
    """
    ma = compiled.memory_analysis()
    if ma is None:
        raise PartexError("XLA gave no memory analysis for this executable on this backend")

    def get(attr: str) -> int:
        v = getattr(ma, attr, None)
        if v is None and isinstance(ma, dict):
            v = ma.get(attr)
        return int(v or 0)

    stats = {
        "argument": get("argument_size_in_bytes"),
        "output": get("output_size_in_bytes"),
        "temp": get("temp_size_in_bytes"),
        "alias": get("alias_size_in_bytes"),
        "generated_code": get("generated_code_size_in_bytes"),
    }
    stats["total"] = stats["argument"] + stats["output"] + stats["temp"] - stats["alias"]
    return stats


__all__ = [
    "KINDS",
    "Collective",
    "collective_bytes_by_kind",
    "memory_stats",
    "parse_collectives",
    "parse_replica_groups",
    "shape_bytes",
]

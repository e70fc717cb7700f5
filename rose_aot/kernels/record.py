"""The kernel record: every launch fact of one compiled (point, arch), computed once.

The compile worker builds a :class:`PointRecord` from the family's argument spec and variants
plus what the compiler produced (entry names, resource usage, artifact digests), checks it
against the PTX and the cubin, caches it with the artifacts and writes it into the bundle
index. The loader reads it back with :meth:`PointRecord.from_json` and launches from it as is:
argument checks from ``args``, packed parameters from each variant's ``params``, block, shared
memory and launch attributes from the variant. Only what depends on runtime sizes (the grid,
the decode/prefill choice, the device's SM count) is computed at launch, by the family's plan,
which reads the records' constants.

Plain Python; never imports cutlass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..bundle.cubin import read_cubin
from .spec import (Arg, ParamField, TensorArg, Variant, arg_from_json, json_int, param_align,
                   param_fields, param_size)

__all__ = ["RECORD_VERSION", "ParamRecord", "VariantRecord", "PointRecord"]

# Bumped whenever the meaning of a record field changes; a loader refuses other versions.
# 3: a point's parameters are written once ("params"), each variant naming its own in kernel
# order, and a variant's resources are a list in entry order. Written per variant, parameters
# and resources keyed by entry name were a third of a DeepSeek-V3 bundle's index, which a
# serving process parses at every start.
# 4: the chunked-row families' variants record `chunks_in_x`, the order of their grid
# (chunked_rows.chunk_grid); a loader that ignored it would launch act_and_mul's cubins with
# rows and chunks swapped, so version-3 loaders and bundles are refused instead.
RECORD_VERSION = 4


@dataclass(frozen=True)
class ParamRecord:
    """One kernel parameter: which argument, its packed size and alignment, its C fields."""

    name: str
    size: int
    align: int
    fields: tuple[ParamField, ...]

    @classmethod
    def of(cls, arg: Arg, memo: dict | None = None) -> "ParamRecord":
        """The packing of `arg`. With `memo` (see from_json), the memo's record when it has
        an equal one, so that a check against records read with that memo mostly compares
        a record with itself."""
        fields = param_fields(arg)
        record = cls(arg.name, param_size(arg, fields), param_align(arg, fields), fields)
        if memo is None:
            return record
        values = tuple((f.kind, f.fmt, f.offset, f.mode, f.dim) for f in fields)
        return memo.setdefault(_memo_key(record.name, record.size, record.align, values), record)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "size": self.size,
            "align": self.align,
            "fields": [f.to_json() for f in self.fields],
        }

    @classmethod
    def from_json(cls, data: dict, memo: dict | None = None) -> "ParamRecord":
        """With `memo` (one dict per index read), equal parameters share one record: the
        points of an index repeat a few dozen distinct ones, and making the frozen dataclasses
        is most of the cost of reading them. The memo key is the converted values themselves,
        so a hit is exactly the record the conversions would have built."""
        name, size, align = str(data["name"]), json_int(data["size"]), json_int(data["align"])
        # list comprehensions, not generators, in this and the other readers: an index has
        # hundreds of these and a generator costs a frame resume per item
        values = tuple([ParamField.values_from_json(f) for f in _list(data["fields"])])
        key = (name, size, align, values)  # _memo_key, inlined: hundreds of calls
        memo = {} if memo is None else memo
        record = memo.get(key)
        if record is None:
            record = memo[key] = cls(name, size, align, tuple([ParamField(*v) for v in values]))
        return record


def _memo_key(name: str, size: int, align: int, field_values: tuple) -> tuple:
    """A ParamRecord's memo key: its values, each field as its values (str and int only, so
    equal keys are equal records, and hashing needs no dataclass hash)."""
    return (name, size, align, field_values)


@dataclass(frozen=True)
class VariantRecord:
    """The launch facts of one compiled variant. Attributes mirror :class:`Variant` (block,
    smem, cooperative, pdl, cluster, constants), so a family's plan reads either."""

    name: str
    entries: tuple[str, ...]  # kernel entry names, launch order
    block: tuple[int, int, int]
    cluster: tuple[int, int, int]
    smem: int  # dynamic shared memory bytes the launch passes
    cooperative: bool
    pdl: int  # largest launch (threads) made with programmatic dependent launch; 0 = never
    params: tuple[ParamRecord, ...]  # kernel order
    constants: dict
    resources: dict  # per entry: registers, static_smem, param_bytes (from the cubin)
    cubin_sha256: str
    ptx_sha256: str

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def check_cubin(self, cubin: bytes) -> None:
        """Raise ValueError unless the cubin holds this record's entries, compiled for its block
        size, with its parameter sizes: an artifact stored under the wrong point or variant,
        or a record out of date, never reaches the driver."""
        facts = read_cubin(cubin)
        sizes = [p.size for p in self.params]
        for entry in self.entries:
            got = facts.get(entry)
            if got is None:
                raise ValueError(f"the cubin has no kernel entry {entry[:60]}...")
            for what, dims in (("reqntid", got.reqntid), ("maxntid", got.maxntid)):
                if dims is not None and tuple(dims) != self.block:
                    raise ValueError(
                        f"the cubin's {what} is {tuple(dims)} but the record launches blocks of "
                        f"{self.block}"
                    )
            if got.param_sizes != sizes:
                raise ValueError(
                    f"the cubin's parameter sizes are {got.param_sizes}, the record packs {sizes}"
                )

    @classmethod
    def build(
        cls,
        variant: Variant,
        args: dict[str, Arg],
        entries: list[str],
        resources: dict,
        cubin_sha256: str,
        ptx_sha256: str,
    ) -> "VariantRecord":
        return cls(
            variant.name,
            tuple(entries),
            tuple(variant.block),
            tuple(variant.cluster),
            variant.smem,
            variant.cooperative,
            variant.pdl,
            tuple(ParamRecord.of(args[p]) for p in variant.params),
            dict(sorted(variant.constants.items())),
            resources,
            cubin_sha256,
            ptx_sha256,
        )

    def to_json(self) -> dict:
        return {
            "record_version": RECORD_VERSION,
            "name": self.name,
            "entries": list(self.entries),
            "block": list(self.block),
            "cluster": list(self.cluster),
            "smem": self.smem,
            "cooperative": self.cooperative,
            "pdl": self.pdl,
            "params": [p.name for p in self.params],  # the point's "params" hold their layout
            "constants": dict(sorted(self.constants.items())),
            "resources": [self.resources[e] for e in self.entries],
            "cubin_sha256": self.cubin_sha256,
            "ptx_sha256": self.ptx_sha256,
        }

    @classmethod
    def from_json(cls, data: dict, params: dict[str, ParamRecord]) -> "VariantRecord":
        """Raises KeyError/TypeError/ValueError (malformed). `params`: the point's parameters by
        name. Read through PointRecord.from_json, which checks the record version first."""
        constants = data["constants"]
        if not isinstance(constants, dict):
            raise TypeError("constants must be an object")
        entries = tuple([str(e) for e in _list(data["entries"])])
        resources = _list(data["resources"])
        if len(resources) != len(entries) or not all(type(r) is dict for r in resources):
            raise ValueError("resources must be an object per entry")
        names = _list(data["params"])
        if not all(type(n) is str for n in names):
            raise TypeError("a variant's params are the names of the point's parameters")
        return cls(
            str(data["name"]),
            entries,
            _dims(data["block"]),
            _dims(data["cluster"]),
            json_int(data["smem"]),
            _bool(data["cooperative"]),
            json_int(data["pdl"]),
            tuple([params[n] for n in names]),
            dict(constants),
            dict(zip(entries, resources)),
            str(data["cubin_sha256"]),
            str(data["ptx_sha256"]),
        )


@dataclass(frozen=True)
class PointRecord:
    """Everything the loader needs of one (point, arch): call arguments, workspace, variants."""

    args: tuple[Arg, ...]  # call arguments, in the order a kernel handle takes them
    workspace: tuple[TensorArg, ...]  # loader-owned scratch
    variants: tuple[VariantRecord, ...]

    def variant(self, name: str) -> VariantRecord:
        for v in self.variants:
            if v.name == name:
                return v
        raise KeyError(name)

    @property
    def by_name(self) -> dict[str, VariantRecord]:
        return {v.name: v for v in self.variants}

    def to_json(self) -> dict:
        params: dict[str, ParamRecord] = {}  # every variant's, once, in first-use order
        for v in self.variants:
            for p in v.params:
                if params.setdefault(p.name, p) != p:
                    raise ValueError(f"variants pack parameter {p.name!r} in two ways")
        return {
            "args": [a.to_json() for a in self.args],
            "workspace": [a.to_json() for a in self.workspace],
            "params": [p.to_json() for p in params.values()],
            "variants": [v.to_json() for v in self.variants],
        }

    @classmethod
    def from_json(cls, data: dict, memo: dict | None = None) -> "PointRecord":
        """`memo`: one dict for every record of an index (see ParamRecord.from_json)."""
        raw_variants = _list(data["variants"])
        for v in raw_variants:  # an old record is refused as such, not as malformed
            _check_version(v)
        workspace = tuple([arg_from_json(a) for a in _list(data["workspace"])])
        if not all(isinstance(a, TensorArg) and a.role == "workspace" for a in workspace):
            raise ValueError("workspace entries must be tensors with role 'workspace'")
        params = {}
        for p in _list(data["params"]):
            param = ParamRecord.from_json(p, memo)
            if param.name in params:
                raise ValueError(f"parameter names repeat: {param.name!r}")
            params[param.name] = param
        variants = tuple([VariantRecord.from_json(v, params) for v in raw_variants])
        names = [v.name for v in variants]
        if len(set(names)) != len(names):
            raise ValueError(f"variant names repeat: {names}")
        return cls(tuple([arg_from_json(a) for a in _list(data["args"])]), workspace, variants)


def _check_version(variant: Any) -> None:
    version = variant["record_version"]
    if version != RECORD_VERSION:
        raise ValueError(f"record version {version!r}; this rose-aot reads version {RECORD_VERSION}")


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    return value


def _bool(value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"expected a boolean, got {type(value).__name__}")
    return value


def _dims(value: Any) -> tuple[int, int, int]:
    dims = tuple([json_int(v) for v in _list(value)])
    if len(dims) != 3 or min(dims) < 1:
        raise ValueError(f"expected three positive integers, got {value!r}")
    return dims

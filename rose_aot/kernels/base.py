"""What a kernel family is, in plain Python (no cutlass): config, arguments, variants, launch plan.

A family's config is a frozen dataclass; every field changes generated code, and its canonical
form (:func:`point_key`) is the cache key, the bundle key and the lookup key at once.
The device code of a family lives in a separate module (``device_module``) that only the builder
and tests import.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import json
import math
from pathlib import Path
from collections.abc import Mapping
from typing import Any, ClassVar

from ..archs import Arch
from ..errors import ConfigError
from .spec import Arg, Launch, Variant

__all__ = [
    "KernelFamily",
    "choice",
    "point_key",
    "config_json",
    "config_digest",
    "kernel_source_files",
    "kernel_source_digest",
]


def choice(*values, default=dataclasses.MISSING, doc: str = ""):
    """A config field limited to a set of values."""
    return dataclasses.field(default=default, metadata={"choices": tuple(values), "doc": doc})


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    return str(value)


@functools.cache
def _config_fields(config_class: type) -> tuple[tuple[dataclasses.Field, str, bool], ...]:
    """Per config class, once (a serving process converts every point's config at open):
    each field with its type's name without "| None", and whether None is allowed."""
    out = []
    for f in dataclasses.fields(config_class):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        out.append((f, kind.replace(" | None", ""), "None" in kind))
    return tuple(out)


def point_key(family: str, config: Any) -> str:
    """Canonical, human-readable name of a kernel point, e.g. ``qk_norm(head_dim=128,...)``."""
    parts = [f"{f.name}={_format_value(getattr(config, f.name))}"
             for f, _, _ in _config_fields(type(config))]
    return f"{family}({','.join(parts)})"


def config_json(config: Any) -> dict:
    return {f.name: getattr(config, f.name) for f, _, _ in _config_fields(type(config))}


def config_digest(family: str, config: Any) -> str:
    blob = json.dumps({"family": family, "config": config_json(config)}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()


class KernelFamily:
    """Base of every kernel family. Subclasses set the class attributes and the four methods."""

    name: ClassVar[str]
    Config: ClassVar[type]
    # Dotted module with `host_function(config, variant, arch)`; default: the family folder's
    # ``device`` module.
    device_module: ClassVar[str] = ""
    size_names: ClassVar[tuple[str, ...]] = ("tokens",)  # runtime sizes the plan depends on
    plan_choices: ClassVar[tuple[str, ...]] = ("decode", "prefill")  # names `force` accepts
    # Config fields that make a point's "shape" (tensor extents): `rose-aot diff` reports two
    # points of one shape with other settings as one changed point. None: every field is shape.
    shape_fields: ClassVar[tuple[str, ...] | None] = None

    # --- config -----------------------------------------------------------------------------
    def make_config(self, **values) -> Any:
        """Build a validated config from user values (manifest fields, lookup keywords)."""
        fields = _config_fields(self.Config)
        names = [f.name for f, _, _ in fields]
        for key in values:
            if key not in names:  # a config has a few fields: a list is as quick as a set
                raise ConfigError(
                    self.name, key, f"unknown field; {self.name} has: {', '.join(names)}"
                )
        kwargs = {}
        for f, kind, optional in fields:
            if f.name in values:
                kwargs[f.name] = self._coerce(f, kind, optional, values[f.name])
            elif f.default is dataclasses.MISSING:
                choices = f.metadata.get("choices")
                hint = f"; one of {', '.join(map(repr, choices))}" if choices else ""
                raise ConfigError(self.name, f.name, f"missing (required){hint}")
        config = self.Config(**kwargs)
        self.validate(config)
        return config

    def _coerce(self, f: dataclasses.Field, kind: str, optional: bool, value: Any) -> Any:
        """`value` for field `f` (of type `kind`, None allowed if `optional`), checked."""
        if kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif kind == "bool":
            ok = isinstance(value, bool)
        elif kind == "str":
            ok = isinstance(value, str)
        elif kind == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            ok = True
        if value is None and optional:
            ok = True
        if not ok:
            shown = f"{kind} | None" if optional else kind
            raise ConfigError(
                self.name, f.name, f"expected {shown}, got {type(value).__name__} {value!r}"
            )
        if kind == "float" and not optional:
            try:
                value = float(value) + 0.0  # + 0.0 folds -0.0 into 0.0: one config, one key
            except OverflowError:
                raise ConfigError(self.name, f.name, f"{value} is out of range") from None
            if not math.isfinite(value):
                raise ConfigError(self.name, f.name, f"must be finite (got {value})")
        choices = f.metadata.get("choices")
        if choices and value not in choices:
            raise ConfigError(
                self.name,
                f.name,
                f"{value!r} is not supported; choose one of {', '.join(map(repr, choices))}",
            )
        return value

    def validate(self, config: Any) -> None:
        """Cross-field checks; raise ConfigError naming the field."""

    def key(self, config: Any) -> str:
        return point_key(self.name, config)

    # --- interface ----------------------------------------------------------------------------
    def args(self, config: Any, arch: Arch) -> tuple[Arg, ...]:
        """The call arguments, in the order the kernel handle takes them. Alignment and stride
        divisibility may depend on the arch's access width."""
        raise NotImplementedError

    def workspace(self, config: Any, arch: Arch) -> tuple[Arg, ...]:
        """Scratch tensors the kernels need (counters, barrier words), with static shapes and
        role "workspace".

        The loader owns one zero-initialised set per device and stream; the kernels must leave
        them as they found them (zero, or a self-resetting barrier word)."""
        return ()

    def kernel_args(self, config: Any, arch: Arch) -> tuple[Arg, ...]:
        """Every argument a variant's `params` may name: call arguments, then workspace."""
        return tuple(self.args(config, arch)) + tuple(self.workspace(config, arch))

    def variants(self, config: Any, arch: Arch) -> tuple[Variant, ...]:
        """The compile units of this point for this arch: the one place where block, shared
        memory, launch attributes and compile-time constants are decided."""
        raise NotImplementedError

    def plan(
        self,
        config: Any,
        variants: Mapping[str, Any],
        sizes: dict[str, int],
        sm_count: int,
        force: str | None = None,
    ) -> tuple[Launch, ...]:
        """The launches for these runtime sizes on a device with `sm_count` SMs.

        `variants` maps each variant name to its record (or its :class:`Variant`, which has the
        same attributes): the plan reads block sizes and constants from there and decides only
        what depends on the sizes. `force` picks a plan by name (tests, benchmarks);
        implementations call `check_force` first."""
        raise NotImplementedError

    def sample_sizes(self, config: Any) -> list[dict[str, int]]:
        """Runtime sizes covering every branch of the plan, for checks that a plan understands
        a record (the loader at an arch's first use, the builder, the conformance suite)."""
        return [{"tokens": t} for t in (1, 7, 1024, 65536)]

    def check_force(self, force: str | None) -> None:
        if force is not None and force not in self.plan_choices:
            raise ConfigError(
                self.name,
                "variant",
                f"unknown variant {force!r}; choose one of {', '.join(self.plan_choices)}",
            )

    def reference(self, config: Any, *tensors) -> None:
        """Float64 torch reference: performs the kernel's writes on the given (CPU) tensors.
        Lives in the family's ``reference`` module."""
        module = importlib.import_module(type(self).__module__.rsplit(".", 1)[0] + ".reference")
        module.reference(config, *tensors)

    def op_suffix(self, config: Any) -> str:
        """Suffix of the torch operator name (``rose_aot.torch_ops``) for points whose argument
        list differs from the family's plain one; one operator has one schema."""
        return ""

    def derive(self, model) -> list:
        """The family's [[kernel]] entries for a model (``manifest from-config``): its folder's
        ``derive`` module, given :class:`rose_aot.manifest.model.ModelFacts`; none if the family
        has no such module."""
        package = type(self).__module__.rsplit(".", 1)[0]
        try:
            module = importlib.import_module(package + ".derive")
        except ModuleNotFoundError as exc:
            if exc.name != package + ".derive":
                raise
            return []
        return module.derive(model)

    # --- provenance ---------------------------------------------------------------------------
    def source_files(self) -> list[Path]:
        """Files whose content can change generated code or launch facts: the whole kernels
        package (every family, the shared helpers, the ABI, tuning data), the arch table and
        the code that builds records.
        Deliberately coarse: a cache key that misses one file ships a stale kernel."""
        return kernel_source_files()

    def source_digest(self) -> str:
        return kernel_source_digest()


def kernel_source_files() -> list[Path]:
    package = Path(__file__).resolve().parent
    files = sorted(p for p in package.rglob("*.py") if "__pycache__" not in p.parts)
    root = package.parent
    # The arch table shapes code; the compile worker and the cubin reader shape the record.
    return files + [root / "archs.py", root / "builder" / "compile.py", root / "bundle" / "cubin.py"]


def kernel_source_digest() -> str:
    """sha256 over the relative path and bytes of every file of :func:`kernel_source_files`."""
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for path in kernel_source_files():
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()

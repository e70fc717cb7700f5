"""The one exception hierarchy of rose-aot.

Every error a user can cause derives from :class:`RoseAotError`, and every message says what
to do about it. Errors cross process boundaries (the builder compiles in worker processes), so
each class pickles with its message and structured fields intact.
"""

from __future__ import annotations

__all__ = [
    "RoseAotError",
    "ConfigError",
    "ManifestError",
    "BuildError",
    "BundleError",
    "ShardError",
    "CoverageError",
    "KernelNotFoundError",
    "ArgumentError",
    "DeviceError",
    "SettingsError",
]


class RoseAotError(Exception):
    """Base class of every rose-aot error."""

    def __reduce__(self):
        # Exception pickles only self.args; the subclasses keep structured fields as attributes.
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ConfigError(RoseAotError, ValueError):
    """A kernel config field has a wrong type or an unsupported value."""

    def __init__(self, family: str, field: str, message: str):
        super().__init__(f"{family}: field '{field}': {message}")
        self.family = family
        self.field = field
        self.reason = message


class ManifestError(RoseAotError):
    """A manifest cannot be read or does not validate. Names the file, the entry and the field."""

    def __init__(self, path: str, message: str, entry: str | None = None, field: str | None = None):
        where = str(path)
        if entry is not None:
            where += f": {entry}"
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {message}")
        self.path = str(path)
        self.entry = entry
        self.field = field
        self.reason = message


class BuildError(RoseAotError):
    """Compiling a kernel point failed; keeps the DSL's own message."""

    def __init__(self, point: str, arch: str, message: str):
        super().__init__(f"compiling {point} for {arch} failed:\n{message}")
        self.point = point
        self.arch = arch
        self.reason = message


class BundleError(RoseAotError):
    """A bundle is missing, damaged, truncated, of another format version, or inconsistent."""


class ShardError(RoseAotError):
    """Build shards cannot be merged: one is missing, given twice, damaged, or from another
    build (other manifests, kernel sources or toolchain)."""


class CoverageError(RoseAotError):
    """A bundle lacks points a deployment needs, or needs a newer driver than the fleet has.

    ``report`` is the :class:`rose_aot.check.CoverageReport` with the full list."""

    def __init__(self, message: str, report=None):
        super().__init__(message)
        self.report = report


class KernelNotFoundError(RoseAotError, KeyError):
    """The bundle has no artifact for the requested point; lists the nearest points it has."""

    def __init__(self, requested: str, nearest: list[str], detail: str = ""):
        msg = f"the bundle has no kernel {requested}"
        if detail:
            msg += f" ({detail})"
        if nearest:
            msg += "; nearest points in the bundle:\n  " + "\n  ".join(nearest)
        else:
            msg += "; the bundle has no point of this family"
        msg += "\nadd the point to a manifest and rebuild the bundle"
        super().__init__(msg)
        self.requested = requested
        self.nearest = list(nearest)

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class ArgumentError(RoseAotError, ValueError):
    """A kernel was called with a tensor of the wrong dtype, shape, device, strides or alignment."""


class DeviceError(RoseAotError):
    """The CUDA driver refused an operation, or the device is not one the bundle was built for."""


class SettingsError(RoseAotError, ValueError):
    """An environment variable rose-aot reads (ROSE_AOT_*) has a value it cannot use."""

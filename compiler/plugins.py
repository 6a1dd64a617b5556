"""Registries of named plug-ins: each kind of capability a recipe names (a calibration method, an output format…)
is a module that registers one entry here under the name the recipe writes. The language, `qrc explain` and the
backends ask the registry for the name instead of matching a closed list, so a new entry needs no edit elsewhere
(docs/contributing.md). The built-in entries register when `compiler` is imported; a plug-in registers when its
own module is imported."""

from __future__ import annotations

from collections.abc import Iterator
from typing import ClassVar, Generic, Protocol, TypeVar


class Named(Protocol):
    """What a registered entry has: the name recipes write."""

    name: str


T = TypeVar("T", bound=Named)


class Registry(Generic[T]):
    """The entries of one kind, by name."""

    def __init__(self, kind: str):
        self.kind = kind  # in words, for messages: "calibration method"
        self._entries: dict[str, T] = {}
        _BY_KIND[kind] = self

    def register(self, entry: T) -> T:
        """Add `entry` under its name (a decorator too); a second entry under a taken name is refused, since a
        recipe's meaning must not depend on which module was imported last."""
        taken = self._entries.get(entry.name)
        if taken is not None and taken is not entry:
            raise ValueError(f"a {self.kind} named `{entry.name}` is registered already ({taken!r})")
        self._entries[entry.name] = entry
        return entry

    def unregister(self, name: str) -> None:
        """Remove an entry (a plug-in's test cleans up after itself)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T | None:
        """The entry named `name`, or None."""
        return self._entries.get(name)

    def lookup(self, name: str) -> T:
        """The entry named `name` (KeyError when none is: a name the recipe's checks have already accepted)."""
        found = self._entries.get(name)
        if found is None:
            raise KeyError(f"no {self.kind} `{name}` is registered")
        return found

    def names(self) -> tuple[str, ...]:
        """Every registered name, sorted (what a diagnostic lists as valid)."""
        return tuple(sorted(self._entries))

    def __iter__(self) -> Iterator[T]:
        return iter([self._entries[n] for n in self.names()])

    def __contains__(self, name: object) -> bool:
        return name in self._entries


_BY_KIND: dict[str, Registry] = {}


def registered(kind: str, name: str):
    """The entry `name` of the registry of `kind` (how a RegisteredValue is unpickled)."""
    return _BY_KIND[kind].lookup(name)


class RegisteredValue:
    """A frozen value registered by name (an output format, a rounding method, a transform): printed as its name,
    and unpickled (a torchrun rank, a worker process) as the registered one, so that `is` compares. A subclass
    is a frozen dataclass with a `name` field and says its `REGISTRY`."""

    __slots__ = ()
    REGISTRY: ClassVar[Registry]
    name: str

    def __str__(self) -> str:
        return self.name

    def __reduce__(self):
        return registered, (self.REGISTRY.kind, self.name)


ENTRY_POINTS = "qrc.plugins"  # the entry-point group installed plug-ins declare their modules in
FAILED: list[tuple[str, str]] = []  # (entry point, why) of each installed plug-in that could not be imported


def load_installed() -> None:
    """Import every installed plug-in (the modules packages declare in the entry-point group `qrc.plugins`):
    each registers what it adds when imported, in this process and in every process a compile starts (torchrun's
    ranks import `compiler` too). One that fails is kept in FAILED, which `qrc check` reports (Q450)."""
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINTS):
        try:
            point.load()
        except Exception as exc:  # a broken plug-in must not stop qrc: its names are unknown (Q107) instead
            FAILED.append((f"{point.name} = {point.value}", f"{type(exc).__name__}: {exc}"))


# The registries of the kinds a recipe names. What an entry of each kind provides is said where the kind is
# defined (a calibration method: compiler/ir/kinds.py CalibrationMethod; the built-ins: compiler/quant/methods/).
CALIBRATION_METHODS: Registry = Registry("calibration method")  # `method NAME`: the method's class
# `emit … { format NAME }`: an EmitFormat (compiler/ir/kinds.py); each backend that writes it registers how
EMIT_FORMATS: Registry = Registry("output format")
# `weights NAME` / `activations NAME`: a QType (compiler/ir/kinds.py)
QTYPES: Registry = Registry("quantized type")
# `rounding NAME` in a scheme: a Rounding (compiler/ir/kinds.py)
ROUNDINGS: Registry = Registry("rounding method")
# `transform NAME { … }`: a TransformKind (compiler/ir/kinds.py)
TRANSFORMS: Registry = Registry("transform")

# `qrc explain WORD` lists the entries of a kind, each with its one-line `summary`
BY_WORD: dict[str, Registry] = {"methods": CALIBRATION_METHODS, "formats": EMIT_FORMATS, "roundings": ROUNDINGS,
                                "types": QTYPES,
                                "transforms": TRANSFORMS}

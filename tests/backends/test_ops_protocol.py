"""The ops interface (``backends.types.Ops``) against the backend classes.

``Ops`` is what ``get_ops()`` is typed as, so every backend class must offer each of its members
with parameters a caller of the protocol can pass. mypy checks ReferenceOps and CpuOps where they
are assigned to ``type[Ops]`` below (this file is in ``[tool.mypy] files``): members, parameter
counts, kinds and types, but not the names of positional parameters. The tests check members,
names and defaults at run time from the signatures, for CudaOps too where numba-cuda is
installed, and that the protocol names every public member of ReferenceOps (a new primitive is
added to both).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from fastlayers.backends.cpu import CpuOps
from fastlayers.backends.reference import ReferenceOps
from fastlayers.backends.types import Ops
from tests.conftest import needs_numba_cuda

#: The host backends, statically checked against the protocol by the assignment.
HOST_BACKENDS: list[type[Ops]] = [ReferenceOps, CpuOps]

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def protocol_methods() -> dict[str, Callable[..., Any]]:
    return {name: value for name, value in vars(Ops).items() if inspect.isfunction(value) and not name.startswith("_")}


def protocol_attributes() -> list[str]:
    return [name for name, value in vars(Ops).items() if isinstance(value, property)]


def signature_problems(wanted: Callable[..., Any], given: Callable[..., Any]) -> list[str]:
    """How ``given``'s parameters fail a caller of ``wanted`` (self left out of both): each
    positional parameter at its place with its name, each keyword one by name (or through
    ``**kw``), a default wherever ``wanted`` has one, and nothing more required."""
    want = list(inspect.signature(wanted).parameters.values())[1:]
    have = list(inspect.signature(given).parameters.values())[1:]
    positional = [p for p in have if p.kind in _POSITIONAL]
    by_name = {p.name: p for p in have}
    any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in have)
    problems = []
    for i, p in enumerate(want):
        if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            q = positional[i] if i < len(positional) else None
            if q is None or q.name != p.name or q.kind is not p.kind:
                problems.append(f"parameter {i + 1} is {q}, expected {p.name}")
                continue
        elif p.kind is inspect.Parameter.KEYWORD_ONLY:
            q = by_name.get(p.name)
            if q is None:
                if not any_keyword:
                    problems.append(f"no keyword {p.name}")
                continue
            if q.kind not in _KEYWORD:
                problems.append(f"{p.name} is not a keyword parameter")
                continue
        else:
            if p.kind is inspect.Parameter.VAR_KEYWORD and not any_keyword:
                problems.append("no **kwargs")
            continue
        if p.default is not inspect.Parameter.empty and q.default is inspect.Parameter.empty:
            problems.append(f"{p.name} has no default")
    wanted_names = {p.name for p in want}
    for q in have:
        if (
            q.default is inspect.Parameter.empty
            and q.name not in wanted_names
            and q.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        ):
            problems.append(f"requires {q.name}, which the protocol does not give")
    return problems


def conformance_problems(cls: type) -> list[str]:
    problems = [f"{cls.__name__} has no attribute {name}" for name in protocol_attributes() if not hasattr(cls, name)]
    for name, wanted in protocol_methods().items():
        given = getattr(cls, name, None)
        if not callable(given):
            problems.append(f"{cls.__name__} has no method {name}")
            continue
        problems += [f"{cls.__name__}.{name}: {p}" for p in signature_problems(wanted, given)]
    return problems


def default_changes(cls: type) -> list[str]:
    """Overrides whose defaults differ from ReferenceOps's (the oracle's) for the same parameter."""
    changes = []
    for name in protocol_methods():
        reference = inspect.signature(getattr(ReferenceOps, name)).parameters
        for p in inspect.signature(getattr(cls, name)).parameters.values():
            r = reference.get(p.name)
            if r is not None and p.default is not inspect.Parameter.empty and p.default != r.default:
                changes.append(f"{cls.__name__}.{name}({p.name}={p.default!r}), reference {r.default!r}")
    return changes


def test_protocol_names_every_public_member_of_reference_ops():
    public = {name for name in vars(ReferenceOps) if not name.startswith("_")}
    declared = set(protocol_methods()) | set(protocol_attributes())
    assert public - declared == set(), "members of ReferenceOps missing from Ops"
    assert declared - public == set(), "members of Ops that ReferenceOps does not define"


@pytest.mark.parametrize("cls", HOST_BACKENDS, ids=lambda cls: cls.__name__)
def test_host_backend_offers_the_protocol(cls):
    assert conformance_problems(cls) == []
    assert default_changes(cls) == []


@needs_numba_cuda
def test_cuda_backend_offers_the_protocol():
    from fastlayers.backends.cuda import CudaOps

    assert conformance_problems(CudaOps) == []
    assert default_changes(CudaOps) == []


def test_signature_problems_are_found():
    class Broken:
        def dense(self, x, w_oi, b_o, activation, alpha=0.0, *, extra):
            raise NotImplementedError

    problems = signature_problems(Ops.dense, Broken.dense)
    assert "parameter 2 is w_oi, expected w_io" in problems
    assert "activation has no default" in problems
    assert "requires extra, which the protocol does not give" in problems
    missing = conformance_problems(Broken)
    assert "Broken has no attribute name" in missing
    assert "Broken has no method conv2d" in missing

"""``ops.OPS`` is made of the operator families' tables (``ops.FAMILIES``): each operator is in
exactly one family, so that no family's entry silently replaces another's."""

from fastlayers.onnx.ops import FAMILIES, OPS


def test_every_operator_is_in_exactly_one_family():
    family_of: dict[str, str] = {}
    for family, table in FAMILIES.items():
        for name in table:
            assert name not in family_of, f"{name!r} is in both {family_of[name]!r} and {family!r}"
            family_of[name] = family
    assert set(family_of) == set(OPS)
    assert all(OPS[name] is FAMILIES[family][name] for name, family in family_of.items())

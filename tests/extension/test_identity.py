"""extension/identity.py: a refused re-run names the first differing leaf of the record, however deep."""

from __future__ import annotations

from posenc_cli.extension.identity import differences


def test_the_phrase_names_the_first_differing_leaf() -> None:
    old = {"scaling": {"method": "yarn", "params": {"beta_fast": 32.0, "truncate": True}}, "logn": None}
    new = {"scaling": {"method": "yarn", "params": {"beta_fast": 16.0, "truncate": True}}, "logn": {"length": 16}}
    assert differences(old, new, ("scaling", "logn")) == [
        "scaling.params.beta_fast: 32 there, 16 asked",
        "logn: none there, {'length': 16} asked",
    ]
    assert differences(old, old, ("scaling", "logn")) == []

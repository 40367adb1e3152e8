"""The conformance table's docs and tests say the same as the table (tests/conformance)."""

from __future__ import annotations

from tests.conformance import render, starts, table, test_conformance


def test_docs_hold_the_rendered_table():
    text = render.DOC.read_text()
    assert render.updated(text) == text, (
        "docs/distribution_matrix.md differs from tests/conformance/table.py: run "
        "`python -m tests.conformance.render`")


def test_every_promise_has_its_test_over_every_start():
    for promise in table.PROMISES:
        test = getattr(test_conformance, f"test_{promise.name}", None)
        assert test is not None, f"no test_{promise.name} in tests/conformance/test_conformance.py"
        (mark,) = [m for m in test.pytestmark if m.name == "parametrize"]
        assert list(mark.args[1]) == [s.name for s in starts.STARTS], promise.name


def test_every_cell_is_known_to_the_table():
    for key in table.CELLS:
        promise, lane, start = key
        assert promise == "*" or promise in table.BY_PROMISE, key
        assert lane in table.LANES and start in starts.BY_NAME, key

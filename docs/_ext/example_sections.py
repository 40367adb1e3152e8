"""Griffe extension for the API reference: render `Example:` sections as examples.

The package's docstrings follow Keras in titling their doctest section
`Example:`; Griffe's Google parser knows it as `Examples:`, and would otherwise
render the doctest lines as prose.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_EXAMPLE = re.compile(r"^(\s*)Example:[ \t]*$", flags=re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Retitles `Example:` to `Examples:` in every docstring."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _EXAMPLE.sub(r"\1Examples:", obj.docstring.value)

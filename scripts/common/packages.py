"""Python package names as pip compares them."""

from __future__ import annotations

import re


def normalized(name: str) -> str:
    """A package's name as pip compares them (PEP 503): case, and runs of - _ . alike."""
    return re.sub(r"[-_.]+", "-", name).lower()

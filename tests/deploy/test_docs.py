"""The README and docs/ stand alone: every link resolves inside the repository and
nothing points outside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)#]+)(?:#[^)]*)?\)")


def test_every_link_resolves_inside_the_repository() -> None:
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            assert "://" not in target, f"{page.name} links outside the repository: {target}"
            resolved = (page.parent / target).resolve()
            assert resolved.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
            assert resolved.exists(), f"{page.name}: {target} does not exist"

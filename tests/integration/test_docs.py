"""The documentation builds, and what it names exists.

The site is built with `mkdocs build --strict`, not `--quiet`, and prints no warning
(every link and anchor resolves, every API-reference entry imports), and a dead anchor
does fail that build; the Python in the pages parses; every `kmp.` name a page mentions
is part of the package; every example is listed.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

import keras_mgpu_plugins as kmp

REPO_ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = REPO_ROOT / "docs"
PAGES = sorted(p for p in DOCS.rglob("*.md") if "_ext" not in p.parts)


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def _build(config: pathlib.Path, site: pathlib.Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of `config`, never with `--quiet`: that option drops the
    warnings which `--strict` counts, and a broken link then builds (exit code 0)."""
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=280,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def _warnings(done: subprocess.CompletedProcess) -> list[str]:
    return [line for line in (done.stdout + done.stderr).splitlines() if "WARNING" in line]


needs_mkdocs = pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                                  reason='mkdocs is not installed (pip install -e ".[docs]")')


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_mkdocs
def test_site_builds_strict_without_a_warning(tmp_path):
    done = _build(REPO_ROOT / "mkdocs.yml", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    assert _warnings(done) == []
    assert (tmp_path / "index.html").exists()
    assert (tmp_path / "api" / "callbacks" / "index.html").exists()


@pytest.mark.slow
@pytest.mark.timeout(300)
@needs_mkdocs
def test_a_dead_anchor_fails_the_strict_build(tmp_path):
    """The check above can fail: a copy of the site with one link to a missing anchor."""
    copy = tmp_path / "repo"
    shutil.copytree(DOCS, copy / "docs")
    shutil.copy(REPO_ROOT / "mkdocs.yml", copy / "mkdocs.yml")
    with open(copy / "docs" / "index.md", "a") as page:
        page.write("\nSee [a dead anchor](troubleshooting.md#no-such-heading).\n")
    done = _build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert any("#no-such-heading" in line for line in _warnings(done)), done.stderr[-3000:]


@pytest.mark.skipif(importlib.util.find_spec("yaml") is None, reason="needs PyYAML to read mkdocs.yml")
def test_nav_lists_every_page_and_only_pages_that_exist():
    import yaml

    class Loader(yaml.SafeLoader):  # mkdocs.yml may hold !!python/name tags
        pass

    Loader.add_multi_constructor("", lambda loader, suffix, node: None)
    config = yaml.load((REPO_ROOT / "mkdocs.yml").read_text(), Loader=Loader)

    def files(nav):
        for item in nav:
            if isinstance(item, str):
                yield item
            else:
                for value in item.values():
                    yield from (files(value) if isinstance(value, list) else [value])

    in_nav = sorted(files(config["nav"]))
    assert [p for p in in_nav if not (DOCS / p).exists()] == []
    assert sorted(str(p.relative_to(DOCS)) for p in PAGES) == in_nav


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(DOCS)))
def test_python_blocks_parse(page):
    for block in _blocks(page.read_text(), "python"):
        if block.lstrip().startswith(">>>"):
            continue
        ast.parse(block)


def test_every_kmp_name_in_the_docs_exists():
    text = "\n".join(p.read_text() for p in PAGES)
    missing = set()
    for name in set(re.findall(r"\bkmp\.callbacks\.([A-Za-z_]+)", text)):
        if not hasattr(kmp.callbacks, name):
            missing.add(f"kmp.callbacks.{name}")
    for name in set(re.findall(r"\bkmp\.([A-Za-z_]+)\b", text)) - {"callbacks"}:
        if name not in kmp.__all__:  # not hasattr: a submodule some test imported is an attribute
            missing.add(f"kmp.{name}")
    for name in set(re.findall(r"\bkmp\.collective\.([A-Za-z_]+)", text)):
        if not hasattr(kmp.collective, name):
            missing.add(f"kmp.collective.{name}")
    for name in set(re.findall(r"\bkmp\.compat\.([A-Za-z_]+)", text)):
        if not hasattr(kmp.compat, name):
            missing.add(f"kmp.compat.{name}")
    assert sorted(missing) == []


def test_every_example_is_listed_and_every_listed_example_exists():
    listed = set(re.findall(r"examples/(\w+\.py)", (DOCS / "examples.md").read_text()))
    present = {p.name for p in (REPO_ROOT / "examples").glob("*.py")}
    assert listed == present

"""Every `pip install` of README.md, docs/ and the examples' docstrings works as written: the
extras it names exist in pyproject.toml, kmp comes from the clone, a wheel or the repository
URL (it is not on PyPI), torch from an index that names its build. README's two commands use
distinct venv folders, and `.ci/run fast` runs README's command 2 as written."""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement

ROOT = Path(__file__).resolve().parents[2]
_OPTIONAL = (ROOT / "pyproject.toml").read_text().split("[project.optional-dependencies]\n", 1)[1]
EXTRAS = set(re.findall(r"^([\w-]+) = \[", _OPTIONAL.split("\n[", 1)[0], re.M))
VERSION = re.search(r'"(.+)"', (ROOT / "keras_mgpu_plugins" / "_version.py").read_text()).group(1)
WHEEL = f"dist/keras_mgpu_plugins-{VERSION}-py3-none-any.whl"
#: pip's options that take a value.
VALUED = {"--index-url", "-i", "--extra-index-url", "-c", "--constraint", "-r", "--requirement",
          "--target", "-t", "-f", "--find-links"}


def documents() -> dict[str, str]:
    texts = {str(p.relative_to(ROOT)): p.read_text() for p in
             [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]}
    for path in sorted((ROOT / "examples").glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()))
        texts[str(path.relative_to(ROOT))] = doc or ""
    return texts


def pip_commands(text: str) -> list[str]:
    """Each `pip install ...` of the text: in code blocks (continuation lines joined, comments
    off) and in inline code spans; one per `&&`/`;` part."""
    found = []
    fence = re.compile(r"^ *```(\w*)\n(.*?)^ *```", re.S | re.M)
    for language, block in fence.findall(text):
        if language not in ("bash", "sh", "console", ""):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            found += [part for part in re.split(r"&&|;", line.split(" #")[0])]
    prose = fence.sub("", text)
    for span in re.findall(r"`([^`]*pip install[^`]*)`", prose.replace("\n", " ")):
        found += re.split(r"&&|;", span)
    return [" ".join(part.split()) for part in found if re.search(r"\bpip install\b", part)]


def problems_of(command: str) -> list[str]:
    """What would make `command` fail or install something else than it says."""
    words = shlex.split(command)
    words = words[words.index("install") + 1:]
    indexed = any(w in ("--index-url", "-i", "--extra-index-url") or
                  w.startswith(("--index-url=", "--extra-index-url=")) for w in words)
    problems, skip = [], False
    for word in words:
        if skip or word.startswith("-") or word == "...":
            skip = word in VALUED
            continue
        problems += _requirement_problems(word, indexed)
    return problems


def _requirement_problems(word: str, indexed: bool) -> list[str]:
    if word.startswith("keras_mgpu_plugins") and " @ " not in word:
        return [f"{word!r}: keras_mgpu_plugins is not on PyPI: install from the clone "
                f"(pip install -e \".[extras]\"), a wheel or the repository URL (docs/install.md)"]
    local = re.fullmatch(r"(\.|[\w./-]+\.whl)(\[([\w,-]+)\])?", word)
    if local is not None:
        path, extras = local.group(1), (local.group(3) or "").split(",")
        found = [] if path == "." or path == WHEEL or "$" in path else [
            f"{word!r}: the wheel `python -m build` makes is {WHEEL}"]
        return found + _extras_problems(word, [e for e in extras if e])
    try:
        requirement = Requirement(word.replace("$REPO_URL", "https://example.org/kmp.git"))
    except InvalidRequirement as err:
        return [f"{word!r}: not a requirement pip reads ({err})"]
    if requirement.name == "keras_mgpu_plugins":
        return _extras_problems(word, sorted(requirement.extras))
    if requirement.name == "torch" and not indexed:
        return [f"{word!r}: torch from PyPI is its CUDA build (GBs) on Linux: name the index of "
                "the build, e.g. --index-url https://download.pytorch.org/whl/cpu"]
    return []


def _extras_problems(word: str, extras: list[str]) -> list[str]:
    unknown = [e for e in extras if e not in EXTRAS]
    if not unknown:
        return []
    return [f"{word!r}: no extra {', '.join(map(repr, unknown))} in pyproject.toml (pip would "
            f"only warn and install without it); the extras are {', '.join(sorted(EXTRAS))}"]


def all_commands() -> list[tuple[str, str]]:
    return [(name, c) for name, text in documents().items() for c in pip_commands(text)]


def test_the_documents_hold_the_install_commands_users_copy():
    commands = [c for _, c in all_commands()]
    assert len(commands) > 20
    assert 'pip install -e ".[tensorflow,examples]"' in commands
    assert f'pip install "{WHEEL}[jax]"' in commands
    assert 'pip install "keras_mgpu_plugins[jax] @ git+$REPO_URL"' in commands
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in commands


@pytest.mark.parametrize("where, command", all_commands())
def test_every_documented_install_works_as_written(where, command):
    assert problems_of(command) == [], where


@pytest.mark.parametrize("command, says", [
    ('pip install "keras_mgpu_plugins[jax]"', "not on PyPI"),
    ('pip install -e ".[jaxx,examples]"', "no extra 'jaxx' in pyproject.toml"),
    ('pip install "dist/keras_mgpu_plugins-9.9-py3-none-any.whl[jax]"', WHEEL),
    ('pip install "keras_mgpu_plugins[raytrain] @ git+$REPO_URL"', "the extras are"),
    ("pip install torch==2.13.0", "--index-url https://download.pytorch.org/whl/cpu"),
])
def test_a_wrong_install_is_named_with_its_fix(command, says):
    problems = problems_of(command)
    assert len(problems) == 1 and says in problems[0], problems


def test_install_page_lists_every_extra():
    table = (ROOT / "docs" / "install.md").read_text().split("## The extras", 1)[1]
    listed = set(re.findall(r"^\| `([\w-]+)`(?:, `([\w-]+)`)?(?:, `([\w-]+)`)?", table, re.M))
    assert {e for row in listed for e in row if e} == EXTRAS


def readme_commands() -> list[str]:
    block = (ROOT / "README.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.replace("\\\n", " ").splitlines()
            if line and not line.startswith("#")]


def test_readme_commands_use_distinct_venvs_and_ci_runs_command_2():
    example, tests = readme_commands()
    venvs = [re.search(r"python3 -m venv (\S+)", c).group(1) for c in (example, tests)]
    assert venvs[0] != venvs[1], venvs
    ci = (ROOT / ".ci" / "run").read_text()
    fast = re.search(r"^fast\(\) \{\n(.*?)^\}$", ci, re.S | re.M).group(1)
    pins = dict(re.findall(r'^(TORCH_PIN|TORCH_INDEX)="([^"]*)"$', ci, re.M))
    parts = [" ".join(p.split()) for p in tests.split("&&")[2:]]
    expected = [f"pip install {pins['TORCH_PIN']} --index-url {pins['TORCH_INDEX']}",
                'pip install -e ".[tensorflow,jax,torch,test]"', "python -m pytest -q",
                "KERAS_BACKEND=jax python -m pytest -q", "KERAS_BACKEND=torch python -m pytest -q"]
    assert parts == expected
    assert 'python -m pip install --quiet "$TORCH_PIN" --index-url "$TORCH_INDEX"' in fast
    assert 'python -m pip install --quiet -e ".[tensorflow,jax,torch,test]"' in fast
    for run in ("pytest_status python -m pytest -q\n",
                "KERAS_BACKEND=jax pytest_status python -m pytest -q\n",
                "KERAS_BACKEND=torch pytest_status python -m pytest -q\n"):
        assert run in fast

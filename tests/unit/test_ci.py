"""`.ci/run` runs what README.md says CI runs: the same commands and the same oldest pair."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CI = (ROOT / ".ci" / "run").read_text()
README = (ROOT / "README.md").read_text()


def ci_array(name: str) -> list[str]:
    match = re.search(rf"^{name}=\((.*?)\)$", CI, re.S | re.M)
    assert match, f".ci/run defines no {name}=(...)"
    return shlex.split(match.group(1))


def readme_subset_block() -> list[list[str]]:
    """The commands of README's oldest-pair code block (continuation lines joined)."""
    section = README.split("### Tested versions", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.replace("\\\n", " ").strip().splitlines()]


def test_newest_runs_the_readme_test_command():
    readme_command = README.split('pip install -e ".[tensorflow,test]" && ', 1)[1].splitlines()[0]
    assert readme_command == "python -m pytest -q"
    assert f"pytest_status {readme_command}\n" in CI


def test_oldest_pair_and_subset_are_the_readmes():
    install, pytest_command = readme_subset_block()
    pins = ci_array("OLDEST_PINS")
    assert install == ["pip", "install", "-e", ".[tensorflow,test]", *pins]
    assert pytest_command == ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              *ci_array("OLDEST_SUBSET")]
    assert '"${OLDEST_SUBSET[@]}"' in CI and '"${OLDEST_PINS[@]}"' in CI


def test_oldest_pair_is_the_lower_bound_pyproject_declares():
    pyproject = (ROOT / "pyproject.toml").read_text()
    lower = dict(re.findall(r'^\s*"(keras|tensorflow)>=([0-9.]+)"', pyproject, re.M))
    pins = dict(pin.split("==") for pin in ci_array("OLDEST_PINS"))
    assert pins.keys() == lower.keys() == {"keras", "tensorflow"}
    for name, version in pins.items():
        assert version.startswith(f"{lower[name]}."), (name, version, lower[name])
    subset = [path for path in ci_array("OLDEST_SUBSET") if path.startswith("tests/")]
    for path in subset:
        assert (ROOT / path.split("::")[0]).exists(), path


def test_jax_lane_runs_the_readmes_subset_without_tensorflow():
    section = README.split("The JAX lane's tests", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    install, pytest_command = [shlex.split(line) for line in
                               block.replace("\\\n", " ").strip().splitlines()]
    assert install == ["pip", "install", "-e", ".[jax,test]"]
    assert pytest_command == ["KERAS_BACKEND=jax", "python", "-m", "pytest", "-q", "-p",
                              "no:cacheprovider", *ci_array("JAX_SUBSET")]
    assert 'python -m pip install --quiet -e ".[jax,test]"' in CI
    assert "export KERAS_BACKEND=jax" in CI and '"${JAX_SUBSET[@]}"' in CI
    for path in ci_array("JAX_SUBSET"):
        assert (ROOT / path).exists(), path


def test_torch_lane_runs_the_readmes_subset_without_tensorflow_or_jax():
    section = README.split("The torch lane's tests", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    install, pytest_command = [line for line in block.replace("\\\n", " ").strip().splitlines()]
    assert install == f'pip install {ci_array_value("TORCH_PIN")} && pip install -e ".[torch,test,examples]"'
    assert shlex.split(pytest_command) == ["KERAS_BACKEND=torch", "python", "-m", "pytest", "-q",
                                           "-p", "no:cacheprovider", *ci_array("TORCH_SUBSET")]
    assert 'python -m pip install --quiet "$TORCH_PIN"' in CI
    assert 'python -m pip install --quiet -e ".[torch,test,examples]"' in CI
    assert "export KERAS_BACKEND=torch" in CI and '"${TORCH_SUBSET[@]}"' in CI
    assert '"$0" torch ||' in CI  # part of `all`
    for path in ci_array("TORCH_SUBSET"):
        assert (ROOT / path).exists(), path


def ci_array_value(name: str) -> str:
    match = re.search(rf'^{name}="([^"]*)"$', CI, re.M)
    assert match, f".ci/run defines no {name}=..."
    return match.group(1)

"""`.ci/run` runs what README.md says CI runs: the same commands and the same oldest pair."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

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


def test_newest_runs_every_test_and_fast_runs_readmes_command_2():
    """README's command 2 runs the fast tier (no path: tests/conftest.py selects it); CI's `fast`
    run is that command as written, in `all`; the newest environment runs every other test
    (`tests` given, the fast tier deselected), as README's table says."""
    newest = ci_function("newest")
    half = ci_array("NEWEST_HALF")
    assert ('pytest_status python -m pytest -q -p no:cacheprovider "${NEWEST_HALF[@]}" -m '
            '"not fast"') in newest
    assert ('pytest_status python -m pytest -q -p no:cacheprovider tests -m "not fast" \\\n'
            '        "${NEWEST_HALF[@]/#/--ignore=}"') in newest
    assert half and all((ROOT / path).is_dir() and path.startswith("tests/") for path in half)
    assert '(`python -m pytest -q tests -m "not fast"`' in README
    command = README.split("```bash", 1)[1].split("```", 1)[0]
    command = command.split("# 2.", 1)[1].replace("\\\n", " ")
    install_and_test = [part.strip() for part in command.split("&&")][2:]
    fast = ci_function("fast")
    assert install_and_test[0] == 'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu'
    assert 'python -m pip install --quiet "$TORCH_PIN" --index-url "$TORCH_INDEX"' in fast
    assert install_and_test[1] == 'pip install -e ".[tensorflow,jax,torch,test]"'
    assert 'python -m pip install --quiet -e ".[tensorflow,jax,torch,test]"' in fast
    for test in install_and_test[2:]:  # python -m pytest -q, on each lane
        backend, _, pytest_command = test.rpartition("python -m pytest")
        assert f"{backend}pytest_status python -m pytest{pytest_command}\n" in fast, test
    assert len(install_and_test[2:]) == 3
    assert "stream torch fast" in CI.split("\n  all)", 1)[1].split(";;", 1)[0]
    # the JAX and torch runs leave their fast tier to it
    for subset in ("JAX_SUBSET", "TORCH_SUBSET"):
        assert (f'pytest_status python -m pytest -q -p no:cacheprovider "${{{subset}[@]}}" '
                '-m "not fast"\n') in CI, subset


def test_oldest_pair_and_subset_are_the_readmes():
    install, pytest_command = readme_subset_block()
    pins = ci_array("OLDEST_PINS")
    assert install == ["pip", "install", "-e", ".[tensorflow,test]", *pins]
    assert pytest_command == ["python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              *ci_array("OLDEST_SUBSET")]
    assert '"${OLDEST_SUBSET[@]}"' in CI and '"${OLDEST_PINS[@]}"' in CI


def test_oldest_pair_is_the_lower_bound_pyproject_declares():
    pyproject = (ROOT / "pyproject.toml").read_text()
    lower = dict(re.findall(r'^\s*"(keras|tensorflow)>=([0-9.]+)[,"]', pyproject, re.M))
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
    *installs, pytest_command = [shlex.split(line, comments=True) for line in
                                 block.replace("\\\n", " ").strip().splitlines()]
    assert installs[0] == ["pip", "install", "-e", ".[jax,test]"]
    ci_installs = [shlex.split(line)[5:] for line in CI.splitlines()
                   if line.strip().startswith("python -m pip install --quiet ")]
    for extra in installs[1:]:  # keras-hub without its TensorFlow requirement, and its needs
        assert extra[:2] == ["pip", "install"]
        assert extra[2:] in ci_installs, extra
    assert pytest_command == ["KERAS_BACKEND=jax", "python", "-m", "pytest", "-q", "-p",
                              "no:cacheprovider", *ci_array("JAX_SUBSET")]
    assert 'python -m pip install --quiet -e ".[jax,test]"' in CI
    assert "export KERAS_BACKEND=jax" in CI and '"${JAX_SUBSET[@]}"' in CI
    for path in ci_array("JAX_SUBSET"):
        assert (ROOT / path.split("::")[0]).exists(), path


def ci_function(name: str) -> str:
    match = re.search(rf"^{name}\(\) {{\n(.*?)^}}$", CI, re.S | re.M)
    assert match, f".ci/run defines no {name}()"
    return match.group(1)


def test_canary_runs_both_subsets_on_the_newest_keras_nightly_and_is_not_in_all():
    """`.ci/run canary`: keras-nightly in place of the released Keras (checked: no `keras`
    distribution left, the module is the nightly's), CI's compatibility subset with TensorFlow
    and the JAX job's tests without it, each after the patches' verdicts; never in `all`."""
    all_case = CI.split("\n  all)", 1)[1].split(";;", 1)[0]
    assert "canary" not in all_case and "stream newest" in all_case
    nightly = ci_function("install_nightly")
    assert "pip uninstall --quiet --yes keras\n" in nightly
    assert "pip install --quiet --upgrade keras-nightly\n" in nightly
    assert 'md.version("keras-nightly")' in nightly and 'md.version("keras")' in nightly
    for name, extra, subset in (("canary_tensorflow", "tensorflow", "OLDEST_SUBSET"),
                                ("canary_jax", "jax", "JAX_SUBSET")):
        body = ci_function(name)
        assert f'pip install --quiet -e ".[{extra},test]"\n    install_nightly\n' in body, name
        assert "KMP_ALLOW_UNCHECKED_VERSIONS=1" in body and "python -m keras_mgpu_plugins.compat" in body
        assert f'pytest_status python -m pytest -q -p no:cacheprovider "${{{subset}[@]}}"' in body
    assert "export KERAS_BACKEND=jax" in ci_function("canary_jax")
    canary_case = CI.split("\n  canary)", 1)[1].split(";;", 1)[0]
    assert '"$0" canary-tensorflow' in canary_case and '"$0" canary-jax' in canary_case


def requirement(name: str) -> Requirement:
    """pyproject.toml's requirement of `name` (a quoted string that starts with it)."""
    text = (ROOT / "pyproject.toml").read_text()
    return Requirement(re.search(rf'"({name}[<>=!~ ][^"]*)"', text).group(1))


@pytest.mark.parametrize("library", ["keras", "tensorflow"])
def test_pip_is_given_the_checked_range_of_keras_and_tensorflow(library):
    """The cap is the first version no record was checked for: `pip install` resolves a pair
    whose results-changing patches were checked, on the day a new release comes out (which
    kmp would refuse: UncheckedVersionError); the canary runs that release ahead of time."""
    from keras_mgpu_plugins.compat import MIN_KERAS_FOR_DISTRIBUTION, PATCHES
    from keras_mgpu_plugins.compat._checks import CHECKED_BELOW

    bounds = {s.operator: Version(s.version) for s in requirement(library).specifier}
    assert bounds["<"] == Version(CHECKED_BELOW[library])
    floor = {"keras": MIN_KERAS_FOR_DISTRIBUTION, "tensorflow": "2.16.0"}[library]
    assert bounds[">="] == Version(floor)
    ranges = [p for p in PATCHES if p.library == library]
    assert max(Version(p.max_version) for p in ranges) == bounds["<"]


def test_torch_lane_runs_the_readmes_subset_without_tensorflow_or_jax():
    section = README.split("The torch lane's tests", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    install, pytest_command = [line for line in block.replace("\\\n", " ").strip().splitlines()]
    assert install == (f'pip install {ci_array_value("TORCH_PIN")} --index-url '
                       f'{ci_array_value("TORCH_INDEX")} && pip install -e ".[torch,test,examples]"')
    assert shlex.split(pytest_command) == ["KERAS_BACKEND=torch", "python", "-m", "pytest", "-q",
                                           "-p", "no:cacheprovider", *ci_array("TORCH_SUBSET")]
    assert 'python -m pip install --quiet "$TORCH_PIN" --index-url "$TORCH_INDEX"' in CI
    assert 'python -m pip install --quiet -e ".[torch,test,examples]"' in CI
    assert "export KERAS_BACKEND=torch" in CI and '"${TORCH_SUBSET[@]}"' in CI
    assert "stream torch" in CI.split("\n  all)", 1)[1].split(";;", 1)[0]  # part of `all`
    for path in ci_array("TORCH_SUBSET"):
        assert (ROOT / path).exists(), path


def ci_array_value(name: str) -> str:
    match = re.search(rf'^{name}="([^"]*)"$', CI, re.M)
    assert match, f".ci/run defines no {name}=..."
    return match.group(1)

"""docs/install.md's forms, run: the repository URL (`keras_mgpu_plugins[jax] @ git+URL`, here
this clone's `file://` URL) installs the package, its `kmp-launch` command and its extras'
metadata, without a clone on `sys.path`. (The wheel is built and its quickstart run by
`.ci/run wheel`.)"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                 reason="needs git and a clone")]


def test_the_repository_url_form_installs_the_package_its_command_and_extras(tmp_path):
    target = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
         f"keras_mgpu_plugins[jax] @ git+file://{ROOT}"],
        capture_output=True, text=True, timeout=540, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert (target / "keras_mgpu_plugins" / "__init__.py").is_file()
    assert (target / "keras_mgpu_plugins" / "py.typed").is_file()
    (info,) = target.glob("keras_mgpu_plugins-*.dist-info")
    metadata = (info / "METADATA").read_text()
    for extra in ("tensorflow", "jax", "torch", "ray", "kubernetes"):
        assert f"Provides-Extra: {extra}" in metadata
    assert "kmp-launch = keras_mgpu_plugins.launch:main" in (info / "entry_points.txt").read_text()
    assert not (target / "tests").exists() and not (target / "examples").exists()

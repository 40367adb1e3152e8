"""Every Kubernetes manifest of docs/ is a file of examples/kubernetes/, fits the Kubernetes
schema (and, for TFJob/PyTorchJob, the Kubeflow training operator's, from its SDK's models),
and names the exit code 75 policy of docs/preemption.md. Schemas come from installed packages
(kubernetes-validate, kubeflow-training): no cluster, no network."""

from __future__ import annotations

import copy
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml")
pytest.importorskip("kubernetes_validate", reason='pip install -e ".[kubernetes]"')
pytest.importorskip("kubeflow.training", reason='pip install -e ".[kubernetes]"')

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "examples" / "kubernetes"
MANIFESTS = sorted(FOLDER.glob("*.yaml"))
_spec = importlib.util.spec_from_file_location("kmp_k8s_check", FOLDER / "check.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)
#: Replica types that run the training script (a parameter server only serves).
TRAINING_REPLICAS = {"Chief", "Master", "Worker"}


def docs_manifests() -> list[tuple[str, str]]:
    """Every Kubernetes manifest shown in docs/: a YAML block with an `apiVersion` (not, e.g.,
    docs/verify.md's GitHub Actions job)."""
    return [(str(p.relative_to(ROOT)), block) for p in sorted((ROOT / "docs").rglob("*.md"))
            for block in re.findall(r"^```yaml\n(.*?)^```", p.read_text(), re.S | re.M)
            if re.search(r"^apiVersion:", block, re.M)]


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def test_every_manifest_of_the_docs_is_a_file_here_and_every_file_is_in_the_docs():
    files = {p.read_text(): p.name for p in MANIFESTS}
    shown = docs_manifests()
    assert {name for _, name in files.items()} == {"job.yaml", "tfjob.yaml", "pytorchjob.yaml",
                                                    "tfjob_parameter_servers.yaml"}
    for page, block in shown:
        assert block in files, f"a manifest of {page} is no file of examples/kubernetes/"
    assert {files[block] for _, block in shown} == set(files.values())


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_fits_its_schemas(path):
    assert check.check_documents([load(path)], path.name) == []


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_each_manifest_names_the_exit_code_75_policy(path):
    """docs/preemption.md: a Job ignores exit code 75 (a new pod resumes); a TFJob or
    PyTorchJob restarts the pods that run the script OnFailure (ExitCode takes 75 as
    permanent, Never fails the job at a saved stop), and says so beside it."""
    doc, text = load(path), path.read_text()
    if doc["kind"] == "Job":
        rules = doc["spec"]["podFailurePolicy"]["rules"]
        container = doc["spec"]["template"]["spec"]["containers"][0]["name"]
        assert {"action": "Ignore", "onExitCodes": {"containerName": container, "operator": "In",
                                                    "values": [75]}} in rules
        assert doc["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        assert re.search(r"- action: Ignore +# exit code 75", text)
        return
    specs = doc["spec"]["tfReplicaSpecs" if doc["kind"] == "TFJob" else "pytorchReplicaSpecs"]
    training = {name: spec for name, spec in specs.items() if name in TRAINING_REPLICAS}
    assert training and set(specs) - set(training) <= {"PS"}
    assert {spec["restartPolicy"] for spec in training.values()} == {"OnFailure"}
    policies = re.findall(r"restartPolicy: OnFailure +# (.*)", text)
    assert len(policies) == len(training) and all("exit code 75" in p for p in policies)


def test_a_wrong_image_field_is_named_with_the_fix():
    for path in MANIFESTS:
        doc = load(path)
        replicas = [v for k, v in doc["spec"].items() if k.endswith("ReplicaSpecs")]
        pod = doc["spec"]["template"] if doc["kind"] == "Job" else \
            next(iter(replicas[0].values()))["template"]
        pod["spec"]["containers"][0]["images"] = pod["spec"]["containers"][0].pop("image")
        problems = check.check_documents([doc], path.name)
        assert len(problems) == 1, problems
        assert "containers[0]: 'images' is not a field here" in problems[0]
        assert "did you mean 'image'?" in problems[0]


def test_a_kubeflow_field_out_of_place_or_missing_is_named():
    doc = load(FOLDER / "pytorchjob.yaml")
    wrong = copy.deepcopy(doc)
    wrong["spec"]["pytorchReplicaSpecs"]["Worker"]["restartPolicys"] = "OnFailure"
    (problem,) = check.check_documents([wrong])
    assert ("spec.pytorchReplicaSpecs.Worker: 'restartPolicys' is not a field here (Kubeflow "
            "training operator's KubeflowOrgV1ReplicaSpec schema") in problem
    assert "did you mean 'restartPolicy'?" in problem
    del doc["spec"]["pytorchReplicaSpecs"]
    (problem,) = check.check_documents([doc])
    assert "spec.pytorchReplicaSpecs is required" in problem


def test_the_checker_runs_as_a_script(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text((FOLDER / "job.yaml").read_text().replace("image:", "imag:"))
    done = subprocess.run([sys.executable, str(FOLDER / "check.py"), *map(str, MANIFESTS)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "every manifest fits" in done.stdout, done.stderr
    done = subprocess.run([sys.executable, str(FOLDER / "check.py"), str(bad)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "did you mean 'image'?" in done.stderr, done.stderr

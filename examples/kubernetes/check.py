"""Check Kubernetes manifests against the schemas installed packages ship; no cluster, no network.

    pip install -e ".[kubernetes]"      # kubernetes-validate, kubeflow-training, PyYAML
    python examples/kubernetes/check.py examples/kubernetes/*.yaml

Kubernetes' own kinds (a `batch/v1` Job...) are checked against the Kubernetes JSON schema that
`kubernetes-validate` ships, strict (an unknown field is an error). The Kubeflow training
operator's `TFJob` and `PyTorchJob` (`kubeflow.org/v1`) against the models its SDK
(`kubeflow-training`) generates from the operator's CRD schema: the fields and types of the job,
its replica specs and run policy, what is required; each replica's pod template and the job's
metadata against the Kubernetes schema, as above. An error names the field's path, what is
wrong and the fix (e.g. `'images' is not a field here; did you mean 'image'?`). Exit code 0
when every document of every file passes, else 1.
"""

from __future__ import annotations

import difflib
import importlib
import re
import sys
from typing import Any

#: The Kubeflow kinds checked through the SDK's models: kind -> (model, its replica-specs field).
KUBEFLOW_KINDS = {"TFJob": "KubeflowOrgV1TFJob", "PyTorchJob": "KubeflowOrgV1PyTorchJob"}
_MISSING = "the packages that ship the schemas are missing: pip install -e \".[kubernetes]\" " \
           "(kubernetes-validate, kubeflow-training, PyYAML)"


class ManifestError(ValueError):
    """A manifest that does not fit its schema: the path of the field and the fix."""


def check_documents(documents: list[dict], source: str = "<manifest>") -> list[str]:
    """Returns every problem of every document (empty: all pass)."""
    problems = []
    for number, doc in enumerate(documents, 1):
        where = f"{source}, document {number}" if len(documents) > 1 else source
        try:
            check(doc)
        except ManifestError as err:
            problems.append(f"{where}: {err}")
    return problems


def check(doc: Any) -> None:
    """Raises `ManifestError` for the first problem of one manifest (a parsed YAML document)."""
    if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
        raise ManifestError("a manifest is a mapping with apiVersion and kind. Received: "
                            f"{str(doc)[:80]!r}")
    if doc["apiVersion"].startswith("kubeflow.org/"):
        if doc["kind"] not in KUBEFLOW_KINDS or doc["apiVersion"] != "kubeflow.org/v1":
            raise ManifestError(f"kmp checks the Kubeflow kinds {sorted(KUBEFLOW_KINDS)} of "
                                f"apiVersion kubeflow.org/v1. Received: apiVersion="
                                f"{doc['apiVersion']!r}, kind={doc['kind']!r}")
        _model(doc, KUBEFLOW_KINDS[doc["kind"]], "")
    else:
        _kubernetes(doc, "")


def _kubernetes(doc: dict, path: str) -> None:
    """Against the Kubernetes JSON schema (strict) kubernetes-validate ships."""
    try:
        import kubernetes_validate
        from kubernetes_validate.utils import SchemaNotFoundError
    except ImportError as err:
        raise ManifestError(_MISSING) from err
    version = kubernetes_validate.latest_version()
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except SchemaNotFoundError as err:
        raise ManifestError(f"{path or 'the manifest'}: no Kubernetes {version} schema for "
                            f"apiVersion={doc['apiVersion']!r}, kind={doc['kind']!r}") from err
    except kubernetes_validate.ValidationError as err:
        raise ManifestError(_explain(err, path, version)) from None


def _explain(err: Any, path: str, version: str) -> str:
    where = _join(path, "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err.path))
    unexpected = re.findall(r"'([^']+)' (?:was|were) unexpected", err.message)
    if err.validator == "additionalProperties" and unexpected:
        fields = sorted(err.schema.get("properties", {}))
        return _unknown(where, unexpected[0], fields, f"Kubernetes {version} schema")
    return f"{where or 'the manifest'}: {err.message} (Kubernetes {version} schema)"


def _unknown(where: str, key: str, fields: list[str], schema: str) -> str:
    close = difflib.get_close_matches(key, fields, n=1)
    fix = f"did you mean {close[0]!r}?" if close else f"valid fields: {', '.join(fields)}"
    return f"{where or 'the manifest'}: {key!r} is not a field here ({schema}); {fix}"


def _join(path: str, key: str) -> str:
    if not path:
        return key.lstrip(".")
    return f"{path}{key}" if key.startswith("[") else f"{path}.{key.lstrip('.')}"


def _model(value: Any, type_name: str, path: str) -> None:
    """Against one of the SDK's OpenAPI models (or a Kubernetes type inside one)."""
    if type_name == "V1PodTemplateSpec":
        return _wrapped(value, "PodTemplate", "template", path)
    if type_name == "V1ObjectMeta":
        return _wrapped(value, "ConfigMap", "metadata", path)
    cls = _model_class(type_name)
    schema = f"Kubeflow training operator's {type_name} schema (kubeflow-training)"
    if not isinstance(value, dict):
        raise ManifestError(f"{path or 'the manifest'}: must be a mapping ({schema}). "
                            f"Received: {value!r}")
    fields = {json_key: attr for attr, json_key in cls.attribute_map.items()}
    for key, item in value.items():
        if key not in fields:
            raise ManifestError(_unknown(path, key, sorted(fields), schema))
        _value(item, cls.openapi_types[fields[key]], _join(path, key))
    for json_key, attr in fields.items():
        if json_key not in value and _required(cls, attr) and json_key != "status":
            raise ManifestError(f"{_join(path, json_key)} is required ({schema})")


def _value(value: Any, type_name: str, path: str) -> None:
    simple = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}
    if type_name in simple:
        wrong = isinstance(value, bool) and type_name in ("int", "float")
        if wrong or not isinstance(value, simple[type_name]):
            raise ManifestError(f"{path}: must be of type {type_name}. Received: {value!r}")
    elif type_name.startswith("dict("):
        inner = type_name[len("dict(str, "):-1]
        if not isinstance(value, dict):
            raise ManifestError(f"{path}: must be a mapping. Received: {value!r}")
        for key, item in value.items():
            _value(item, inner, _join(path, key))
    elif type_name.startswith("list["):
        if not isinstance(value, list):
            raise ManifestError(f"{path}: must be a list. Received: {value!r}")
        for i, item in enumerate(value):
            _value(item, type_name[5:-1], f"{path}[{i}]")
    else:
        _model(value, type_name, path)


def _wrapped(value: Any, kind: str, field: str, path: str) -> None:
    """A Kubernetes type that is no kind of its own, checked inside a kind that holds it."""
    doc = {"apiVersion": "v1", "kind": kind, field: value}
    if field != "metadata":
        doc["metadata"] = {"name": "kmp-check"}
    prefix = path[: -len(field)].rstrip(".") if path.endswith(field) else path
    _kubernetes(doc, prefix)


def _model_class(type_name: str) -> Any:
    module = "kubeflow.training.models" if type_name.startswith("KubeflowOrg") else \
        "kubernetes.client.models"
    try:
        return getattr(importlib.import_module(module), type_name)
    except ImportError as err:
        raise ManifestError(_MISSING) from err


def _required(cls: Any, attr: str) -> bool:
    """Whether the model refuses `None` for `attr` (the SDK's client-side validation)."""
    from kubeflow.training.configuration import Configuration

    probe = cls.__new__(cls)
    probe.local_vars_configuration = Configuration()
    try:
        setattr(probe, attr, None)
    except ValueError:
        return True
    return False


def main(paths: list[str]) -> int:
    try:
        import yaml
    except ImportError:
        print(f"check.py: {_MISSING}", file=sys.stderr)
        return 1
    problems = []
    for path in paths:
        with open(path) as f:
            problems += check_documents([d for d in yaml.safe_load_all(f) if d is not None], path)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{len(paths)} file(s): every manifest fits its schema")
    return 1 if problems or not paths else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

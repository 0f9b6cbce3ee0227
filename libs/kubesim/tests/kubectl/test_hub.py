"""The Flotilla hub through kubectl v1.34: the project's CRDs, their columns, their rules."""

from __future__ import annotations

import pytest
import yaml

from .harness import CRDS, Kubectl

pytestmark = [pytest.mark.kubectl, pytest.mark.integration]


def cluster(name: str) -> str:
    return yaml.safe_dump(
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Cluster",
            "metadata": {"name": name},
            "spec": {"kubeconfigSecretRef": {"namespace": "flotilla-system", "name": name}},
        }
    )


@pytest.fixture(scope="module")
def crds(hub: Kubectl) -> Kubectl:
    """The hub after a plain `kubectl apply -f deploy/k8s/crds/` (client-side validation on)."""
    applied = hub.out("apply", "-f", str(CRDS))
    assert applied.count("created") == len(list(CRDS.glob("*.yaml")))
    return hub


def test_crds_apply_with_validation_and_reapply_unchanged(crds: Kubectl) -> None:
    again = crds.out("apply", "-f", str(CRDS))
    assert again.count("unchanged") == len(list(CRDS.glob("*.yaml")))


def test_get_clusters_shows_the_crd_printer_columns(crds: Kubectl) -> None:
    crds.out("apply", "-f", "-", stdin=cluster("eu-west"))
    table = crds.out("get", "clusters")
    assert table.splitlines()[0].split() == [
        "NAME",
        "READY",
        "CORDONED",
        "DRAINING",
        "PLACEMENTS",
        "AGE",
    ]
    assert table.splitlines()[1].split()[0] == "eu-west"
    status = (
        '{"status":{"placements":7,"conditions":[{"type":"Ready","status":"True",'
        '"reason":"Probed","message":"ok","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}'
    )
    crds.out("patch", "cluster", "eu-west", "--subresource=status", "--type=merge", "-p", status)
    row = crds.out("get", "cluster", "eu-west", "--no-headers").split()
    assert row[:2] == ["eu-west", "True"] and "7" in row
    assert "cluster.flotilla.io/eu-west" in crds.out("get", "flotilla")


def test_explain_and_describe_a_cluster(crds: Kubectl) -> None:
    explained = crds.out("explain", "clusters.spec")
    assert "KIND:       Cluster" in explained and "kubeconfigSecretRef" in explained
    crds.out("apply", "-f", "-", stdin=cluster("described"))
    described = crds.out("describe", "cluster", "described")
    assert "Kubeconfig Secret Ref" in described and "flotilla-system" in described


def test_cel_rule_violation_is_refused_with_422(crds: Kubectl) -> None:
    both = yaml.safe_dump(
        {
            "apiVersion": "flotilla.io/v1alpha1",
            "kind": "Transformation",
            "metadata": {"name": "both", "namespace": "default"},
            "spec": {
                "transformations": [
                    {
                        "patchType": "merge",
                        "patch": {"metadata": {"labels": {"a": "b"}}},
                        "targetClusters": ["eu-west"],
                        "targetSelector": {"matchLabels": {"tier": "gold"}},
                    }
                ]
            },
        }
    )
    refused = crds.run("apply", "-v=6", "-f", "-", stdin=both, check=False)
    assert refused.returncode != 0
    assert 'status="422 Unprocessable Entity"' in refused.stderr
    assert "set exactly one of targetClusters or targetSelector" in refused.stderr


def test_unknown_field_in_a_custom_resource_is_refused(crds: Kubectl) -> None:
    bogus = cluster("bogus").replace("spec:\n", "spec:\n  bogus: 1\n")
    refused = crds.run("apply", "-f", "-", stdin=bogus, check=False)
    assert refused.returncode != 0 and 'unknown field "spec.bogus"' in refused.stderr

"""The local node's stand-in for cert-manager (scripts/node/webhook_certs.py), on a manifest shaped as KServe's
core manifest is at KSERVE_VERSION: a self-signed Issuer, one Certificate, webhook configurations asking for its CA.
The real manifest, the real API server and KServe's webhooks are scripts/node/tests/test_serving_pipeline.py's."""

from __future__ import annotations

import base64
import subprocess
import sys

import pytest
import yaml

from scripts.node import webhook_certs

MANIFEST = """
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: selfsigned-issuer, namespace: kserve}
spec: {selfSigned: {}}
---
apiVersion: cert-manager.io/v1
kind: Certificate
metadata: {name: serving-cert, namespace: kserve}
spec:
  commonName: kserve-webhook-server-service.kserve.svc
  dnsNames: [kserve-webhook-server-service.kserve.svc]
  issuerRef: {kind: Issuer, name: selfsigned-issuer}
  secretName: kserve-webhook-server-cert
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata: {name: inferenceservice.serving.kserve.io, annotations: {cert-manager.io/inject-ca-from: kserve/serving-cert}}
webhooks:
  - name: one.serving.kserve.io
    clientConfig: {service: {name: kserve-webhook-server-service, namespace: kserve}}
  - name: two.serving.kserve.io
    clientConfig: {service: {name: kserve-webhook-server-service, namespace: kserve}}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: things.serving.kserve.io, annotations: {cert-manager.io/inject-ca-from: kserve/serving-cert}}
spec:
  conversion:
    strategy: Webhook
    webhook: {clientConfig: {service: {name: kserve-webhook-server-service, namespace: kserve}}}
---
apiVersion: v1
kind: Service
metadata: {name: kserve-webhook-server-service, namespace: kserve}
"""
CA, CERT, KEY = b"-----CA-----\n", b"-----CERT-----\n", b"-----KEY-----\n"


def run(*args: str, manifest: str = MANIFEST) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "scripts.node.webhook_certs", *args],
        input=manifest,
        capture_output=True,
        text=True,
    )


def test_names_prints_what_the_certificate_must_cover():
    done = run("names")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "kserve/serving-cert",
        "kserve-webhook-server-cert",
        "kserve-webhook-server-service.kserve.svc",
    ]


def test_inject_replaces_cert_manager_with_the_secret_and_the_ca_in_every_webhook_that_asked(tmp_path):
    for name, data in (("ca.crt", CA), ("tls.crt", CERT), ("tls.key", KEY)):
        (tmp_path / name).write_bytes(data)
    done = run("inject", "--ca", str(tmp_path / "ca.crt"), "--cert", str(tmp_path / "tls.crt"),
               "--key", str(tmp_path / "tls.key"))  # fmt: skip
    assert done.returncode == 0, done.stderr
    documents = list(yaml.safe_load_all(done.stdout))
    assert not [doc for doc in documents if doc["apiVersion"].startswith("cert-manager.io/")]
    bundle = base64.b64encode(CA).decode()
    (webhooks,) = [doc for doc in documents if doc["kind"] == "ValidatingWebhookConfiguration"]
    assert [hook["clientConfig"]["caBundle"] for hook in webhooks["webhooks"]] == [bundle, bundle]
    (crd,) = [doc for doc in documents if doc["kind"] == "CustomResourceDefinition"]
    assert crd["spec"]["conversion"]["webhook"]["clientConfig"]["caBundle"] == bundle
    (secret,) = [doc for doc in documents if doc["kind"] == "Secret"]
    assert secret["metadata"] == {"name": "kserve-webhook-server-cert", "namespace": "kserve"}
    assert secret["type"] == "kubernetes.io/tls"
    assert {key: base64.b64decode(value) for key, value in secret["data"].items()} == {
        "tls.crt": CERT,
        "tls.key": KEY,
        "ca.crt": CA,
    }
    (service,) = [doc for doc in documents if doc["kind"] == "Service"]
    assert service == yaml.safe_load(MANIFEST.split("---")[-1])


@pytest.mark.parametrize(
    "change, complaint",
    [
        (lambda m: m.replace("kserve/serving-cert}", "other/cert}", 1), "asks for the CA of other/cert"),
        (lambda m: m + MANIFEST.split("---")[1].replace("serving-cert,", "second-cert,"), "has 2 cert-manager"),
        (lambda m: m.split("---", 2)[2], "has 0 cert-manager Certificates"),
    ],
    ids=["another certificate's CA", "two certificates", "none"],
)
def test_what_the_stand_in_cannot_do_is_refused_naming_it(change, complaint):
    documents = [doc for doc in yaml.safe_load_all(change(MANIFEST)) if doc]
    with pytest.raises(webhook_certs.WebhookCertError, match=complaint):
        webhook_certs.inject(documents, CA, CERT, KEY)

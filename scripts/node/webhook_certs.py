"""What cert-manager does for a manifest's webhooks, on a cluster without it (the local node, make cluster-up SERVE=1):

  python -m scripts.node.webhook_certs names < manifest.yaml
  python -m scripts.node.webhook_certs inject --ca ca.crt --cert tls.crt --key tls.key < manifest.yaml

`names` prints each cert-manager Certificate as `NAMESPACE/NAME SECRET DNS,DNS...`, for the set-up to make a serving
certificate with those names, signed by a CA of its own. `inject` prints the manifest without cert-manager's objects
(Certificate, Issuer), with the Secret each Certificate would have written (tls.crt, tls.key, ca.crt) and the CA in
the caBundle of every webhook whose object asks cert-manager's CA injector for it
(cert-manager.io/inject-ca-from: NAMESPACE/CERTIFICATE), CRD conversion webhooks included. On k3d, cert-manager
itself does this (make k3d-up SERVE=1).
"""

from __future__ import annotations

import argparse
import base64
import pathlib
import sys
from typing import Any

import yaml

CERT_MANAGER_GROUP = "cert-manager.io/"
INJECT_CA_FROM = "cert-manager.io/inject-ca-from"


class WebhookCertError(ValueError):
    """The manifest asks for something this stand-in does not do; the message names it."""


def certificates(documents: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The manifest's cert-manager Certificates, by NAMESPACE/NAME."""
    found = {}
    for doc in documents:
        if doc.get("kind") == "Certificate" and doc.get("apiVersion", "").startswith(CERT_MANAGER_GROUP):
            meta = doc["metadata"]
            found[f"{meta.get('namespace', 'default')}/{meta['name']}"] = doc
    return found


def inject(documents: list[dict[str, Any]], ca: bytes, cert: bytes, key: bytes) -> list[dict[str, Any]]:
    wanted = certificates(documents)
    if len(wanted) != 1:
        raise WebhookCertError(
            f"the manifest has {len(wanted)} cert-manager Certificates ({', '.join(wanted) or 'none'}); this stand-in "
            "makes exactly one serving certificate: install cert-manager for this manifest instead"
        )
    ((certificate_ref, certificate),) = wanted.items()
    bundle = base64.b64encode(ca).decode()
    out = []
    for doc in documents:
        if doc.get("apiVersion", "").startswith(CERT_MANAGER_GROUP):
            continue
        source = (doc.get("metadata", {}).get("annotations") or {}).get(INJECT_CA_FROM)
        if source is not None:
            if source != certificate_ref:
                raise WebhookCertError(
                    f"{doc['kind']} {doc['metadata']['name']} asks for the CA of {source}, which is not the manifest's "
                    f"Certificate {certificate_ref}"
                )
            configs = [hook["clientConfig"] for hook in doc.get("webhooks", [])]
            conversion = (doc.get("spec", {}).get("conversion") or {}).get("webhook")
            if conversion:
                configs.append(conversion["clientConfig"])
            for config in configs:
                config["caBundle"] = bundle
        out.append(doc)
    meta = certificate["metadata"]
    out.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "kubernetes.io/tls",
            "metadata": {"name": certificate["spec"]["secretName"], "namespace": meta.get("namespace", "default")},
            "data": {
                "tls.crt": base64.b64encode(cert).decode(),
                "tls.key": base64.b64encode(key).decode(),
                "ca.crt": bundle,
            },
        }
    )
    return out


def names(documents: list[dict[str, Any]]) -> list[str]:
    return [
        f"{ref} {doc['spec']['secretName']} {','.join(doc['spec']['dnsNames'])}"
        for ref, doc in certificates(documents).items()
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.node.webhook_certs", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["names", "inject"])
    parser.add_argument("--ca", type=pathlib.Path)
    parser.add_argument("--cert", type=pathlib.Path)
    parser.add_argument("--key", type=pathlib.Path)
    args = parser.parse_args(argv)
    documents = [doc for doc in yaml.safe_load_all(sys.stdin) if doc]
    try:
        if args.what == "names":
            print("\n".join(names(documents)))
            return 0
        if not (args.ca and args.cert and args.key):
            parser.error("inject needs --ca, --cert and --key")
        output = inject(documents, args.ca.read_bytes(), args.cert.read_bytes(), args.key.read_bytes())
    except WebhookCertError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(output, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

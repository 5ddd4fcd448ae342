"""The image into the project's cluster, as make submit imports it (make submit-pipeline and serve-cluster run this
first): the k3d cluster's nodes or the local node's containerd, whichever KUBE_CONTEXT names; another cluster pulls it.

  python -m scripts.cluster.import_image IMAGE
"""

from __future__ import annotations

import sys

from . import steps
from .submit import container_tool


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m scripts.cluster.import_image IMAGE", file=sys.stderr)
        return 2
    try:
        steps.import_image_to_cluster(steps.check_context(), args[0], container_tool())
    except steps.StepError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Why the trainer stopped, as the pod's termination message: `kubectl describe pod`, the engines' conditions and
`make tune-cluster` read it from the container's status, even where the container's output went elsewhere (Katib's
metrics collector takes the chief's stdout and stderr into a file, so its logs hold nothing).

The kubelet creates the file at the container's terminationMessagePath before the container starts; outside a pod
there is none, and nothing is written.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

# Set it to the pod spec's terminationMessagePath where a manifest moves the file from Kubernetes' default.
PATH_VARIABLE = "TERMINATION_MESSAGE_PATH"
DEFAULT_PATH = "/dev/termination-log"
# The kubelet keeps no more than this of one container's message.
LIMIT_BYTES = 4096


def write(line: str, environ: Mapping[str, str] = os.environ) -> None:
    """Replaces the termination message with line (its end cut to the kubelet's limit). Never raises: the exit code
    and the line on stderr say the same."""
    path = environ.get(PATH_VARIABLE)
    if path is None:
        path = DEFAULT_PATH
        if not os.path.isfile(path):  # not in a pod
            return
    text = line.encode()[:LIMIT_BYTES].decode(errors="ignore")
    try:
        with open(path, "w", encoding="utf-8") as message:
            message.write(text)
    except OSError:
        pass

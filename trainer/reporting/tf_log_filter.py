"""Drops the lines TensorFlow's C++ runtime prints on every CPU run that are no failure, before they reach stderr.

TensorFlow writes them straight to file descriptor 2 (absl logging, before and after absl::InitializeLog),
so no Python logging setting reaches them: `install()` puts a small filter process between fd 2 and the
real stderr. Everything else passes unchanged. TRAINER_TF_NOISE=1 turns the filter off.

The lines, and where they come from (TensorFlow 2.21):
- the full `tensorflow` wheel (not `tensorflow-cpu`) registers CUDA: "Could not find cuda drivers" and, at
  error level, "failed call to cuInit: ... (303)" on a machine without a GPU driver;
- absl's banner "All log messages before absl::InitializeLog() ..." and oneDNN's notice, at every import;
- "Input of GeneratorDatasetOp::Dataset will not be optimized": tf.distribute's per-worker iterator
  (OwnedMultiDeviceIterator, a generator dataset) wraps the input pipeline under a multi-worker strategy;
- "Local rendezvous is aborting with status: INVALID_ARGUMENT: ...": an op's invalid input (an image that does
  not decode), whose status Python receives as an exception that the trainer names with its file, or a
  traceback shows. Other statuses pass: OUT_OF_RANGE there means the input ran out mid-epoch. Its continuation
  lines (tab-indented: which node) go with it;
- the JPEG decoder's words on a damaged file: TensorFlow's "jpeg_mem.cc:331] Premature end of JPEG data ..." and
  libjpeg's own, printed bare ("Improper call to JPEG library in state 201", "Corrupt JPEG data: ...", "Bogus
  Huffman table definition", "Input file read error"). They name no file; the data check names it first (a JPEG
  cut short, or one that does not decode), a read that fails names it with the exception, and the server its request.

The model server keeps the filter for its whole life (Python's own lines bypass it), so a refused picture leaves only
the server's own line for it.
"""

from __future__ import annotations

import atexit
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable

SHOW_ALL_VARIABLE = "TRAINER_TF_NOISE"
NOISE = re.compile(
    r"^WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR$"
    r"|^[IWE]\d{4} [\d:.]+ +\d+ (?:"
    r"port\.cc:\d+\] oneDNN custom operations are on"
    r"|cudart_stub\.cc:\d+\] Could not find cuda drivers on your machine"
    r"|cuda_platform\.cc:\d+\] failed call to cuInit"
    r"|dataset\.cc:\d+\] Input of GeneratorDatasetOp::Dataset will not be optimized"
    r"|local_rendezvous\.cc:\d+\] Local rendezvous is aborting with status: INVALID_ARGUMENT: "
    r"|jpeg_mem\.cc:\d+\] )"
    r"|^(?:Improper call to JPEG library in state \d+|Corrupt JPEG data: .*|Premature end of JPEG file"
    r"|Bogus (?:Huffman table definition|marker length|DQT index \d+|DHT index \d+)"
    r"|Huffman table 0x[0-9a-f]+ was not defined|Invalid JPEG file structure: .*|Input file read error)$"
)
WAIT_AT_EXIT_S = 5.0


def is_noise(line: str) -> bool:
    return NOISE.match(line) is not None


def install(python_direct: bool = False) -> Callable[[], None]:
    """Routes fd 2 through the filter process, unless TRAINER_TF_NOISE=1. Call before importing TensorFlow. Returns
    `restore`, which sends fd 2 straight to stderr again (also run at exit). With `python_direct`, Python's own
    writes (sys.stderr: logging, tracebacks) go straight to the real stderr and only the C++ runtime's pass the
    filter: a server keeps it for its life, and no request waits on the filter's pipe unless TensorFlow logs."""
    if os.environ.get(SHOW_ALL_VARIABLE) == "1":
        return lambda: None
    sys.stderr.flush()
    # Its own session: a signal to the trainer's process group must not end the filter before the last lines.
    real_stderr = os.dup(2)
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.reporting.tf_log_filter"],
        stdin=subprocess.PIPE,
        stdout=real_stderr,
        start_new_session=True,
    )
    assert proc.stdin is not None  # stdin=PIPE
    os.dup2(proc.stdin.fileno(), 2)
    proc.stdin.close()
    if python_direct:
        errors = sys.stderr.errors or "backslashreplace"
        sys.stderr = open(real_stderr, "w", buffering=1, encoding=sys.stderr.encoding, errors=errors, closefd=False)

    def drain() -> None:
        """fd 2 goes back to the real stderr (whatever TensorFlow prints while shutting down is kept), the filter
        sees end-of-file and passes on the last lines; once, however often it is called."""
        if proc.returncode is not None or os.fstat(2).st_ino == os.fstat(real_stderr).st_ino:
            return
        sys.stderr.flush()
        os.dup2(real_stderr, 2)
        try:
            proc.wait(timeout=WAIT_AT_EXIT_S)
        except subprocess.TimeoutExpired:
            pass  # a child process still holds the pipe; the filter ends when it does

    atexit.register(drain)
    return drain


def main() -> int:
    """The filter process: stdin to stdout, line by line, without the noise; ends at end-of-file."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    dropping = False  # the line before was noise: its continuation lines (a status's "\t [[{{node ...}}]]") go too
    for raw in sys.stdin.buffer:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        dropping = is_noise(line) or (dropping and line.startswith("\t"))
        if not dropping:
            sys.stdout.buffer.write(raw)
            sys.stdout.buffer.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())

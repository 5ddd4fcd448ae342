"""Exit codes, chosen for the TFJob restartPolicy ExitCode: 1-127 fail the job, >= 128 restart the pod."""

OK = 0
BAD_CONFIG = 2  # TF_CONFIG, flags or data are wrong; restarting cannot help
PREEMPTED = 143  # SIGTERM: a checkpoint was saved, restart and resume (128 + SIGTERM)
GROUP_FAILED = 144  # a peer was lost or never joined; restart every worker and resume
STARTUP_TIMEOUT = 137  # the start-up watchdog killed the process (128 + SIGKILL)

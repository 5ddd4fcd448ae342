"""Optional room: the parameter-server (async) mode and the evaluator task. Deleting it leaves sync training working."""

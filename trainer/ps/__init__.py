"""Optional room: the parameter-server (async) mode. Deleting it leaves sync training, and its evaluator, working."""

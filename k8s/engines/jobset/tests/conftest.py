import process_environment  # noqa: F401  (sets the tests' environment before anything imports TensorFlow)

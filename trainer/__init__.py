"""A CNN trainer on tf.distribute.MultiWorkerMirroredStrategy; see trainer/__main__.py."""

"""A CNN trainer on tf.distribute.MultiWorkerMirroredStrategy; see trainer/__main__.py. A fork imports trainer.api."""

from trainer import moved as _moved

_moved.install()

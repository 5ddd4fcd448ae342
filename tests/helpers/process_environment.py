"""The environment every test runs in, set before any test imports TensorFlow or starts a make; imported first by
each suite's conftest.py (tests/, scripts/node/tests/, scripts/bench/tests/)."""

import os

# Before any test imports TensorFlow: Keras 3 on its TF backend, and no INFO chatter from C++.
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Under `make test` the outer make's own variables reach every make and script a test starts: MAKELEVEL makes a
# sub-make print "Entering directory", MAKEFLAGS carries the outer options, and the Makefile's exported IMAGE
# overrides the image name a test asks build-image.sh for. Tests start their makes as a user would, from a shell.
for _name in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "IMAGE"):
    os.environ.pop(_name, None)

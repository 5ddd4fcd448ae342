import os

# Before any test imports TensorFlow: Keras 3 on its TF backend, and no INFO chatter from C++.
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

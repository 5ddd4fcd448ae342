import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Tests import the trainer from the checkout and helpers from tests/ and scripts/.
for path in (ROOT, os.path.join(ROOT, "tests"), os.path.join(ROOT, "scripts")):
    if path not in sys.path:
        sys.path.insert(0, path)
os.environ["KERAS_BACKEND"] = "tensorflow"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

"""Pictures the model refuses, and what their refusals say."""

from __future__ import annotations

import numpy as np
import pytest
from kserve.errors import InvalidInput

WEBP = b"RIFF\x88\x00\x00\x00WEBPVP8 " + bytes(range(120, 250))


def test_a_model_exported_with_the_files_raw_bytes_in_its_message_refuses_a_webp_in_readable_words(tmp_path):
    # Before: such a model's message (the check exported before the message was escaped in graph) is not UTF-8, so
    # the refusal said "'utf-8' codec can't decode byte 0x88 ..." and nothing of the file.
    import tensorflow as tf

    from trainer.serving.signature import load_signatures

    @tf.function(input_signature=[tf.TensorSpec((None,), tf.string, name="image_bytes")])
    def serve(image_bytes):
        start = tf.strings.substr(image_bytes[0], 0, 8)
        message = tf.strings.format("element 0 of input 'image_bytes' is not a PNG file (it starts with {})", start)
        with tf.control_dependencies([tf.debugging.Assert(tf.strings.substr(start, 0, 4) == b"\x89PNG", [message])]):
            return {"length": tf.strings.length(image_bytes)}

    module = tf.Module()
    tf.saved_model.save(module, str(tmp_path / "1"), signatures={"serve": serve})
    signature = load_signatures(str(tmp_path / "1"))["serve"]
    with pytest.raises(InvalidInput) as refused:
        signature.run({"image_bytes": np.array([WEBP], dtype=object)})
    assert str(refused.value).startswith(
        "the model refused the input (element 0 of input 'image_bytes' is not a PNG file (it starts with "
        '"RIFF\\x88\\000\\000\\000"))'
    ), refused.value

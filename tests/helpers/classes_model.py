"""A SavedModel with the signatures the trainer exports for a classification task, small enough to build in a test:
a real Keras model over 8x8x1 uint8 images and three named classes.

- `serve`: images (uint8 [-1, 8, 8, 1]) -> probabilities (float32 [-1, 3]), class_id (int64 [-1]), class_name
  (string [-1]);
- `serve_image_bytes`: image_bytes (string [-1], each an encoded PNG, JPEG, GIF or BMP file, decoded to one channel
  and resized to 8x8 as training would) -> the same outputs; an element that is not such a file fails the call with
  InvalidArgumentError naming it;
- `class_names`: no inputs -> class_names (string [3]), the names in class-id order.
"""

from __future__ import annotations

import pathlib

import numpy as np

CLASS_NAMES = ("cat", "dog", "bird")
SIDE = 8
# The first bytes of each format tf.io.decode_image reads.
MAGIC = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM")


def save_classes_model(path: pathlib.Path, names: tuple[str, ...] = CLASS_NAMES) -> pathlib.Path:
    """Writes the SavedModel at `path` (a version folder) with exactly these three signatures."""
    import keras
    import tensorflow as tf

    model = keras.Sequential(
        [
            keras.Input((SIDE, SIDE, 1), dtype="uint8"),
            keras.layers.Rescaling(1 / 255),
            keras.layers.Flatten(),
            keras.layers.Dense(
                len(names), activation="softmax", kernel_initializer=keras.initializers.GlorotUniform(7)
            ),
        ]
    )
    class_names = tf.constant(names)

    def classify(images):
        probabilities = model(images)
        class_id = tf.argmax(probabilities, axis=-1)
        return {"probabilities": probabilities, "class_id": class_id, "class_name": tf.gather(class_names, class_id)}

    def decode(index, data):
        is_image = tf.reduce_any([tf.strings.substr(data, 0, len(magic)) == magic for magic in MAGIC])
        message = tf.strings.format("element {} of input 'image_bytes' is not a PNG, JPEG, GIF or BMP image", index)
        with tf.control_dependencies([tf.debugging.Assert(is_image, [message])]):
            image = tf.io.decode_image(data, channels=1, expand_animations=False)
        if_resized = tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, (SIDE, SIDE))), 0, 255), tf.uint8)
        same_size = tf.reduce_all(tf.shape(image)[:2] == SIDE)
        return tf.ensure_shape(tf.cond(same_size, lambda: image, lambda: if_resized), (SIDE, SIDE, 1))

    def from_bytes(image_bytes):
        indices = tf.range(tf.size(image_bytes, out_type=tf.int64))
        images = tf.map_fn(
            lambda pair: decode(*pair),
            (indices, image_bytes),
            fn_output_signature=tf.TensorSpec((SIDE, SIDE, 1), tf.uint8),
        )
        return classify(images)

    module = tf.Module()
    module.model = model  # tracked: its variables are saved with the functions that use them
    string_batch = tf.TensorSpec((None,), tf.string, name="image_bytes")
    signatures = {
        "serve": tf.function(classify, input_signature=[tf.TensorSpec((None, SIDE, SIDE, 1), tf.uint8, "images")]),
        "serve_image_bytes": tf.function(from_bytes, input_signature=[string_batch]),
        "class_names": tf.function(lambda: {"class_names": class_names}, input_signature=[]),
    }
    tf.saved_model.save(module, str(path), signatures=signatures)
    return path


def images(count: int, seed: int = 0) -> np.ndarray:
    """`count` different uint8 images, [count, 8, 8, 1]."""
    return np.random.default_rng(seed).integers(0, 256, (count, SIDE, SIDE, 1), dtype=np.uint8)


def png(image: np.ndarray) -> bytes:
    import tensorflow as tf

    return tf.io.encode_png(image).numpy()


def jpeg(image: np.ndarray) -> bytes:
    import tensorflow as tf

    return tf.io.encode_jpeg(image, quality=95).numpy()


def in_process(path: pathlib.Path, signature: str, **inputs) -> dict[str, np.ndarray]:
    """What the SavedModel at `path` computes for these inputs, called in this process."""
    import tensorflow as tf

    function = tf.saved_model.load(str(path)).signatures[signature]
    return {name: tensor.numpy() for name, tensor in function(**{k: tf.constant(v) for k, v in inputs.items()}).items()}

import tensorflow as tf

# Two logical CPUs before any test starts TensorFlow's runtime: in-process training runs two replicas, so
# replica-context code (the loss scaling, dropout, synchronized batch norm) runs as it does in a group.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

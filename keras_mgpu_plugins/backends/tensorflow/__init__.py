"""The TensorFlow backend: `tf.distribute` strategies, their collectives and replica copies."""

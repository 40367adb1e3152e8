"""Public path of kmp.parallelize's tf.distribute strategies.

The code lives in `keras_mgpu_plugins.backends.tensorflow.strategy`; this name is the same
module object (attributes set here are set there), kept for the documented import path.
"""

import sys

from keras_mgpu_plugins.backends.tensorflow import strategy as _impl

sys.modules[__name__] = _impl

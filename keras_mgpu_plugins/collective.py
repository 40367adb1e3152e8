"""Public path of kmp.collective, the cross-worker primitives over a tf.distribute strategy.

The code lives in `keras_mgpu_plugins.backends.tensorflow.collective`; this name is the same
module object (attributes set here are set there), kept for the documented import path.
"""

import sys

from keras_mgpu_plugins.backends.tensorflow import collective as _impl

sys.modules[__name__] = _impl

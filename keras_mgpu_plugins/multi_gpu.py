"""Public path of `kmp.multi_gpu_model`, the successor of `keras.utils.multi_gpu_model`.

The code lives in `keras_mgpu_plugins.backends.tensorflow.multi_gpu` (the recipe is a
`tf.distribute` one); on TensorFlow this name is that module object. On another Keras
backend `multi_gpu_model` raises, naming `@kmp.parallelize`.
"""

from __future__ import annotations

import sys
from typing import Any

import keras

if keras.backend.backend() == "tensorflow":
    from keras_mgpu_plugins.backends.tensorflow import multi_gpu as _impl

    sys.modules[__name__] = _impl
else:

    def multi_gpu_model(model: Any, *args: Any, **kwargs: Any) -> Any:
        """Raises: `multi_gpu_model` is a TensorFlow recipe (see the module docstring)."""
        raise NotImplementedError(
            f"kmp.multi_gpu_model replicates a model with tf.distribute, which needs the "
            f"TensorFlow backend; the Keras backend here is {keras.backend.backend()!r}. "
            "Decorate the function that builds and compiles the model with @kmp.parallelize "
            "instead: it distributes fit over every device on this backend."
        )

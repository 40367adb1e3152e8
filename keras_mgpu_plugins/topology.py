"""Public path of `kmp.topology`: who this process is in the job, from the environment.

The code lives in `keras_mgpu_plugins.cluster.topology`; this name is the same module
object (attributes set here are set there), kept for the documented import path.
"""

import sys

from keras_mgpu_plugins.cluster import topology as _impl

sys.modules[__name__] = _impl

"""`python -m keras_mgpu_plugins.launch`: the `kmp-launch` command."""

import sys

from keras_mgpu_plugins.launch import main

sys.exit(main())

"""`python -m keras_mgpu_plugins.verify`: the `kmp-verify` command."""

import sys

from keras_mgpu_plugins.verify import main

sys.exit(main())

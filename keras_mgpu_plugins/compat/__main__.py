"""`python -m keras_mgpu_plugins.compat`: prints `kmp.compat.report()` (every patch's verdict)."""

from keras_mgpu_plugins.compat import report

if __name__ == "__main__":
    print(report())

#!/usr/bin/env bash
# The GPU run in one command (benchmarks/gpu/README.md has the device tool's call):
#
#   bash benchmarks/gpu/run.sh                 # on the GPU machine: installs .whl/, runs run.py
#   bash benchmarks/gpu/run.sh --cpu-dry-run   # anywhere: the same parts on CPU, tiny sizes
#
# On the GPU machine the wheels carried in .whl/ (benchmarks/gpu/fetch_wheels.sh: Keras,
# namex, optree, which its image lacks) are installed into /tmp/site, put first on
# PYTHONPATH; then benchmarks/gpu/run.py runs every part within its budget, writing
# $OUT/gpu-<device>.json after each part and $OUT/gpu-<device>.log. Other arguments go to
# run.py (--out DIR, --only PART ..., --python PART=PATH). PYTHON picks the interpreter of
# every part (default python3: on the GPU machine the one with JAX and torch); --python
# torch=PATH gives the torch part another (a dry run here: the torch lane's environment).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
PY=${PYTHON:-python3}
dry=0
for arg in "$@"; do [ "$arg" = "--cpu-dry-run" ] && dry=1; done
if [ "$dry" = 0 ] && compgen -G ".whl/*.whl" >/dev/null; then
  echo "installing $(ls .whl/*.whl | xargs -n1 basename | tr '\n' ' ')into /tmp/site"
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export KMP_GPU_COMMAND="bash benchmarks/gpu/run.sh $*"
exec "$PY" benchmarks/gpu/run.py "$@"

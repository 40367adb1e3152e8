#!/usr/bin/env bash
# Fetches the wheels the GPU run carries (benchmarks/gpu/wheels.txt) into .whl/ at the root of
# the checkout the device tool sends, as Python 3.12 manylinux x86-64 wheels (the GPU
# machine's image has no Keras, namex or optree, and no network). .whl/ is git-ignored
# (.gitignore: /.whl/); name it in the run call's `carry`. Idempotent; about 3 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
mkdir -p .whl
# shellcheck disable=SC2046
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
  -d .whl $(grep -v '^#' benchmarks/gpu/wheels.txt)
# One version of each: two stop the whole install there.
for name in $(grep -v '^#' benchmarks/gpu/wheels.txt | cut -d= -f1); do
  count=$(ls .whl | grep -ci "^${name//-/_}-" || true)
  [ "$count" = 1 ] || { echo "expected one wheel of $name in .whl/, found $count" >&2; exit 1; }
done
du -sh .whl && ls .whl

#!/usr/bin/env bash
# Build .nbpack/nbsite.tar.xz on a machine with a package index: what running a notebook headless needs on the GPU
# image and the offline SGLang pack lacks (nbclient, nbformat, ipykernel, jupyter_client, jupyter_core and their small
# needs), for the image's Python 3.12. The pack brings IPython, pyzmq, traitlets and jsonschema; the image numpy,
# torch and matplotlib. About 0.8 MB; git-ignored; carry it to the device beside .sglang-pack.
# usage: bash tools/nbpack/build.sh   (then benchmarks/gpu_notebooks.sh on the device)
set -euo pipefail
cd "$(dirname "$0")/../.."
W=$(mktemp -d) S=$(mktemp -d)
PLAT=""
for t in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_28_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 \
         manylinux_2_12_x86_64 manylinux2010_x86_64 any; do PLAT="$PLAT --platform $t"; done
PKGS="nbclient==0.11.0 nbformat==5.11.1 ipykernel==7.4.0 jupyter_client==8.10.0 jupyter_core==5.9.1 comm==0.2.3
 tornado==6.6.1 psutil==7.2.2 nest_asyncio2==1.7.4 fastjsonschema==2.22.3 platformdirs==4.14.8"  # the versions of 2026-11-29
# shellcheck disable=SC2086
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT -d "$W" $PKGS
# shellcheck disable=SC2086
python3 -m pip install -q --no-deps --no-compile --target "$S" --python-version 3.12 --implementation cp $PLAT \
  --only-binary=:all: "$W"/*.whl
rm -rf "$S/bin"
find "$S" -name __pycache__ -prune -exec rm -rf {} +
mkdir -p .nbpack
tar -C "$S" -cf - . | xz -9e -T0 > .nbpack/nbsite.tar.xz
rm -rf "$W" "$S"
ls -la .nbpack/nbsite.tar.xz

#!/usr/bin/env bash
# Build the offline SGLang pack on any machine with PyPI access (pip, xz); carry the result to the GPU node.
#   bash tools/sglang-offline/build.sh [DEST]      (DEST default: .sglang-pack, relative to where you run it)
# One archive per group of packages.txt: DEST/<group>.tar.xz, plus setup.sh beside them. The wheels are
# chosen for the node (CPython 3.12, x86-64 Linux), not for the machine that builds.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DEST=$(realpath -m "${1:-.sglang-pack}")
WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT
TARGET=(--python-version 3.12 --implementation cp --only-binary=:all:)
for tag in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_26_x86_64 \
           manylinux_2_27_x86_64 manylinux_2_28_x86_64 manylinux_2_34_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  TARGET+=(--platform "$tag")
done

packages() {  # the requirements of group $1
  awk -v g="[$1]" '/^\[/ {on = ($0 == g); next} on && NF && $1 !~ /^#/ {print $1}' "$HERE/packages.txt"
}

# What a Llama-style server with triton attention never loads: large libraries and debug information.
trim_site() {
  local d=$1
  rm -f "$d"/sgl_kernel/flash_ops*.so "$d"/sgl_kernel/flashmla_ops*.so "$d"/sgl_kernel/infllm_ops*.so  # FA3 and others
  rm -rf "$d"/sgl_kernel/sm100                       # the Blackwell build; Hopper loads sgl_kernel/sm90
  rm -rf "$d"/xgrammar/lib "$d"/xgrammar/include     # static library and headers
  strip --strip-debug "$d"/xgrammar/*.so "$d"/wcwidth/*.so 2>/dev/null || true
  rm -rf "$d"/sglang/multimodal_gen "$d"/sglang/srt/grpc/_core*.so  # diffusion serving, native gRPC
}

mkdir -p "$DEST"
for group in $(awk '/^\[/ {gsub(/[][]/, ""); print}' "$HERE/packages.txt"); do
  mapfile -t reqs < <(packages "$group")
  echo "== $group: ${#reqs[@]} package(s)"
  python3 -m pip download -q --no-deps "${TARGET[@]}" -d "$WORK/wheels-$group" "${reqs[@]}"
  python3 -m pip install -q --no-deps --no-compile "${TARGET[@]}" --target "$WORK/$group" "$WORK/wheels-$group"/*.whl
  rm -rf "$WORK/$group/bin"
  [ "$group" = site ] && trim_site "$WORK/$group"
  find "$WORK/$group" -name __pycache__ -prune -exec rm -rf {} +
  tar -C "$WORK/$group" -cf - . | xz -T0 -9 > "$DEST/$group.tar.xz"
done
cp "$HERE/setup.sh" "$DEST/setup.sh"
ls -l "$DEST"

# Source on the GPU node, from the folder that holds the pack:   PACK=.sglang-pack . .sglang-pack/setup.sh
# Unpacks the archives once per machine into /tmp/sglang-site (the site group first, then the others over it),
# puts that folder first on PYTHONPATH, and keeps the JIT caches in /tmp/jitcache, where later starts reuse them.
PACK=${PACK:-.sglang-pack}
SITE=${SGLANG_SITE:-/tmp/sglang-site}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TRITON_CACHE_DIR=/tmp/jitcache/triton TVM_FFI_CACHE_DIR=/tmp/jitcache/tvm-ffi FLASHINFER_WORKSPACE_BASE=/tmp/jitcache
mkdir -p /tmp/jitcache "$SITE"
for _archive in "$PACK"/site.tar.xz "$PACK"/site312.tar.xz "$PACK"/*.tar.xz; do
  _done="$SITE/.unpacked-$(basename "$_archive")"
  if [ -f "$_archive" ] && [ ! -f "$_done" ]; then
    tar -xJf "$_archive" -C "$SITE" && touch "$_done" || echo "setup.sh: could not unpack $_archive" >&2
  fi
done
unset _archive _done
case ":${PYTHONPATH:-}:" in *":$SITE:"*) ;; *) export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" ;; esac

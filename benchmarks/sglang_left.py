"""Print the SGLang processes still running (pid, command line): the server (an argv element exactly
"sglang.launch_server") and its scheduler/detokenizer ("sglang::..." titles). A plain `pgrep -f` would
also match any shell whose command line merely mentions them. Used by the GPU scripts after a stop."""

import os

for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if b"sglang.launch_server" in argv or argv[0].startswith(b"sglang::"):
        print(pid, b" ".join(argv)[:120].decode(errors="replace"))

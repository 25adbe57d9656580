#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
#
# tools/fetch_nccl.sh VERSION DIR: the genuine NCCL's header and library, from NVIDIA's PyPI
# package nvidia-nccl-cu13==VERSION, into DIR/include (nccl.h and the device API's headers) and
# DIR/lib/libnccl.so.2. ncclshim compiles against that header, since the ABI it implements is
# that version's, and test/abi_check.sh holds its exports against that library. Neither is
# committed (DIR is under the ignored .deps/). Nothing to do when DIR/include/nccl.h is there.
# Needs python3 and PyPI; the wheel's sha256 is checked against PyPI's.
set -euo pipefail

if [[ $# -ne 2 ]]; then
    echo "usage: $0 VERSION DIR" >&2
    exit 2
fi
version=$1
dir=$2
if [[ -f $dir/include/nccl.h && -f $dir/lib/libnccl.so.2 ]]; then
    exit 0
fi
command -v python3 >/dev/null || { echo "fetch_nccl: python3 is needed" >&2; exit 1; }
echo "fetch_nccl: nvidia-nccl-cu13==$version from PyPI into $dir" >&2
python3 - "$version" "$dir" "$(uname -m)" <<'EOF'
import hashlib, json, os, shutil, sys, tempfile, urllib.request, zipfile

version, dest, machine = sys.argv[1], sys.argv[2], sys.argv[3]
# PyPI's simple index in JSON (PEP 691), which mirrors of PyPI serve too.
index = urllib.request.Request("https://pypi.org/simple/nvidia-nccl-cu13/",
                               headers={"Accept": "application/vnd.pypi.simple.v1+json"})
with urllib.request.urlopen(index, timeout=60) as r:
    files = json.load(r)["files"]
wheels = [f for f in files
          if f["filename"].startswith(f"nvidia_nccl_cu13-{version}-")
          and f["filename"].endswith(".whl") and "manylinux" in f["filename"]
          and machine in f["filename"]]
if not wheels:
    sys.exit(f"fetch_nccl: no manylinux {machine} wheel of nvidia-nccl-cu13 {version}")
wheel = wheels[0]
tmp = tempfile.mkdtemp(prefix="fetch_nccl.")
try:
    path = os.path.join(tmp, wheel["filename"])
    digest = hashlib.sha256()
    with urllib.request.urlopen(wheel["url"], timeout=600) as r, open(path, "wb") as f:
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            f.write(chunk)
    if digest.hexdigest() != wheel["hashes"]["sha256"]:
        sys.exit(f"fetch_nccl: {wheel['filename']}: sha256 does not match PyPI's")
    staging = dest + ".partial"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            for prefix, sub in (("nvidia/nccl/include/", "include"),
                                ("nvidia/nccl/lib/libnccl.so.2", "lib")):
                if name.startswith(prefix) and not name.endswith("/"):
                    rel = name[len("nvidia/nccl/"):]
                    out = os.path.join(staging, rel)
                    os.makedirs(os.path.dirname(out), exist_ok=True)
                    with z.open(name) as src, open(out, "wb") as dst:
                        shutil.copyfileobj(src, dst)
    if not os.path.isfile(os.path.join(staging, "include", "nccl.h")):
        sys.exit(f"fetch_nccl: {wheel['filename']} holds no nccl.h")
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    os.rename(staging, dest)
finally:
    shutil.rmtree(tmp, ignore_errors=True)
EOF

#!/usr/bin/env bash
# Regenerates forkd/_proto/ from proto/ with grpcio-tools and mypy-protobuf (typed stubs), then
# points the generated imports at this package (`forkd.v1` is the proto's package, which would
# otherwise collide with the `forkd` import name). CI runs it and fails if anything changed.
# Usage: scripts/generate.sh [PYTHON]  (a Python with grpcio-tools and mypy-protobuf installed)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${1:-python3}"
# The mypy plugins are scripts beside that Python.
export PATH="$(dirname "$("$python" -c 'import sys; print(sys.executable)')"):$PATH"
out="$here/forkd/_proto"
rm -rf "$out"
mkdir -p "$out"
"$python" -m grpc_tools.protoc \
    -I "$root/proto" \
    --python_out="$out" \
    --mypy_out="$out" \
    --grpc_python_out="$out" \
    --mypy_grpc_out="$out" \
    "$root/proto/forkd/v1/forkd.proto"
# `from forkd.v1 import forkd_pb2` → `from forkd._proto.forkd.v1 import forkd_pb2`; the stubs
# name the module `forkd.v1.forkd_pb2` the same way.
find "$out" -name '*.py' -o -name '*.pyi' | while read -r f; do
    sed -i -E 's/^from forkd\.v1 import /from forkd._proto.forkd.v1 import /; s/^import forkd\.v1\.forkd_pb2$/import forkd._proto.forkd.v1.forkd_pb2/; s/forkd\.v1\.forkd_pb2\./forkd._proto.forkd.v1.forkd_pb2./g' "$f"
done
for d in "$out" "$out/forkd" "$out/forkd/v1"; do
    printf '"""Generated from proto/ by scripts/generate.sh: do not edit."""\n' > "$d/__init__.py"
done

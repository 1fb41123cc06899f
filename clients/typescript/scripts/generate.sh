#!/usr/bin/env bash
# Regenerates src/gen/ from proto/ with ts-proto (the `grpc-js` service flavour), run by the
# protoc that grpcio-tools bundles (PYTHON: a Python with grpcio-tools, as the Python client's
# `dev` extra installs): nothing is downloaded. CI runs it and fails if anything changed.
# Usage: scripts/generate.sh PYTHON   (after `npm ci`)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${1:?usage: scripts/generate.sh PYTHON (with grpcio-tools)}"
out="$here/src/gen"
# google.rpc.Status and RetryInfo (RESOURCE_EXHAUSTED's retry delay): the .proto files that
# googleapis-common-protos (a dependency of grpcio-status) ships beside its modules.
googleapis="$("$python" -c 'import google.rpc.status_pb2 as m, os; print(os.path.dirname(os.path.dirname(os.path.dirname(m.__file__))))')"
rm -rf "$out"
mkdir -p "$out"
"$python" -m grpc_tools.protoc \
    -I "$root/proto" \
    -I "$googleapis" \
    --plugin=protoc-gen-ts_proto="$here/node_modules/.bin/protoc-gen-ts_proto" \
    --ts_proto_out="$out" \
    --ts_proto_opt=outputServices=grpc-js,esModuleInterop=true,importSuffix=.js,env=node,useOptionals=messages,oneof=unions-value,snakeToCamel=true,forceLong=number \
    "$root/proto/forkd/v1/forkd.proto" \
    "$googleapis/google/rpc/status.proto" \
    "$googleapis/google/rpc/error_details.proto"

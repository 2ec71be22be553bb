#!/bin/sh
# Seeds the cargo-fuzz corpus of the `parse_frame` target from the scapy vectors: every "frame" (hex of
# a whole Ethernet frame) in tests/data/rocev2_vectors.json becomes one file under
# corpus/parse_frame/, named after its vector. Run it from anywhere; corpus/ is not committed.
#
#   roce/fuzz/seed_corpus.sh && cd roce/fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run parse_frame
set -eu

here=$(cd "$(dirname "$0")" && pwd)
vectors="$here/../../tests/data/rocev2_vectors.json"
out="$here/corpus/parse_frame"
mkdir -p "$out"

python3 - "$vectors" "$out" <<'PY'
import json, pathlib, sys

vectors, out = sys.argv[1], pathlib.Path(sys.argv[2])
count = 0
for vector in json.load(open(vectors)):
    frame = bytes.fromhex(vector["frame"])
    (out / f"scapy_{vector['name']}").write_bytes(frame)
    count += 1
print(f"seeded {count} frames into {out}")
PY

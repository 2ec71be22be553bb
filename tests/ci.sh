#!/usr/bin/env bash
# The whole test suite: what `.ci/run` and the README's test command run.
set -euo pipefail
cd "$(dirname "$0")/.."

bash tests/setup.sh
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The wire format is no_std: its tests must also build and pass without the `std` feature.
cargo clippy -p roce --no-default-features --all-targets -- -D warnings
cargo test -p roce --no-default-features
# Public docs: every intra-doc link resolves and none points at a private item.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
# The cargo-fuzz target (not a workspace member) must keep building.
cargo check --quiet --manifest-path roce/fuzz/Cargo.toml
# Includes the verbs conformance suite on the software backends (tests/tests/verbs_conformance.rs: the fabric and
# UDP runs must pass every case and agree field for field; about 3 s); its run on rxe0 is in the guest below.
cargo test --workspace
# Real peers: Linux soft-RoCE (rdma_rxe) and rdma-core's tools in QEMU TCG guests (tests/guest/README.md).
# The rxe-to-rxe reference matrix, then every RoCEv2 frame of its capture re-verified by the roce crate.
bash tests/guest/setup.sh
cargo test -p tests --test guest_reference -- --ignored --test-threads 1 reference_run_passes_and_rxe_icrcs_verify
# The conformance matrix: this project's rdma-pingpong / rdma-perf on the host against rdma-core's and perftest's
# tools on rxe in a guest, both roles, MTU 1024/4096, IPv4 + IPv6 link-local GIDs, a lossy fault case; then every
# RoCEv2 frame of its capture (rxe's and ours) re-verified by the roce crate (tests/guest/matrix.sh).
cargo test -p tests --test guest_matrix -- --ignored --test-threads 1 matrix_passes_and_every_icrc_verifies
# Kernel bypass: the VFIO userspace virtio-net driver in a q35 + intel-iommu guest against rxe (tests/guest/vfio.sh).
cargo test -p hca --test vfio_guest -- --ignored --test-threads 1
# The IB verbs path: hca::ibverbs (--link verbs:rxe0) on Linux rxe in a guest: the conformance suite compared with
# the software engine, coll-perf all-reduce on 2 and 4 ranks, rdma-perf / rdma-pingpong against the software HCA
# on the host, both roles (tests/guest/verbs.sh).
cargo test -p tests --test guest_verbs -- --ignored --test-threads 1

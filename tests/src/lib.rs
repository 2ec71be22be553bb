//! Cross-crate integration and conformance tests. The tests live under `tests/tests/`; this library holds
//! what they share (locating external tools such as `tshark`).
#![deny(missing_docs)]

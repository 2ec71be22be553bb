//! # `gpu-p2p`: GPUDirect-registered memory and the intra-node GPU peer path
//!
//! Not built yet: this crate is a skeleton until the memory-provider API lands (issue 9). Nothing here
//! claims to work.
#![deny(missing_docs)]

//! # `collectives`: zero-copy collectives over RDMA WRITE with immediate
//!
//! Not built yet: this crate is a skeleton until the communicator and the collectives land (issue 6).
//! Nothing here claims to work.
#![deny(missing_docs)]

//! # `hca`: the verbs API and the software HCA
//!
//! Not built yet: this crate is a skeleton until the verbs object model and the RC/UC/UD transport
//! engine land (issue 3). Nothing here claims to work.
#![deny(missing_docs)]

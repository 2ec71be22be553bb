//! Packet sequences from a lying peer against a responder holding memory regions: see the
//! `hca_fuzz` crate docs (`hca/fuzz/src/lib.rs`) for what is checked and how to run it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    hca_fuzz::run(data);
});

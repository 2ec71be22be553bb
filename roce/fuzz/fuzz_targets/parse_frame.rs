//! Feeds arbitrary bytes to every untrusted-input entry point of the `roce` parser: a whole Ethernet frame,
//! an IP packet and a bare UDP payload (BTH onwards). None may panic or read out of bounds; a frame that
//! parses must re-emit to the same header bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    roce::packet::fuzz_entry(data);
});

//! Feeds arbitrary bytes to every untrusted-input entry point of the `roce` parser: a whole Ethernet frame,
//! an IP packet and a bare UDP payload (BTH onwards). None may panic or read out of bounds; a frame that
//! parses must re-emit to the same header bytes.
//!
//! Random mutations almost never keep the IPv4 header checksum, the UDP checksum and the ICRC valid, so
//! most inputs would stop at the first checksum. Each input is therefore fed twice: as it is, and with
//! those three checksums recomputed over its (possibly malformed) bytes, which lets the fuzzer explore
//! the length, PadCnt, opcode and extended-header checks behind them and the rebuild round trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use roce::{icrc, ipv4, ipv6, udp};

fuzz_target!(|data: &[u8]| {
    roce::packet::fuzz_entry(data);
    let mut fixed = data.to_vec();
    if fix_checksums(&mut fixed) && fixed != data {
        roce::packet::fuzz_entry(&fixed);
    }
});

/// Makes the IPv4 header checksum, the ICRC and (when it is not zero) the UDP checksum of an Ethernet
/// frame valid, as far as its length fields allow; returns whether the frame holds an IP packet. Only
/// bytes inside the buffer are touched, and nothing here may panic on any input.
fn fix_checksums(frame: &mut [u8]) -> bool {
    let Some(ethertype) = be16(frame, 12) else {
        return false;
    };
    let (ethertype, ip_start) = if ethertype == 0x8100 {
        match be16(frame, 16) {
            Some(inner) => (inner, 18),
            None => return false,
        }
    } else {
        (ethertype, 14)
    };
    let ip = &mut frame[ip_start..];
    match (ethertype, ip.first().map(|b| b >> 4)) {
        (0x0800, Some(4)) => fix_ipv4(ip),
        (0x86dd, Some(6)) => fix_ipv6(ip),
        _ => return false,
    }
    true
}

fn be16(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*bytes.get(at)?, *bytes.get(at + 1)?]))
}

fn fix_ipv4(ip: &mut [u8]) {
    let ihl = usize::from(ip[0] & 0x0f) * 4;
    if ihl < ipv4::HEADER_LEN || ip.len() < ihl {
        return;
    }
    ipv4::Packet::new_unchecked(&mut *ip).fill_checksum();
    let Some(total) = be16(ip, 2).map(usize::from) else {
        return;
    };
    if total < ihl || total > ip.len() {
        return;
    }
    let src = ipv4::Packet::new_unchecked(&*ip).src_addr();
    let dst = ipv4::Packet::new_unchecked(&*ip).dst_addr();
    let packet = &mut ip[..total];
    let _ = icrc::write(packet);
    if let Some(datagram) = udp_datagram(packet, ihl) {
        udp::Packet::new_unchecked(datagram).fill_checksum_v4(src, dst);
    }
}

fn fix_ipv6(ip: &mut [u8]) {
    if ip.len() < ipv6::HEADER_LEN {
        return;
    }
    let view = ipv6::Packet::new_unchecked(&*ip);
    let (src, dst) = (view.src_addr(), view.dst_addr());
    let total = ipv6::HEADER_LEN + usize::from(view.payload_len());
    if total > ip.len() {
        return;
    }
    let packet = &mut ip[..total];
    let _ = icrc::write(packet);
    if let Some(datagram) = udp_datagram(packet, ipv6::HEADER_LEN) {
        udp::Packet::new_unchecked(datagram).fill_checksum_v6(src, dst);
    }
}

/// The UDP datagram after an IP header of `ip_header_len` bytes, when its checksum is non-zero (zero
/// means "not computed" and stays zero) and its Length field fits the buffer.
fn udp_datagram(packet: &mut [u8], ip_header_len: usize) -> Option<&mut [u8]> {
    let datagram = packet.get_mut(ip_header_len..)?;
    let len = usize::from(be16(datagram, 4)?);
    let checksum = be16(datagram, 6)?;
    if checksum == 0 || len < udp::HEADER_LEN || len > datagram.len() {
        return None;
    }
    datagram.get_mut(..len)
}

//! The one error type of the wire-format crate.

use core::fmt;

/// The header or protocol layer an [`Error`] refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layer {
    /// Ethernet II header (IEEE 802.3).
    Ethernet,
    /// IEEE 802.1Q VLAN tag.
    Vlan,
    /// ARP (RFC 826).
    Arp,
    /// IPv4 header (RFC 791).
    Ipv4,
    /// IPv6 header (RFC 8200).
    Ipv6,
    /// UDP header (RFC 768).
    Udp,
    /// IPv6 Neighbor Discovery (RFC 4861) in ICMPv6 (RFC 4443): the message, its checksum, its options.
    Ndisc,
    /// Base Transport Header (IBTA vol. 1 §9.2).
    Bth,
    /// RDMA Extended Transport Header (§9.3.3).
    Reth,
    /// ACK Extended Transport Header (§9.3.5).
    Aeth,
    /// Atomic Extended Transport Header (§9.3.4).
    AtomicEth,
    /// Atomic Acknowledge Extended Transport Header (§9.3.6).
    AtomicAckEth,
    /// Immediate data (§9.3.7).
    ImmDt,
    /// Invalidate Extended Transport Header (§9.3.8).
    Ieth,
    /// Datagram Extended Transport Header (§9.3.2).
    Deth,
    /// Congestion Notification Packet (Annex A17.9.3).
    Cnp,
    /// Invariant CRC (§7.8.1, Annex A17.3.3).
    Icrc,
    /// The payload and its pad bytes.
    Payload,
    /// A pcap file.
    Pcap,
    /// Management datagram header (MAD common header, IBTA vol. 1 §13.4.2).
    Mad,
    /// Communication-management message (IBTA vol. 1 §12.6).
    Cm,
}

impl fmt::Display for Layer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Layer::Ethernet => "Ethernet",
            Layer::Vlan => "802.1Q",
            Layer::Arp => "ARP",
            Layer::Ipv4 => "IPv4",
            Layer::Ipv6 => "IPv6",
            Layer::Udp => "UDP",
            Layer::Ndisc => "ICMPv6 Neighbor Discovery",
            Layer::Bth => "BTH",
            Layer::Reth => "RETH",
            Layer::Aeth => "AETH",
            Layer::AtomicEth => "AtomicETH",
            Layer::AtomicAckEth => "AtomicAckETH",
            Layer::ImmDt => "ImmDt",
            Layer::Ieth => "IETH",
            Layer::Deth => "DETH",
            Layer::Cnp => "CNP",
            Layer::Icrc => "ICRC",
            Layer::Payload => "payload",
            Layer::Pcap => "pcap",
            Layer::Mad => "MAD",
            Layer::Cm => "CM",
        };
        f.write_str(name)
    }
}

/// Everything that can go wrong parsing or emitting a packet. Parsing untrusted bytes returns one of
/// these and never panics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// The buffer ends before the header (or the length its header declares) does.
    Truncated {
        /// Header being read.
        layer: Layer,
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// A length field disagrees with the buffer or with itself (IPv4 IHL < 5, UDP length < 8, ...).
    BadLength(Layer),
    /// A version field holds a value this crate does not speak (IP version, BTH TVer != 0).
    BadVersion {
        /// Header being read.
        layer: Layer,
        /// The version found.
        version: u8,
    },
    /// The IPv4 header checksum or the UDP checksum does not verify.
    BadChecksum(Layer),
    /// The ICRC on the wire differs from the one computed over the packet.
    BadIcrc {
        /// ICRC computed over the received bytes.
        computed: u32,
        /// ICRC found in the packet's last four bytes.
        received: u32,
    },
    /// The BTH opcode is not defined for RC, UC, UD or CNP (IBTA table 38, Annex A17.9.3).
    UnknownOpcode(u8),
    /// PadCnt is larger than the payload, or the padded payload is not a multiple of 4 bytes
    /// (IBTA §9.2: PadCnt pads the payload to a 4-byte boundary).
    BadPad {
        /// The BTH PadCnt field.
        pad_cnt: u8,
        /// Payload bytes including the pad.
        padded_len: usize,
    },
    /// The frame is not RoCEv2: not IPv4/IPv6, not UDP, or not destination port 4791.
    NotRoce,
    /// A field holds a value the layer forbids (named by the message).
    Malformed {
        /// Header being read.
        layer: Layer,
        /// What is wrong.
        what: &'static str,
    },
    /// The buffer given to an emitter is too short.
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes available.
        got: usize,
    },
}

/// Result with this crate's [`Error`].
pub type Result<T> = core::result::Result<T, Error>;

/// The length check of every header view: `Ok` when a buffer of `got` bytes holds the `need` bytes
/// that `layer` requires, else [`Error::Truncated`] with all three.
pub(crate) fn check_len(layer: Layer, need: usize, got: usize) -> Result<()> {
    if got < need {
        Err(Error::Truncated { layer, need, got })
    } else {
        Ok(())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::Truncated { layer, need, got } => {
                write!(f, "{layer} truncated: need {need} bytes, have {got}")
            }
            Error::BadLength(layer) => write!(f, "{layer} length field is inconsistent"),
            Error::BadVersion { layer, version } => {
                write!(f, "{layer} version {version} is not supported")
            }
            Error::BadChecksum(layer) => write!(f, "{layer} checksum does not verify"),
            Error::BadIcrc { computed, received } => write!(
                f,
                "ICRC mismatch: computed {computed:#010x}, packet carries {received:#010x}"
            ),
            Error::UnknownOpcode(op) => write!(f, "unknown BTH opcode {op:#04x}"),
            Error::BadPad {
                pad_cnt,
                padded_len,
            } => write!(
                f,
                "bad PadCnt {pad_cnt} for {padded_len} payload bytes (must be <= payload and leave a 4-byte multiple)"
            ),
            Error::NotRoce => f.write_str("not a RoCEv2 packet (IP/UDP destination port 4791)"),
            Error::Malformed { layer, what } => write!(f, "malformed {layer}: {what}"),
            Error::BufferTooSmall { need, got } => {
                write!(f, "output buffer too small: need {need} bytes, have {got}")
            }
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for Error {}

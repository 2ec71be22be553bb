//! Communication-management (CM) messages (IBTA vol. 1 chapter 12, §12.6), the class data of MADs of
//! class [`MgmtClass::CommMgmt`] (0x07), class version [`CLASS_VERSION`] (2), method Send.
//!
//! Each message fills the 232 bytes after the MAD common header; the AttributeID says which message
//! it is ([`AttrId`]). Field offsets and widths follow IBTA tables 106 (REQ) to 120 (SIDR_REP), as
//! Linux spells them in `include/rdma/ibta_vol1_c12.h` (the implementation this crate interoperates
//! with, through rxe). Bit fields are numbered from the most significant bit of their byte.
//!
//! RoCE specifics (IBTA Annex A17.4.2): the path's LIDs carry no meaning (Linux rxe sends whatever its
//! path record holds, usually 0), the GIDs are the IP addresses (IPv4-mapped or IPv6) of the two
//! ports, and the hop limit and traffic class are the IP header's.
//!
//! LAP and APR (alternate-path load, §12.8) are not parsed: [`Message::parse`] refuses them with
//! [`Error::Malformed`], and a CM answers them as unsupported.
//!
//! Parsing never panics on any input; emitting writes reserved bits as 0 and masks every value to its
//! field's width.

use crate::error::check_len;
use crate::mad::{self, Method, MgmtClass, Status};
use crate::wire_field::{
    read_array, read_u16, read_u24, read_u32, read_u64, write_array, write_u16, write_u24,
    write_u32, write_u64,
};
use crate::{Error, Gid, Layer, PathMtu, Result};

/// The CM class version (IBTA vol. 1 §12.11: class version 2, as Linux `IB_CM_CLASS_VERSION`).
pub const CLASS_VERSION: u8 = 2;
/// Bytes of class data every CM message occupies (the 232 bytes after the MAD header).
pub const DATA_LEN: usize = mad::DATA_LEN;
/// Length of one path description inside a REQ (table 106, bytes 52..96 and 96..140).
pub const PATH_LEN: usize = 44;
/// Private data bytes of a REQ (table 106: 92 bytes).
pub const REQ_PRIVATE_DATA_LEN: usize = 92;
/// Private data bytes of an MRA (table 107: 222 bytes).
pub const MRA_PRIVATE_DATA_LEN: usize = 222;
/// Private data bytes of a REJ (table 108: 148 bytes).
pub const REJ_PRIVATE_DATA_LEN: usize = 148;
/// Bytes of the REJ's Additional Rejection Information (table 108: 72 bytes).
pub const REJ_ARI_LEN: usize = 72;
/// Private data bytes of a REP (table 110: 196 bytes).
pub const REP_PRIVATE_DATA_LEN: usize = 196;
/// Private data bytes of an RTU (table 111: 224 bytes).
pub const RTU_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes of a DREQ (table 112: 220 bytes).
pub const DREQ_PRIVATE_DATA_LEN: usize = 220;
/// Private data bytes of a DREP (table 113: 224 bytes).
pub const DREP_PRIVATE_DATA_LEN: usize = 224;
/// Private data bytes of a SIDR_REQ (table 119: 216 bytes).
pub const SIDR_REQ_PRIVATE_DATA_LEN: usize = 216;
/// Private data bytes of a SIDR_REP (table 120: 136 bytes).
pub const SIDR_REP_PRIVATE_DATA_LEN: usize = 136;
/// Bytes of the SIDR_REP's Additional Information (table 120: 72 bytes).
pub const SIDR_REP_INFO_LEN: usize = 72;

enum_with_unknown! {
    /// AttributeID of the CM class (IBTA vol. 1 §12.6, table 104).
    pub enum AttrId(u16) {
        /// ClassPortInfo (Get/Set only).
        ClassPortInfo = 0x0001,
        /// ConnectRequest.
        Req = 0x0010,
        /// MsgRcptAck: "message received, reply later".
        Mra = 0x0011,
        /// ConnectReject.
        Rej = 0x0012,
        /// ConnectReply.
        Rep = 0x0013,
        /// ReadyToUse.
        Rtu = 0x0014,
        /// DisconnectRequest.
        Dreq = 0x0015,
        /// DisconnectReply.
        Drep = 0x0016,
        /// ServiceIDResReq (UD service resolution).
        SidrReq = 0x0017,
        /// ServiceIDResReqResp.
        SidrRep = 0x0018,
        /// LoadAlternatePath (not supported here).
        Lap = 0x0019,
        /// AlternatePathResponse (not supported here).
        Apr = 0x001A,
    }
}

enum_with_unknown! {
    /// Transport Service Type of a REQ (table 106, 2 bits).
    pub enum TransportType(u8) {
        /// Reliable Connection.
        Rc = 0,
        /// Unreliable Connection.
        Uc = 1,
        /// Reliable Datagram.
        Rd = 2,
    }
}

enum_with_unknown! {
    /// Which message an MRA acknowledges or a REJ rejects (tables 107 and 108, 2 bits).
    pub enum MsgKind(u8) {
        /// The REQ.
        Req = 0,
        /// The REP.
        Rep = 1,
        /// Another message (the LAP).
        Other = 2,
    }
}

enum_with_unknown! {
    /// REJ reason (IBTA vol. 1 §12.6.7.2, table 109; Linux `enum ib_cm_rej_reason`).
    pub enum RejReason(u16) {
        /// No QP available.
        NoQp = 1,
        /// No EE context available.
        NoEec = 2,
        /// No resources available.
        NoResources = 3,
        /// Timeout: the REP or RTU did not arrive in time.
        Timeout = 4,
        /// Unsupported request.
        Unsupported = 5,
        /// Invalid Communication ID.
        InvalidCommId = 6,
        /// Invalid Communication Instance.
        InvalidCommInstance = 7,
        /// Invalid Service ID: no one listens on it.
        InvalidServiceId = 8,
        /// Invalid transport service type.
        InvalidTransportType = 9,
        /// Stale connection: the QP is already connected (or in timewait).
        StaleConn = 10,
        /// RDC does not exist.
        RdcNotExist = 11,
        /// Primary remote port GID rejected.
        InvalidGid = 12,
        /// Primary remote port LID rejected.
        InvalidLid = 13,
        /// Primary SL rejected.
        InvalidSl = 14,
        /// Primary traffic class rejected.
        InvalidTrafficClass = 15,
        /// Primary hop limit rejected.
        InvalidHopLimit = 16,
        /// Primary packet rate rejected.
        InvalidPacketRate = 17,
        /// Alternate remote port GID rejected.
        InvalidAltGid = 18,
        /// Alternate remote port LID rejected.
        InvalidAltLid = 19,
        /// Alternate SL rejected.
        InvalidAltSl = 20,
        /// Alternate traffic class rejected.
        InvalidAltTrafficClass = 21,
        /// Alternate hop limit rejected.
        InvalidAltHopLimit = 22,
        /// Alternate packet rate rejected.
        InvalidAltPacketRate = 23,
        /// Port and CM redirect.
        PortCmRedirect = 24,
        /// Port redirect.
        PortRedirect = 25,
        /// Invalid path MTU.
        InvalidMtu = 26,
        /// Insufficient responder resources.
        InsufficientRespResources = 27,
        /// Consumer reject (`rdma_reject`): the private data says why.
        ConsumerDefined = 28,
        /// Invalid RNR NAK retry count.
        InvalidRnrRetry = 29,
        /// Duplicate local Communication ID.
        DuplicateLocalCommId = 30,
        /// Unsupported class version: the ARI holds the highest version supported.
        InvalidClassVersion = 31,
        /// Invalid primary flow label.
        InvalidFlowLabel = 32,
        /// Invalid alternate flow label.
        InvalidAltFlowLabel = 33,
        /// Vendor option not supported.
        VendorOptionNotSupported = 35,
    }
}

enum_with_unknown! {
    /// SIDR_REP status (IBTA vol. 1 §12.11.2, table 121; Linux `enum ib_cm_sidr_status`).
    pub enum SidrStatus(u8) {
        /// The QPN and Q_Key are valid.
        Success = 0,
        /// The service ID is not supported.
        Unsupported = 1,
        /// Rejected by the service.
        Reject = 2,
        /// No QP available.
        NoQp = 3,
        /// Redirect: the additional information holds a ClassPortInfo.
        Redirect = 4,
        /// Unsupported class version.
        UnsupportedVersion = 5,
    }
}

/// Reads `width` bits starting `shift` bits below the most significant bit of `byte`.
const fn bits(byte: u8, shift: u32, width: u32) -> u8 {
    (byte >> (8 - shift - width)) & ((1u16 << width) - 1) as u8
}

/// Writes the low `width` bits of `value` at `shift` bits below the most significant bit of `byte`.
fn put_bits(byte: &mut u8, shift: u32, width: u32, value: u8) {
    let mask = (((1u16 << width) - 1) as u8) << (8 - shift - width);
    *byte = (*byte & !mask) | ((value << (8 - shift - width)) & mask);
}

fn check(data: &[u8]) -> Result<()> {
    check_len(Layer::Cm, DATA_LEN, data.len())
}

fn check_out(data: &[u8]) -> Result<()> {
    if data.len() < DATA_LEN {
        Err(Error::BufferTooSmall {
            need: DATA_LEN,
            got: data.len(),
        })
    } else {
        Ok(())
    }
}

/// One path of a REQ (table 106, primary path at bytes 52..96 and alternate at 96..140). An
/// alternate path of all zeros means "none" (Linux `cm_req_has_alt_path`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Path {
    /// Local port LID (no meaning on RoCE).
    pub local_lid: u16,
    /// Remote port LID (no meaning on RoCE).
    pub remote_lid: u16,
    /// Local port GID: on RoCE the sender's IP address.
    pub local_gid: Gid,
    /// Remote port GID: on RoCE the receiver's IP address.
    pub remote_gid: Gid,
    /// Flow label (20 bits; the IPv6 flow label on RoCE).
    pub flow_label: u32,
    /// Packet rate (6 bits, IBTA table 225 encoding).
    pub packet_rate: u8,
    /// Traffic class (the IP DSCP/ECN byte on RoCE).
    pub traffic_class: u8,
    /// Hop limit (the IP TTL on RoCE).
    pub hop_limit: u8,
    /// Service level (4 bits).
    pub sl: u8,
    /// Subnet local: 1 when the peer is on the local subnet (no GRH needed on IB).
    pub subnet_local: bool,
    /// Local ACK timeout (5 bits; 4.096 µs · 2^value).
    pub local_ack_timeout: u8,
}

impl Path {
    fn parse(b: &[u8]) -> Path {
        Path {
            local_lid: read_u16(b, 0..2),
            remote_lid: read_u16(b, 2..4),
            local_gid: Gid::from_bytes(read_array(b, 4..20)),
            remote_gid: Gid::from_bytes(read_array(b, 20..36)),
            flow_label: read_u32(b, 36..40) >> 12,
            packet_rate: bits(b[39], 2, 6),
            traffic_class: b[40],
            hop_limit: b[41],
            sl: bits(b[42], 0, 4),
            subnet_local: bits(b[42], 4, 1) != 0,
            local_ack_timeout: bits(b[43], 0, 5),
        }
    }

    fn emit(&self, b: &mut [u8]) {
        write_u16(b, 0..2, self.local_lid);
        write_u16(b, 2..4, self.remote_lid);
        write_array(b, 4..20, *self.local_gid.as_bytes());
        write_array(b, 20..36, *self.remote_gid.as_bytes());
        write_u32(b, 36..40, (self.flow_label & 0xF_FFFF) << 12);
        put_bits(&mut b[39], 2, 6, self.packet_rate);
        b[40] = self.traffic_class;
        b[41] = self.hop_limit;
        b[42] = 0;
        put_bits(&mut b[42], 0, 4, self.sl);
        put_bits(&mut b[42], 4, 1, self.subnet_local as u8);
        b[43] = 0;
        put_bits(&mut b[43], 0, 5, self.local_ack_timeout);
    }
}

/// ConnectRequest (REQ, IBTA vol. 1 §12.6.5, table 106).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Req {
    /// The sender's Communication ID for this connection.
    pub local_comm_id: u32,
    /// Service ID the REQ is for (RDMA CM: port space and port, [`service_id`]).
    pub service_id: u64,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// The sender QP's Q_Key (RD only).
    pub local_qkey: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// RDMA READ / atomic requests the sender accepts at once.
    pub responder_resources: u8,
    /// The sender's EE context (24 bits; RD only).
    pub local_eecn: u32,
    /// RDMA READ / atomic requests the sender issues at once.
    pub initiator_depth: u8,
    /// Remote EE context (24 bits; RD only).
    pub remote_eecn: u32,
    /// How long the passive side may take to answer (5 bits; 4.096 µs · 2^value).
    pub remote_cm_response_timeout: u8,
    /// Transport service type.
    pub transport_type: TransportType,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// The sender's starting PSN (24 bits): the receiver's expected PSN.
    pub starting_psn: u32,
    /// How long the sender's CM takes to answer (5 bits; 4.096 µs · 2^value).
    pub local_cm_response_timeout: u8,
    /// Transport retry count (3 bits).
    pub retry_count: u8,
    /// Partition key.
    pub pkey: u16,
    /// Path MTU code (4 bits; 1 = 256 ... 5 = 4096 bytes, [`Req::path_mtu`]).
    pub path_mtu_code: u8,
    /// RDC exists.
    pub rdc_exists: bool,
    /// RNR NAK retry count (3 bits; 7 = infinite).
    pub rnr_retry_count: u8,
    /// How many times the sender retries a CM message before giving up (4 bits).
    pub max_cm_retries: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// Extended transport type (3 bits; 1 = XRC).
    pub extended_transport_type: u8,
    /// Primary path.
    pub primary_path: Path,
    /// Alternate path (all zeros: none).
    pub alternate_path: Path,
    /// Source-alternate-path (SAP) supported.
    pub sap_supported: bool,
    /// Consumer private data (RDMA CM puts its addressing header first, `cma_hdr`).
    pub private_data: [u8; REQ_PRIVATE_DATA_LEN],
}

impl Req {
    /// The path MTU, or `None` when [`Req::path_mtu_code`] is not one of 1..=5.
    pub fn path_mtu(&self) -> Option<PathMtu> {
        PathMtu::ALL
            .into_iter()
            .find(|m| m.code() == self.path_mtu_code)
    }

    /// Parses a REQ from the 232 bytes of MAD class data.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes.
    pub fn parse(data: &[u8]) -> Result<Req> {
        check(data)?;
        let d = data;
        Ok(Req {
            local_comm_id: read_u32(d, 0..4),
            service_id: read_u64(d, 8..16),
            local_ca_guid: read_u64(d, 16..24),
            local_qkey: read_u32(d, 28..32),
            local_qpn: read_u24(d, 32..35),
            responder_resources: d[35],
            local_eecn: read_u24(d, 36..39),
            initiator_depth: d[39],
            remote_eecn: read_u24(d, 40..43),
            remote_cm_response_timeout: bits(d[43], 0, 5),
            transport_type: TransportType::from(bits(d[43], 5, 2)),
            end_to_end_flow_control: bits(d[43], 7, 1) != 0,
            starting_psn: read_u24(d, 44..47),
            local_cm_response_timeout: bits(d[47], 0, 5),
            retry_count: bits(d[47], 5, 3),
            pkey: read_u16(d, 48..50),
            path_mtu_code: bits(d[50], 0, 4),
            rdc_exists: bits(d[50], 4, 1) != 0,
            rnr_retry_count: bits(d[50], 5, 3),
            max_cm_retries: bits(d[51], 0, 4),
            srq: bits(d[51], 4, 1) != 0,
            extended_transport_type: bits(d[51], 5, 3),
            primary_path: Path::parse(&d[52..96]),
            alternate_path: Path::parse(&d[96..140]),
            sap_supported: bits(d[139], 5, 1) != 0,
            private_data: read_array(d, 140..232),
        })
    }

    /// Writes the REQ into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        check_out(data)?;
        let d = &mut data[..DATA_LEN];
        d.fill(0);
        write_u32(d, 0..4, self.local_comm_id);
        write_u64(d, 8..16, self.service_id);
        write_u64(d, 16..24, self.local_ca_guid);
        write_u32(d, 28..32, self.local_qkey);
        write_u24(d, 32..35, self.local_qpn);
        d[35] = self.responder_resources;
        write_u24(d, 36..39, self.local_eecn);
        d[39] = self.initiator_depth;
        write_u24(d, 40..43, self.remote_eecn);
        put_bits(&mut d[43], 0, 5, self.remote_cm_response_timeout);
        put_bits(&mut d[43], 5, 2, self.transport_type.into());
        put_bits(&mut d[43], 7, 1, self.end_to_end_flow_control as u8);
        write_u24(d, 44..47, self.starting_psn);
        put_bits(&mut d[47], 0, 5, self.local_cm_response_timeout);
        put_bits(&mut d[47], 5, 3, self.retry_count);
        write_u16(d, 48..50, self.pkey);
        put_bits(&mut d[50], 0, 4, self.path_mtu_code);
        put_bits(&mut d[50], 4, 1, self.rdc_exists as u8);
        put_bits(&mut d[50], 5, 3, self.rnr_retry_count);
        put_bits(&mut d[51], 0, 4, self.max_cm_retries);
        put_bits(&mut d[51], 4, 1, self.srq as u8);
        put_bits(&mut d[51], 5, 3, self.extended_transport_type);
        self.primary_path.emit(&mut d[52..96]);
        self.alternate_path.emit(&mut d[96..140]);
        put_bits(&mut d[139], 5, 1, self.sap_supported as u8);
        write_array(d, 140..232, self.private_data);
        Ok(())
    }
}

/// MsgRcptAck (MRA, IBTA vol. 1 §12.6.6, table 107): "your message arrived; my answer takes up to
/// `service_timeout`".
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mra {
    /// The sender's Communication ID.
    pub local_comm_id: u32,
    /// The receiver's Communication ID.
    pub remote_comm_id: u32,
    /// Which message is acknowledged.
    pub message_mraed: MsgKind,
    /// How much longer the answer takes (5 bits; 4.096 µs · 2^value).
    pub service_timeout: u8,
    /// Consumer private data.
    pub private_data: [u8; MRA_PRIVATE_DATA_LEN],
}

impl Mra {
    /// Parses an MRA from the 232 bytes of MAD class data.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes.
    pub fn parse(data: &[u8]) -> Result<Mra> {
        check(data)?;
        Ok(Mra {
            local_comm_id: read_u32(data, 0..4),
            remote_comm_id: read_u32(data, 4..8),
            message_mraed: MsgKind::from(bits(data[8], 0, 2)),
            service_timeout: bits(data[9], 0, 5),
            private_data: read_array(data, 10..232),
        })
    }

    /// Writes the MRA into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        check_out(data)?;
        let d = &mut data[..DATA_LEN];
        d.fill(0);
        write_u32(d, 0..4, self.local_comm_id);
        write_u32(d, 4..8, self.remote_comm_id);
        put_bits(&mut d[8], 0, 2, self.message_mraed.into());
        put_bits(&mut d[9], 0, 5, self.service_timeout);
        write_array(d, 10..232, self.private_data);
        Ok(())
    }
}

/// ConnectReject (REJ, IBTA vol. 1 §12.6.7, table 108).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rej {
    /// The sender's Communication ID (0 if it never assigned one).
    pub local_comm_id: u32,
    /// The receiver's Communication ID.
    pub remote_comm_id: u32,
    /// Which message is rejected.
    pub message_rejected: MsgKind,
    /// Valid bytes of [`Rej::ari`] (0..=72).
    pub ari_len: u8,
    /// Why.
    pub reason: RejReason,
    /// Additional Rejection Information (its meaning depends on the reason, table 109).
    pub ari: [u8; REJ_ARI_LEN],
    /// Consumer private data (`rdma_reject`'s).
    pub private_data: [u8; REJ_PRIVATE_DATA_LEN],
}

impl Rej {
    /// Parses a REJ from the 232 bytes of MAD class data.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes;
    /// [`Error::Malformed`] if the Rejected Info Length exceeds 72.
    pub fn parse(data: &[u8]) -> Result<Rej> {
        check(data)?;
        let ari_len = bits(data[9], 0, 7);
        if usize::from(ari_len) > REJ_ARI_LEN {
            return Err(Error::Malformed {
                layer: Layer::Cm,
                what: "REJ Rejected Info Length above 72",
            });
        }
        Ok(Rej {
            local_comm_id: read_u32(data, 0..4),
            remote_comm_id: read_u32(data, 4..8),
            message_rejected: MsgKind::from(bits(data[8], 0, 2)),
            ari_len,
            reason: RejReason::from(read_u16(data, 10..12)),
            ari: read_array(data, 12..84),
            private_data: read_array(data, 84..232),
        })
    }

    /// The valid part of the Additional Rejection Information.
    pub fn ari(&self) -> &[u8] {
        &self.ari[..usize::from(self.ari_len).min(REJ_ARI_LEN)]
    }

    /// Writes the REJ into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes; [`Error::Malformed`] if
    /// [`Rej::ari_len`] exceeds 72.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        check_out(data)?;
        if usize::from(self.ari_len) > REJ_ARI_LEN {
            return Err(Error::Malformed {
                layer: Layer::Cm,
                what: "REJ Rejected Info Length above 72",
            });
        }
        let d = &mut data[..DATA_LEN];
        d.fill(0);
        write_u32(d, 0..4, self.local_comm_id);
        write_u32(d, 4..8, self.remote_comm_id);
        put_bits(&mut d[8], 0, 2, self.message_rejected.into());
        put_bits(&mut d[9], 0, 7, self.ari_len);
        write_u16(d, 10..12, self.reason.into());
        write_array(d, 12..84, self.ari);
        write_array(d, 84..232, self.private_data);
        Ok(())
    }
}

/// ConnectReply (REP, IBTA vol. 1 §12.6.8, table 110).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Rep {
    /// The sender's Communication ID.
    pub local_comm_id: u32,
    /// The receiver's Communication ID (the REQ's local one).
    pub remote_comm_id: u32,
    /// The sender QP's Q_Key (RD only).
    pub local_qkey: u32,
    /// The sender's QPN (24 bits).
    pub local_qpn: u32,
    /// The sender's EE context (24 bits; RD only).
    pub local_eecn: u32,
    /// The sender's starting PSN (24 bits).
    pub starting_psn: u32,
    /// RDMA READ / atomic requests the sender accepts at once.
    pub responder_resources: u8,
    /// RDMA READ / atomic requests the sender issues at once.
    pub initiator_depth: u8,
    /// Target ACK delay (5 bits).
    pub target_ack_delay: u8,
    /// Failover accepted (2 bits: 0 accepted, 1 not supported, 2 rejected).
    pub failover_accepted: u8,
    /// End-to-end flow control.
    pub end_to_end_flow_control: bool,
    /// RNR NAK retry count (3 bits).
    pub rnr_retry_count: u8,
    /// The sender uses an SRQ.
    pub srq: bool,
    /// The sender's CA GUID.
    pub local_ca_guid: u64,
    /// Consumer private data.
    pub private_data: [u8; REP_PRIVATE_DATA_LEN],
}

impl Rep {
    /// Parses a REP from the 232 bytes of MAD class data.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes.
    pub fn parse(data: &[u8]) -> Result<Rep> {
        check(data)?;
        let d = data;
        Ok(Rep {
            local_comm_id: read_u32(d, 0..4),
            remote_comm_id: read_u32(d, 4..8),
            local_qkey: read_u32(d, 8..12),
            local_qpn: read_u24(d, 12..15),
            local_eecn: read_u24(d, 16..19),
            starting_psn: read_u24(d, 20..23),
            responder_resources: d[24],
            initiator_depth: d[25],
            target_ack_delay: bits(d[26], 0, 5),
            failover_accepted: bits(d[26], 5, 2),
            end_to_end_flow_control: bits(d[26], 7, 1) != 0,
            rnr_retry_count: bits(d[27], 0, 3),
            srq: bits(d[27], 3, 1) != 0,
            local_ca_guid: read_u64(d, 28..36),
            private_data: read_array(d, 36..232),
        })
    }

    /// Writes the REP into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        check_out(data)?;
        let d = &mut data[..DATA_LEN];
        d.fill(0);
        write_u32(d, 0..4, self.local_comm_id);
        write_u32(d, 4..8, self.remote_comm_id);
        write_u32(d, 8..12, self.local_qkey);
        write_u24(d, 12..15, self.local_qpn);
        write_u24(d, 16..19, self.local_eecn);
        write_u24(d, 20..23, self.starting_psn);
        d[24] = self.responder_resources;
        d[25] = self.initiator_depth;
        put_bits(&mut d[26], 0, 5, self.target_ack_delay);
        put_bits(&mut d[26], 5, 2, self.failover_accepted);
        put_bits(&mut d[26], 7, 1, self.end_to_end_flow_control as u8);
        put_bits(&mut d[27], 0, 3, self.rnr_retry_count);
        put_bits(&mut d[27], 3, 1, self.srq as u8);
        write_u64(d, 28..36, self.local_ca_guid);
        write_array(d, 36..232, self.private_data);
        Ok(())
    }
}

/// The shape shared by RTU (table 111) and DREP (table 113): two Communication IDs and 224 bytes
/// of private data.
macro_rules! ids_and_private_data {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name {
            /// The sender's Communication ID.
            pub local_comm_id: u32,
            /// The receiver's Communication ID.
            pub remote_comm_id: u32,
            /// Consumer private data.
            pub private_data: [u8; $len],
        }

        impl $name {
            /// Parses the message from the 232 bytes of MAD class data.
            ///
            /// # Errors
            /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes.
            pub fn parse(data: &[u8]) -> Result<$name> {
                check(data)?;
                Ok($name {
                    local_comm_id: read_u32(data, 0..4),
                    remote_comm_id: read_u32(data, 4..8),
                    private_data: read_array(data, 8..232),
                })
            }

            /// Writes the message into the first 232 bytes of `data`.
            ///
            /// # Errors
            /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes.
            pub fn emit(&self, data: &mut [u8]) -> Result<()> {
                check_out(data)?;
                let d = &mut data[..DATA_LEN];
                write_u32(d, 0..4, self.local_comm_id);
                write_u32(d, 4..8, self.remote_comm_id);
                write_array(d, 8..232, self.private_data);
                Ok(())
            }
        }
    };
}

ids_and_private_data!(
    /// ReadyToUse (RTU, IBTA vol. 1 §12.6.9, table 111): the active side is ready; the passive side
    /// moves its QP to RTS.
    Rtu,
    RTU_PRIVATE_DATA_LEN
);
ids_and_private_data!(
    /// DisconnectReply (DREP, IBTA vol. 1 §12.6.11, table 113).
    Drep,
    DREP_PRIVATE_DATA_LEN
);

/// DisconnectRequest (DREQ, IBTA vol. 1 §12.6.10, table 112).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dreq {
    /// The sender's Communication ID.
    pub local_comm_id: u32,
    /// The receiver's Communication ID.
    pub remote_comm_id: u32,
    /// The receiver's QPN (24 bits), which the receiver checks against the connection.
    pub remote_qpn: u32,
    /// Consumer private data.
    pub private_data: [u8; DREQ_PRIVATE_DATA_LEN],
}

impl Dreq {
    /// Parses a DREQ from the 232 bytes of MAD class data.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes.
    pub fn parse(data: &[u8]) -> Result<Dreq> {
        check(data)?;
        Ok(Dreq {
            local_comm_id: read_u32(data, 0..4),
            remote_comm_id: read_u32(data, 4..8),
            remote_qpn: read_u24(data, 8..11),
            private_data: read_array(data, 12..232),
        })
    }

    /// Writes the DREQ into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        check_out(data)?;
        let d = &mut data[..DATA_LEN];
        write_u32(d, 0..4, self.local_comm_id);
        write_u32(d, 4..8, self.remote_comm_id);
        write_u24(d, 8..11, self.remote_qpn);
        d[11] = 0;
        write_array(d, 12..232, self.private_data);
        Ok(())
    }
}

/// ServiceIDResReq (SIDR_REQ, IBTA vol. 1 §12.11.1, table 119): asks which UD QP serves a service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrReq {
    /// The requester's ID for this request.
    pub request_id: u32,
    /// Partition key.
    pub pkey: u16,
    /// The service asked for.
    pub service_id: u64,
    /// Consumer private data (RDMA CM's `cma_hdr` first).
    pub private_data: [u8; SIDR_REQ_PRIVATE_DATA_LEN],
}

impl SidrReq {
    /// Parses a SIDR_REQ from the 232 bytes of MAD class data.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes.
    pub fn parse(data: &[u8]) -> Result<SidrReq> {
        check(data)?;
        Ok(SidrReq {
            request_id: read_u32(data, 0..4),
            pkey: read_u16(data, 4..6),
            service_id: read_u64(data, 8..16),
            private_data: read_array(data, 16..232),
        })
    }

    /// Writes the SIDR_REQ into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        check_out(data)?;
        let d = &mut data[..DATA_LEN];
        write_u32(d, 0..4, self.request_id);
        write_u16(d, 4..6, self.pkey);
        write_u16(d, 6..8, 0);
        write_u64(d, 8..16, self.service_id);
        write_array(d, 16..232, self.private_data);
        Ok(())
    }
}

/// ServiceIDResReqResp (SIDR_REP, IBTA vol. 1 §12.11.2, table 120).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SidrRep {
    /// The SIDR_REQ's request ID.
    pub request_id: u32,
    /// Outcome.
    pub status: SidrStatus,
    /// Valid bytes of [`SidrRep::info`] (0..=72).
    pub info_len: u8,
    /// The serving UD QP's QPN (24 bits).
    pub qpn: u32,
    /// The service ID.
    pub service_id: u64,
    /// The serving QP's Q_Key.
    pub qkey: u32,
    /// Additional information (a ClassPortInfo on redirect).
    pub info: [u8; SIDR_REP_INFO_LEN],
    /// Consumer private data.
    pub private_data: [u8; SIDR_REP_PRIVATE_DATA_LEN],
}

impl SidrRep {
    /// Parses a SIDR_REP from the 232 bytes of MAD class data.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 232 bytes;
    /// [`Error::Malformed`] if the Additional Information Length exceeds 72.
    pub fn parse(data: &[u8]) -> Result<SidrRep> {
        check(data)?;
        let info_len = data[5];
        if usize::from(info_len) > SIDR_REP_INFO_LEN {
            return Err(Error::Malformed {
                layer: Layer::Cm,
                what: "SIDR_REP Additional Information Length above 72",
            });
        }
        Ok(SidrRep {
            request_id: read_u32(data, 0..4),
            status: SidrStatus::from(data[4]),
            info_len,
            qpn: read_u24(data, 8..11),
            service_id: read_u64(data, 12..20),
            qkey: read_u32(data, 20..24),
            info: read_array(data, 24..96),
            private_data: read_array(data, 96..232),
        })
    }

    /// Writes the SIDR_REP into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes; [`Error::Malformed`] if
    /// [`SidrRep::info_len`] exceeds 72.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        check_out(data)?;
        if usize::from(self.info_len) > SIDR_REP_INFO_LEN {
            return Err(Error::Malformed {
                layer: Layer::Cm,
                what: "SIDR_REP Additional Information Length above 72",
            });
        }
        let d = &mut data[..DATA_LEN];
        d.fill(0);
        write_u32(d, 0..4, self.request_id);
        d[4] = self.status.into();
        d[5] = self.info_len;
        write_u24(d, 8..11, self.qpn);
        write_u64(d, 12..20, self.service_id);
        write_u32(d, 20..24, self.qkey);
        write_array(d, 24..96, self.info);
        write_array(d, 96..232, self.private_data);
        Ok(())
    }
}

/// One CM message of any supported kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(clippy::large_enum_variant)]
pub enum Message {
    /// ConnectRequest.
    Req(Req),
    /// MsgRcptAck.
    Mra(Mra),
    /// ConnectReject.
    Rej(Rej),
    /// ConnectReply.
    Rep(Rep),
    /// ReadyToUse.
    Rtu(Rtu),
    /// DisconnectRequest.
    Dreq(Dreq),
    /// DisconnectReply.
    Drep(Drep),
    /// ServiceIDResReq.
    SidrReq(SidrReq),
    /// ServiceIDResReqResp.
    SidrRep(SidrRep),
}

impl Message {
    /// The AttributeID that carries this message.
    pub fn attr_id(&self) -> AttrId {
        match self {
            Message::Req(_) => AttrId::Req,
            Message::Mra(_) => AttrId::Mra,
            Message::Rej(_) => AttrId::Rej,
            Message::Rep(_) => AttrId::Rep,
            Message::Rtu(_) => AttrId::Rtu,
            Message::Dreq(_) => AttrId::Dreq,
            Message::Drep(_) => AttrId::Drep,
            Message::SidrReq(_) => AttrId::SidrReq,
            Message::SidrRep(_) => AttrId::SidrRep,
        }
    }

    /// Parses the class data `data` (232 bytes) of a CM MAD whose AttributeID is `attr_id`.
    ///
    /// # Errors
    /// [`Error::Truncated`] if `data` is short; [`Error::Malformed`] for LAP, APR, ClassPortInfo or
    /// an unknown AttributeID, and for the length fields the message checks.
    pub fn parse(attr_id: AttrId, data: &[u8]) -> Result<Message> {
        Ok(match attr_id {
            AttrId::Req => Message::Req(Req::parse(data)?),
            AttrId::Mra => Message::Mra(Mra::parse(data)?),
            AttrId::Rej => Message::Rej(Rej::parse(data)?),
            AttrId::Rep => Message::Rep(Rep::parse(data)?),
            AttrId::Rtu => Message::Rtu(Rtu::parse(data)?),
            AttrId::Dreq => Message::Dreq(Dreq::parse(data)?),
            AttrId::Drep => Message::Drep(Drep::parse(data)?),
            AttrId::SidrReq => Message::SidrReq(SidrReq::parse(data)?),
            AttrId::SidrRep => Message::SidrRep(SidrRep::parse(data)?),
            AttrId::Lap | AttrId::Apr => {
                return Err(Error::Malformed {
                    layer: Layer::Cm,
                    what: "LAP/APR (alternate path migration) is not supported",
                })
            }
            AttrId::ClassPortInfo | AttrId::Unknown(_) => {
                return Err(Error::Malformed {
                    layer: Layer::Cm,
                    what: "not a CM message attribute",
                })
            }
        })
    }

    /// Writes the message's class data into the first 232 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 232 bytes; [`Error::Malformed`] for a
    /// length field above its maximum (REJ, SIDR_REP).
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        match self {
            Message::Req(m) => m.emit(data),
            Message::Mra(m) => m.emit(data),
            Message::Rej(m) => m.emit(data),
            Message::Rep(m) => m.emit(data),
            Message::Rtu(m) => m.emit(data),
            Message::Dreq(m) => m.emit(data),
            Message::Drep(m) => m.emit(data),
            Message::SidrReq(m) => m.emit(data),
            Message::SidrRep(m) => m.emit(data),
        }
    }

    /// The MAD header a CM sends this message with: base version 1, class 0x07, class version 2,
    /// method Send, status 0, the given TID.
    pub fn mad_header(&self, tid: u64) -> mad::Repr {
        mad::Repr {
            base_version: mad::BASE_VERSION,
            mgmt_class: MgmtClass::CommMgmt,
            class_version: CLASS_VERSION,
            method: Method::Send,
            status: Status::Ok,
            class_specific: 0,
            tid,
            attr_id: self.attr_id().into(),
            attr_mod: 0,
        }
    }

    /// Writes the whole 256-byte MAD (header from [`Message::mad_header`], then the message) into
    /// `mad` and returns its length, [`mad::MAD_LEN`].
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `mad` is shorter than 256 bytes; the errors of [`Message::emit`].
    pub fn emit_mad(&self, tid: u64, mad: &mut [u8]) -> Result<usize> {
        if mad.len() < mad::MAD_LEN {
            return Err(Error::BufferTooSmall {
                need: mad::MAD_LEN,
                got: mad.len(),
            });
        }
        let mut packet = mad::Packet::new_unchecked(&mut mad[..mad::MAD_LEN]);
        self.mad_header(tid).emit(&mut packet);
        self.emit(packet.data_mut())?;
        Ok(mad::MAD_LEN)
    }

    /// Parses a whole received 256-byte CM MAD: its header must say base version 1, class 0x07,
    /// class version 2 and method Send (IBTA vol. 1 §12.6: every CM message is a Send).
    ///
    /// # Errors
    /// The errors of [`mad::Repr::parse_mad`]; [`Error::BadVersion`] (layer `Mad`) for a base
    /// version other than 1 or a class version other than 2; [`Error::Malformed`] for another
    /// class or method, and the errors of [`Message::parse`].
    pub fn parse_mad(mad: &[u8]) -> Result<(mad::Repr, Message)> {
        let header = mad::Repr::parse_mad(mad)?;
        if header.mgmt_class != MgmtClass::CommMgmt {
            return Err(Error::Malformed {
                layer: Layer::Mad,
                what: "not the CM class",
            });
        }
        if header.base_version != mad::BASE_VERSION {
            return Err(Error::BadVersion {
                layer: Layer::Mad,
                version: header.base_version,
            });
        }
        if header.class_version != CLASS_VERSION {
            return Err(Error::BadVersion {
                layer: Layer::Mad,
                version: header.class_version,
            });
        }
        if header.method != Method::Send {
            return Err(Error::Malformed {
                layer: Layer::Mad,
                what: "CM messages use method Send",
            });
        }
        let message = Message::parse(AttrId::from(header.attr_id), &mad[mad::HEADER_LEN..])?;
        Ok((header, message))
    }
}

/// The RDMA CM port spaces (Linux `enum rdma_ucm_port_space`, `include/uapi/rdma/rdma_user_cm.h`).
pub mod port_space {
    /// `RDMA_PS_IPOIB`.
    pub const IPOIB: u16 = 0x0002;
    /// `RDMA_PS_IB`.
    pub const IB: u16 = 0x013F;
    /// `RDMA_PS_TCP`: reliable connected (RC) services.
    pub const TCP: u16 = 0x0106;
    /// `RDMA_PS_UDP`: unreliable datagram (UD) services, resolved with SIDR.
    pub const UDP: u16 = 0x0111;
}

/// The IB service ID of an RDMA CM port (Linux `cma.c`, `rdma_get_service_id`):
/// `(port_space << 16) | port`, e.g. `0x0000_0000_0106_4A69` for TCP port 19049. The port spaces
/// carry the IBTA Annex A11 "IP addressing" prefix 0x01 in their high byte and the IP protocol
/// (0x06 TCP, 0x11 UDP) in the low one.
pub const fn service_id(port_space: u16, port: u16) -> u64 {
    ((port_space as u64) << 16) | port as u64
}

/// The RDMA CM addressing header (Linux `cma.c` `struct cma_hdr`) that the active side puts at the
/// start of a REQ's (and SIDR_REQ's) private data, so that an IP-addressed listener can match the
/// connection to its bound address (IBTA Annex A11, "RDMA IP CM Service"):
///
/// ```text
///  0         1          2        4                  20                 36
/// +---------+----------+--------+------------------+------------------+
/// | version | IPVer<<4 | sport  | source address   | dest. address    |
/// +---------+----------+--------+------------------+------------------+
/// ```
///
/// The version is [`CmaHdr::VERSION`] (0); IPVer is 4 or 6 in the high nibble; an IPv4 address
/// sits in the last 4 of its 16 bytes, the first 12 zero. The consumer's own private data follows
/// (at most [`CmaHdr::REQ_USER_DATA_LEN`] = 56 bytes in a REQ).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CmaHdr {
    /// The active side's source port.
    pub src_port: u16,
    /// The active side's address.
    pub src_addr: core::net::IpAddr,
    /// The address the active side connects to.
    pub dst_addr: core::net::IpAddr,
}

impl CmaHdr {
    /// Length of the header in bytes.
    pub const LEN: usize = 36;
    /// `CMA_VERSION`.
    pub const VERSION: u8 = 0;
    /// Private data bytes left to the consumer in a REQ (92 - 36; `rdma_connect`'s limit).
    pub const REQ_USER_DATA_LEN: usize = REQ_PRIVATE_DATA_LEN - CmaHdr::LEN;

    /// Parses the header at the start of `data`.
    ///
    /// # Errors
    /// [`Error::Truncated`] (layer `Cm`) if `data` is shorter than 36 bytes; [`Error::BadVersion`]
    /// for a CMA version other than 0; [`Error::Malformed`] for an IP version other than 4 or 6.
    pub fn parse(data: &[u8]) -> Result<CmaHdr> {
        check_len(Layer::Cm, CmaHdr::LEN, data.len())?;
        if data[0] != CmaHdr::VERSION {
            return Err(Error::BadVersion {
                layer: Layer::Cm,
                version: data[0],
            });
        }
        let addr = |range: core::ops::Range<usize>, v6: bool| -> core::net::IpAddr {
            let b: [u8; 16] = read_array(data, range);
            if v6 {
                core::net::Ipv6Addr::from(b).into()
            } else {
                core::net::Ipv4Addr::new(b[12], b[13], b[14], b[15]).into()
            }
        };
        let v6 = match data[1] >> 4 {
            4 => false,
            6 => true,
            _ => {
                return Err(Error::Malformed {
                    layer: Layer::Cm,
                    what: "cma_hdr IP version is neither 4 nor 6",
                })
            }
        };
        Ok(CmaHdr {
            src_port: read_u16(data, 2..4),
            src_addr: addr(4..20, v6),
            dst_addr: addr(20..36, v6),
        })
    }

    /// Writes the header into the first 36 bytes of `data`.
    ///
    /// # Errors
    /// [`Error::BufferTooSmall`] if `data` is shorter than 36 bytes; [`Error::Malformed`] if the
    /// two addresses are of different families.
    pub fn emit(&self, data: &mut [u8]) -> Result<()> {
        if data.len() < CmaHdr::LEN {
            return Err(Error::BufferTooSmall {
                need: CmaHdr::LEN,
                got: data.len(),
            });
        }
        let bytes = |a: core::net::IpAddr| -> [u8; 16] {
            match a {
                core::net::IpAddr::V4(v4) => {
                    let mut b = [0u8; 16];
                    b[12..].copy_from_slice(&v4.octets());
                    b
                }
                core::net::IpAddr::V6(v6) => v6.octets(),
            }
        };
        let version = match (self.src_addr, self.dst_addr) {
            (core::net::IpAddr::V4(_), core::net::IpAddr::V4(_)) => 4,
            (core::net::IpAddr::V6(_), core::net::IpAddr::V6(_)) => 6,
            _ => {
                return Err(Error::Malformed {
                    layer: Layer::Cm,
                    what: "cma_hdr addresses of different families",
                })
            }
        };
        data[0] = CmaHdr::VERSION;
        data[1] = version << 4;
        write_u16(data, 2..4, self.src_port);
        write_array(data, 4..20, bytes(self.src_addr));
        write_array(data, 20..36, bytes(self.dst_addr));
        Ok(())
    }
}

#[cfg(test)]
mod test;

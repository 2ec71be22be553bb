//! Management datagrams (MADs, IBTA vol. 1 §13.4) as the General Services Interface (GSI, QP1)
//! carries them.
//!
//! A MAD is always 256 bytes: a 24-byte common header followed by 232 bytes of class data. Over
//! RoCEv2 it travels as the payload of a UD SEND ONLY to destination QP 1 with Q_Key
//! [`GSI_QKEY`] (0x80010000) and P_Key [`DEFAULT_PKEY`] (0xFFFF), as Linux rxe sends it.
//!
//! ```text
//!  0          1          2              3
//! +----------+----------+--------------+----------+
//! | BaseVer  | MgmtClass| ClassVersion |R| Method |
//! +----------+----------+--------------+----------+
//! |        Status       |     ClassSpecific       |
//! +---------------------+-------------------------+
//! |              TransactionID (64)               |
//! +---------------------+-------------------------+
//! |     AttributeID     |        Reserved         |
//! +---------------------+-------------------------+
//! |              AttributeModifier (32)           |
//! +-----------------------------------------------+
//! |              class data (232 bytes)           |
//! ```
//!
//! The status field (§13.4.7, table 112) carries a busy bit, a redirect bit and a 3-bit
//! "invalid field" code in bits 2..5; [`Status`] names the codes the GSI answers with.

use crate::error::check_len;
use crate::wire_field::{read_u16, read_u32, read_u64, write_u16, write_u32, write_u64};
use crate::{Error, Layer, Result};

mod field {
    use core::ops::Range;
    pub const BASE_VERSION: usize = 0;
    pub const MGMT_CLASS: usize = 1;
    pub const CLASS_VERSION: usize = 2;
    pub const METHOD: usize = 3;
    pub const STATUS: Range<usize> = 4..6;
    pub const CLASS_SPECIFIC: Range<usize> = 6..8;
    pub const TID: Range<usize> = 8..16;
    pub const ATTR_ID: Range<usize> = 16..18;
    pub const RESERVED: Range<usize> = 18..20;
    pub const ATTR_MOD: Range<usize> = 20..24;
}

/// Length of the common MAD header in bytes (IBTA vol. 1 §13.4.2).
pub const HEADER_LEN: usize = field::ATTR_MOD.end;
/// Length of every MAD in bytes (IBTA vol. 1 §13.4.1: "MADs are 256 bytes").
pub const MAD_LEN: usize = 256;
/// Length of the class data after the common header: 232 bytes.
pub const DATA_LEN: usize = MAD_LEN - HEADER_LEN;
/// The only MAD base version IBTA 1.x defines (§13.4.2).
pub const BASE_VERSION: u8 = 1;
/// QP number of the General Services Interface (IBTA vol. 1 §3.5.1.2: QP1 is the GSI).
pub const GSI_QPN: u32 = 1;
/// The well-known Q_Key of QP1 (IBTA vol. 1 §10.2.4.1, "0x80010000").
pub const GSI_QKEY: u32 = 0x8001_0000;
/// The default full-membership P_Key, which RoCE uses for every packet (Annex A17.4).
pub const DEFAULT_PKEY: u16 = 0xFFFF;
/// The response bit of the method field (IBTA vol. 1 §13.4.5).
pub const METHOD_RESPONSE_BIT: u8 = 0x80;

enum_with_unknown! {
    /// Management class (IBTA vol. 1 §13.4.4, table 105).
    pub enum MgmtClass(u8) {
        /// Subnet management, LID-routed (QP0 only).
        SubnLid = 0x01,
        /// Subnet administration.
        SubnAdm = 0x03,
        /// Performance management.
        PerfMgmt = 0x04,
        /// Baseboard management.
        BoardMgmt = 0x05,
        /// Device management.
        DevMgmt = 0x06,
        /// Communication management (IBTA vol. 1 chapter 12): the CM protocol.
        CommMgmt = 0x07,
        /// SNMP tunneling.
        SnmpTunnel = 0x08,
        /// Subnet management, directed route (QP0 only).
        SubnDirected = 0x81,
    }
}

enum_with_unknown! {
    /// Method (IBTA vol. 1 §13.4.5, table 107); bit 7 is the response bit.
    pub enum Method(u8) {
        /// Get: request an attribute.
        Get = 0x01,
        /// Set: write an attribute.
        Set = 0x02,
        /// Send: a datagram that needs no response (the CM messages, §12.6).
        Send = 0x03,
        /// Trap: an unsolicited notice.
        Trap = 0x05,
        /// Report: forward a subscribed event.
        Report = 0x06,
        /// TrapRepress: stop sending a trap.
        TrapRepress = 0x07,
        /// GetResp: the response to Get and Set.
        GetResp = 0x81,
        /// ReportResp: the response to Report.
        ReportResp = 0x86,
    }
}

impl Method {
    /// Whether the response bit is set (IBTA vol. 1 §13.4.5) or the method is TrapRepress, which
    /// also answers a request: such MADs are never themselves answered (Linux `ib_response_mad`).
    pub fn is_response(self) -> bool {
        u8::from(self) & METHOD_RESPONSE_BIT != 0 || self == Method::TrapRepress
    }
}

enum_with_unknown! {
    /// The MAD status field (IBTA vol. 1 §13.4.7, table 112), as the 16-bit value on the wire.
    pub enum Status(u16) {
        /// Success.
        Ok = 0x0000,
        /// Busy: the request was discarded, try again later.
        Busy = 0x0001,
        /// Redirect: use the ClassPortInfo's redirect address.
        Redirect = 0x0002,
        /// Invalid field code 1: bad base or class version.
        BadVersion = 0x0004,
        /// Invalid field code 2: the method is not supported.
        UnsupportedMethod = 0x0008,
        /// Invalid field code 3: the method/attribute combination is not supported.
        UnsupportedMethodAttr = 0x000C,
        /// Invalid field code 7: one or more attribute fields hold invalid values.
        InvalidAttrValue = 0x001C,
    }
}

/// A zero-copy view of a MAD's common header (IBTA vol. 1 §13.4.2) at the start of `buffer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checking its length; getters and setters panic if it is shorter than
    /// [`HEADER_LEN`] (24 bytes). Use [`Packet::new_checked`] for untrusted input.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    ///
    /// # Errors
    /// [`Error::Truncated`] with `layer: Mad` if `buffer` is shorter than 24 bytes.
    pub fn new_checked(buffer: T) -> Result<Packet<T>> {
        let packet = Packet::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks that the buffer holds a whole common header (24 bytes). A GSI receiver also requires
    /// the whole [`MAD_LEN`] (256 bytes); [`Packet::data`] gives what follows the header.
    ///
    /// # Errors
    /// [`Error::Truncated`] with `layer: Mad` if it does not.
    pub fn check_len(&self) -> Result<()> {
        check_len(Layer::Mad, HEADER_LEN, self.buffer.as_ref().len())
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// BaseVersion (1 for every IBTA 1.x MAD).
    pub fn base_version(&self) -> u8 {
        self.buffer.as_ref()[field::BASE_VERSION]
    }

    /// MgmtClass.
    pub fn mgmt_class(&self) -> MgmtClass {
        MgmtClass::from(self.buffer.as_ref()[field::MGMT_CLASS])
    }

    /// ClassVersion (2 for the CM class).
    pub fn class_version(&self) -> u8 {
        self.buffer.as_ref()[field::CLASS_VERSION]
    }

    /// Method, response bit included.
    pub fn method(&self) -> Method {
        Method::from(self.buffer.as_ref()[field::METHOD])
    }

    /// Status (meaningful in responses).
    pub fn status(&self) -> Status {
        Status::from(read_u16(self.buffer.as_ref(), field::STATUS))
    }

    /// ClassSpecific (16 bits; 0 for the CM class).
    pub fn class_specific(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CLASS_SPECIFIC)
    }

    /// TransactionID (64 bits), chosen by the requester and echoed in the response.
    pub fn tid(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::TID)
    }

    /// AttributeID (for the CM class: which message, [`crate::cm::AttrId`]).
    pub fn attr_id(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::ATTR_ID)
    }

    /// AttributeModifier (32 bits).
    pub fn attr_mod(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::ATTR_MOD)
    }

    /// The bytes after the common header (232 in a whole MAD).
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`].
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets BaseVersion.
    pub fn set_base_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::BASE_VERSION] = value;
    }

    /// Sets MgmtClass.
    pub fn set_mgmt_class(&mut self, value: MgmtClass) {
        self.buffer.as_mut()[field::MGMT_CLASS] = value.into();
    }

    /// Sets ClassVersion.
    pub fn set_class_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::CLASS_VERSION] = value;
    }

    /// Sets Method.
    pub fn set_method(&mut self, value: Method) {
        self.buffer.as_mut()[field::METHOD] = value.into();
    }

    /// Sets Status.
    pub fn set_status(&mut self, value: Status) {
        write_u16(self.buffer.as_mut(), field::STATUS, value.into());
    }

    /// Sets ClassSpecific.
    pub fn set_class_specific(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CLASS_SPECIFIC, value);
    }

    /// Sets TransactionID.
    pub fn set_tid(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::TID, value);
    }

    /// Sets AttributeID.
    pub fn set_attr_id(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::ATTR_ID, value);
    }

    /// Sets the reserved 16 bits after AttributeID (senders write 0).
    pub fn set_reserved(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::RESERVED, value);
    }

    /// Sets AttributeModifier.
    pub fn set_attr_mod(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::ATTR_MOD, value);
    }

    /// The bytes after the common header, writable.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`].
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// A parsed common MAD header (IBTA vol. 1 §13.4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repr {
    /// BaseVersion; only [`BASE_VERSION`] (1) is defined.
    pub base_version: u8,
    /// MgmtClass.
    pub mgmt_class: MgmtClass,
    /// ClassVersion.
    pub class_version: u8,
    /// Method.
    pub method: Method,
    /// Status.
    pub status: Status,
    /// ClassSpecific.
    pub class_specific: u16,
    /// TransactionID.
    pub tid: u64,
    /// AttributeID.
    pub attr_id: u16,
    /// AttributeModifier.
    pub attr_mod: u32,
}

impl Repr {
    /// Parses the common header; the reserved field is ignored. Versions are not judged here: a GSI
    /// answers a bad version with [`Status::BadVersion`] ([`Repr::error_response`]), which needs the
    /// header parsed.
    ///
    /// # Errors
    /// [`Error::Truncated`] if the buffer is shorter than 24 bytes.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr> {
        packet.check_len()?;
        Ok(Repr {
            base_version: packet.base_version(),
            mgmt_class: packet.mgmt_class(),
            class_version: packet.class_version(),
            method: packet.method(),
            status: packet.status(),
            class_specific: packet.class_specific(),
            tid: packet.tid(),
            attr_id: packet.attr_id(),
            attr_mod: packet.attr_mod(),
        })
    }

    /// Parses a whole received MAD: exactly [`MAD_LEN`] (256) bytes, as IBTA §13.4.1 requires of
    /// every GSI datagram.
    ///
    /// # Errors
    /// [`Error::Truncated`] if `mad` is shorter than 256 bytes, [`Error::BadLength`] if longer.
    pub fn parse_mad(mad: &[u8]) -> Result<Repr> {
        check_len(Layer::Mad, MAD_LEN, mad.len())?;
        if mad.len() != MAD_LEN {
            return Err(Error::BadLength(Layer::Mad));
        }
        Repr::parse(&Packet::new_unchecked(mad))
    }

    /// Length of the emitted header: always [`HEADER_LEN`] (24).
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into the first 24 bytes of `packet`, the reserved field as 0.
    ///
    /// # Panics
    /// If the buffer is shorter than [`HEADER_LEN`] (24 bytes).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_base_version(self.base_version);
        packet.set_mgmt_class(self.mgmt_class);
        packet.set_class_version(self.class_version);
        packet.set_method(self.method);
        packet.set_status(self.status);
        packet.set_class_specific(self.class_specific);
        packet.set_tid(self.tid);
        packet.set_attr_id(self.attr_id);
        packet.set_reserved(0);
        packet.set_attr_mod(self.attr_mod);
    }

    /// The header of the answer a GSI gives to a request it cannot serve with `status` (for example
    /// [`Status::BadVersion`] or [`Status::UnsupportedMethodAttr`]): a GetResp with the same class,
    /// version, TID and attribute (IBTA vol. 1 §13.4.7 and §13.5.3.2). Only Get and Set are
    /// answered, as Linux `ib_mad.c` (`generate_unmatched_resp`) does; any other method, and every
    /// response, gets `None` and is dropped.
    pub fn error_response(&self, status: Status) -> Option<Repr> {
        match self.method {
            Method::Get | Method::Set => Some(Repr {
                method: Method::GetResp,
                status,
                ..*self
            }),
            _ => None,
        }
    }
}

#[cfg(test)]
mod test {
    use super::*;
    use proptest::prelude::*;

    // Written by hand from IBTA vol. 1 §13.4.2: a CM REQ header (class 0x07, version 2, Send,
    // attribute 0x0010) with TID 0x0000_0001_2345_6789 as Linux's CM agent forms them.
    static BYTES: [u8; 24] = [
        0x01, 0x07, 0x02, 0x03, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x23, 0x45, 0x67,
        0x89, 0x00, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    const REPR: Repr = Repr {
        base_version: 1,
        mgmt_class: MgmtClass::CommMgmt,
        class_version: 2,
        method: Method::Send,
        status: Status::Ok,
        class_specific: 0,
        tid: 0x0000_0001_2345_6789,
        attr_id: 0x0010,
        attr_mod: 0,
    };

    test_parse_and_emit!(BYTES, REPR);
    test_truncated!(Layer::Mad, BYTES);
    test_arbitrary_bytes_never_panic!(0..300);

    #[test]
    fn whole_mad_length_is_enforced() {
        let mut mad = [0u8; MAD_LEN + 1];
        mad[..24].copy_from_slice(&BYTES);
        assert_eq!(Repr::parse_mad(&mad[..MAD_LEN]), Ok(REPR));
        assert_eq!(
            Repr::parse_mad(&mad[..MAD_LEN - 1]),
            Err(Error::Truncated {
                layer: Layer::Mad,
                need: MAD_LEN,
                got: MAD_LEN - 1
            })
        );
        assert_eq!(Repr::parse_mad(&mad), Err(Error::BadLength(Layer::Mad)));
        assert_eq!(
            Packet::new_checked(&mad[..MAD_LEN]).unwrap().data().len(),
            DATA_LEN
        );
    }

    #[test]
    fn status_codes_are_the_invalid_field_codes_shifted() {
        // IBTA table 112: bits 2..4 hold the code; 1 = bad version, 2 = method, 3 = method/attr.
        assert_eq!(u16::from(Status::BadVersion), 1 << 2);
        assert_eq!(u16::from(Status::UnsupportedMethod), 2 << 2);
        assert_eq!(u16::from(Status::UnsupportedMethodAttr), 3 << 2);
        assert_eq!(u16::from(Status::InvalidAttrValue), 7 << 2);
    }

    #[test]
    fn error_response_answers_get_and_set_only() {
        let get = Repr {
            method: Method::Get,
            mgmt_class: MgmtClass::PerfMgmt,
            ..REPR
        };
        let resp = get.error_response(Status::UnsupportedMethodAttr).unwrap();
        assert_eq!(resp.method, Method::GetResp);
        assert_eq!(resp.status, Status::UnsupportedMethodAttr);
        assert_eq!(
            (resp.tid, resp.attr_id, resp.mgmt_class),
            (get.tid, get.attr_id, get.mgmt_class)
        );
        let set = Repr {
            method: Method::Set,
            ..REPR
        };
        assert_eq!(
            set.error_response(Status::BadVersion).map(|r| r.method),
            Some(Method::GetResp)
        );
        for m in [
            Method::Send,
            Method::GetResp,
            Method::Trap,
            Method::TrapRepress,
            Method::Unknown(0x99),
        ] {
            assert_eq!(
                Repr { method: m, ..REPR }.error_response(Status::BadVersion),
                None,
                "{m:?}"
            );
        }
        assert!(Method::GetResp.is_response() && Method::TrapRepress.is_response());
        assert!(!Method::Get.is_response() && !Method::Send.is_response());
    }

    proptest! {
        #[test]
        fn round_trip(base_version: u8, class: u8, class_version: u8, method: u8, status: u16,
                      class_specific: u16, tid: u64, attr_id: u16, attr_mod: u32) {
            let repr = Repr {
                base_version,
                mgmt_class: class.into(),
                class_version,
                method: method.into(),
                status: status.into(),
                class_specific,
                tid,
                attr_id,
                attr_mod,
            };
            let mut buf = [0xa5u8; HEADER_LEN];
            repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
            prop_assert_eq!(&buf[18..20], &[0, 0]);
            prop_assert_eq!(Repr::parse(&Packet::new_checked(&buf[..]).unwrap()), Ok(repr));
        }
    }
}

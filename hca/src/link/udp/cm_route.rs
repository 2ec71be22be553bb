//! RDMA CM among the processes of one shared address ([`super::share`]): which process a MAD
//! for QP 1 belongs to.
//!
//! The kernel steers every datagram for QP 1 (the GSI, IBTA vol. 1 §13.5) to the first socket
//! of the reuseport group (normally slot 0's process), because the BTH names no process. The
//! process that receives one reads the CM header of the MAD (IBTA vol. 1 §12.6, the CM class
//! 0x07) and forwards the datagram over the stray path (`share::Forwarder`, [`super::share`]) to the
//! process it belongs to:
//!
//! * **REQ and SIDR_REQ** name a Service ID (MAD bytes 32..40, tables 106 and 119). A process
//!   that listens on a service ID *claims* it ([`ServiceClaim`]): it binds the abstract Unix
//!   name `soft-hca/ADDR:PORT/svc/<service id>` (exclusive: a second claim of one service ID by
//!   any process gets `AddrInUse`, which the RDMA CM reports as `EADDRINUSE`, as Linux's
//!   `rdma_listen` / `rdma_bind_addr` do for a port in use) and listens on the stream name
//!   `.../svc/<service id>/slot<N>`. The receiving process looks the owner up
//!   ([`lookup_service`]): the exclusive name first (refused: nobody listens), then the slot
//!   names in order; the kernel's `SO_PEERCRED` of the listener found (unix(7): the credentials
//!   of its listen(2)) must be the looker's own user ID, so a claim of another user (a stranger)
//!   is ignored and counted. A REQ nobody claims goes to the lowest slot whose process runs a CM
//!   ([`CmPresence`], found like a claim by [`lookup_cm`]; slot 0 when none does), whose CM
//!   answers REJ reason 8 (invalid service ID) or a SIDR_REP refusing it, as before sharing.
//! * **Every other CM message** (MRA, REJ, REP, RTU, DREQ, DREP, LAP, APR: Remote Communication
//!   ID, MAD bytes 28..32; SIDR_REP: Request ID, bytes 24..28) names the Communication ID our
//!   side chose. IBTA vol. 1 §12.6.2 leaves that choice to the sender: a CM on a shared address
//!   puts its slot in the top [`super::slots::SLOT_BITS`] bits ([`comm_id_prefix`]) and draws
//!   the other 27 from the operating system's random source, so the owner is arithmetic
//!   ([`slot_of_comm_id`]). A Communication ID of 0 (a REJ of a REQ the peer never matched)
//!   goes to slot 0.
//! * **Anything else** (other classes, responses, malformed MADs) goes to slot 0, as before
//!   sharing, whose GSI applies the MAD rules ([`crate::engine::gsi`]).
//!
//! A process that dies (SIGKILL included) loses its slot and its claims with its descriptors
//! (the kernel frees abstract names): a later REQ for its service finds no claim and gets REJ
//! reason 8 from another process's CM; a later REP / DREQ / ... for one of its Communication IDs is
//! forwarded to a slot nobody holds and is dropped and counted (`LinkCounters::rx_strays`), or,
//! when a new process took the slot, reaches a CM that does not know the ID (dropped and counted
//! by the CM, or answered with REJ, as for any unknown ID).
//!
//! Cost: a REQ or SIDR_REQ costs the receiving process one datagram connect(2) and, when the
//! service is claimed, at most [`super::slots::MAX_SLOTS`] stream connect(2)s (each refused one
//! costs a syscall; the one that succeeds leaves a connection the owner's CM closes on its next
//! turn, [`ServiceClaim::drain`]); other CM messages cost nothing but the forward.
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};

use roce::cm::AttrId;
use roce::mad::{self, MgmtClass};

use super::slots::{MAX_SLOTS, SLOT_BITS};

/// Bits of a Communication ID below the slot bits: `32 - SLOT_BITS`.
pub const COMM_ID_RANDOM_BITS: u32 = 32 - SLOT_BITS;

/// Pending lookups a claim's listener queues (listen(2) backlog); the owner's CM closes them
/// each turn ([`ServiceClaim::drain`]). When it is full a lookup cannot verify the owner and the
/// REQ is dropped and counted (the peer's CM resends it).
pub const CLAIM_BACKLOG: i32 = 64;

/// Bytes before the MAD in the UDP payload of a datagram for QP 1: BTH (12) and DETH (8) of a
/// UD SEND ONLY (IBTA vol. 1 §9.2, §9.3.3); RoCEv2 carries no GRH inside UDP.
const MAD_OFFSET: usize = 20;

/// `(mask, value)`: the Communication-ID bits a CM in `slot` fixes, and their value
/// (`id & mask == value`); the other [`COMM_ID_RANDOM_BITS`] stay random.
pub fn comm_id_prefix(slot: usize) -> (u32, u32) {
    let mask = ((MAX_SLOTS as u32) - 1) << COMM_ID_RANDOM_BITS;
    (mask, ((slot as u32) << COMM_ID_RANDOM_BITS) & mask)
}

/// The slot whose CM chose Communication ID `id` ([`comm_id_prefix`]).
pub fn slot_of_comm_id(id: u32) -> usize {
    (id >> COMM_ID_RANDOM_BITS) as usize
}

/// Whom a datagram for QP 1 belongs to, from its MAD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MadRoute {
    /// A REQ or SIDR_REQ for this Service ID: its claimer ([`lookup_service`]).
    Service(u64),
    /// A CM message naming our side's Communication ID (never 0): [`slot_of_comm_id`].
    CommId(u32),
    /// Anything else: slot 0, which holds QP 1.
    Receiver,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Reads the route of `payload`, the UDP payload of a datagram whose BTH names QP 1 (BTH, DETH,
/// then the 256-byte MAD, IBTA vol. 1 §13.4.2): CM-class (0x07) Sends only, by attribute ID
/// ([`MadRoute`]); anything shorter, of another class or method, is [`MadRoute::Receiver`].
pub fn route_of(payload: &[u8]) -> MadRoute {
    let Some(m) = payload.get(MAD_OFFSET..) else {
        return MadRoute::Receiver;
    };
    let Ok(h) = mad::Repr::parse_mad(m.get(..mad::MAD_LEN).unwrap_or(m)) else {
        return MadRoute::Receiver;
    };
    if h.mgmt_class != MgmtClass::CommMgmt || h.method != mad::Method::Send {
        return MadRoute::Receiver;
    }
    // CM message data starts at MAD byte 24 (tables 106-120).
    match AttrId::from(h.attr_id) {
        AttrId::Req | AttrId::SidrReq => {
            match m.get(32..40).and_then(|b| <[u8; 8]>::try_from(b).ok()) {
                Some(b) => MadRoute::Service(u64::from_be_bytes(b)),
                None => MadRoute::Receiver,
            }
        }
        AttrId::SidrRep => match u32_at(m, 24) {
            Some(id) if id != 0 => MadRoute::CommId(id),
            _ => MadRoute::Receiver,
        },
        AttrId::Mra
        | AttrId::Rej
        | AttrId::Rep
        | AttrId::Rtu
        | AttrId::Dreq
        | AttrId::Drep
        | AttrId::Lap
        | AttrId::Apr => match u32_at(m, 28) {
            Some(id) if id != 0 => MadRoute::CommId(id),
            _ => MadRoute::Receiver,
        },
        _ => MadRoute::Receiver,
    }
}

fn service_name(local: SocketAddr, service_id: u64) -> String {
    format!("soft-hca/{local}/svc/{service_id:016x}")
}

/// A process's claim on a Service ID of a shared address (see the [module docs](self)): held
/// while this value lives, and by the kernel only as long as the process does.
#[derive(Debug)]
pub struct ServiceClaim {
    service_id: u64,
    /// The exclusive datagram name `.../svc/<id>`.
    _exclusive: OwnedFd,
    /// The stream listener `.../svc/<id>/slot<N>` that lookups connect to.
    listener: OwnedFd,
}

impl ServiceClaim {
    /// Claims `service_id` on shared address `local` for the process in `slot`.
    ///
    /// # Errors
    /// `AddrInUse` when any process (of any user) holds the claim already; other socket errors
    /// (out of descriptors).
    pub fn claim(local: SocketAddr, slot: usize, service_id: u64) -> io::Result<ServiceClaim> {
        let base = service_name(local, service_id);
        let exclusive = crate::link::sys::bind_abstract_unix(base.as_bytes())?;
        let listener = crate::link::sys::listen_abstract_unix(
            format!("{base}/slot{slot}").as_bytes(),
            CLAIM_BACKLOG,
        )?;
        Ok(ServiceClaim {
            service_id,
            _exclusive: exclusive,
            listener,
        })
    }

    /// The Service ID claimed.
    pub fn service_id(&self) -> u64 {
        self.service_id
    }

    /// Closes the connections lookups left on the listener (at most [`CLAIM_BACKLOG`]); how
    /// many.
    pub fn drain(&self) -> usize {
        crate::link::sys::accept_and_close(self.listener.as_fd(), CLAIM_BACKLOG as usize)
    }
}

/// What [`lookup_service`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// No process of this user claims the service.
    Unclaimed,
    /// The process in this slot claims it.
    Owner(usize),
    /// A claim exists but its listener's backlog is full: the owner cannot be verified now.
    Busy,
}

/// Who claims `service_id` on shared address `local` among the processes of user `uid`, and how
/// many claims of other users were seen (and ignored).
pub fn lookup_service(local: SocketAddr, service_id: u64, uid: u32) -> (Lookup, u64) {
    let base = service_name(local, service_id);
    match crate::link::sys::connect_abstract_unix(base.as_bytes()) {
        Ok(_) => probe_slots(&base, uid),
        Err(_) => (Lookup::Unclaimed, 0),
    }
}

/// The lowest `N` whose stream name `base/slot<N>` a listener of user `uid` holds, and how many
/// listeners of other users were seen (and ignored).
fn probe_slots(base: &str, uid: u32) -> (Lookup, u64) {
    let mut strangers = 0;
    let mut busy = false;
    for slot in 0..MAX_SLOTS {
        match crate::link::sys::connect_abstract_stream(format!("{base}/slot{slot}").as_bytes()) {
            Ok(fd) => match crate::link::sys::peer_uid(fd.as_fd()) {
                Ok(u) if u == uid => return (Lookup::Owner(slot), strangers),
                _ => strangers += 1,
            },
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => busy = true,
            Err(_) => {}
        }
    }
    (
        if busy {
            Lookup::Busy
        } else {
            Lookup::Unclaimed
        },
        strangers,
    )
}

/// A process's notice that it runs a CM on a shared address (the listening stream name
/// `soft-hca/ADDR:PORT/cm/slot<N>`), so that REQs nobody claims reach a CM that answers them
/// (REJ reason 8) even when the process in slot 0 runs none ([`lookup_cm`]). Held while this
/// value lives, and by the kernel only as long as the process does.
#[derive(Debug)]
pub struct CmPresence {
    listener: OwnedFd,
}

impl CmPresence {
    /// Announces the CM of the process in `slot` of shared address `local`.
    ///
    /// # Errors
    /// `AddrInUse` when the name is taken (by a process of another user squatting it);
    /// other socket errors.
    pub fn announce(local: SocketAddr, slot: usize) -> io::Result<CmPresence> {
        let name = format!("soft-hca/{local}/cm/slot{slot}");
        let listener = crate::link::sys::listen_abstract_unix(name.as_bytes(), CLAIM_BACKLOG)?;
        Ok(CmPresence { listener })
    }

    /// Closes the connections lookups left (at most [`CLAIM_BACKLOG`]); how many.
    pub fn drain(&self) -> usize {
        crate::link::sys::accept_and_close(self.listener.as_fd(), CLAIM_BACKLOG as usize)
    }
}

/// The lowest slot of shared address `local` whose process (of user `uid`) runs a CM
/// ([`CmPresence`]), and how many presences of other users were seen (and ignored).
pub fn lookup_cm(local: SocketAddr, uid: u32) -> (Lookup, u64) {
    probe_slots(&format!("soft-hca/{local}/cm"), uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce::cm as rcm;

    /// A datagram for QP 1 with a CM-class Send MAD of attribute `attr` and the big-endian
    /// `fields` at their MAD offsets.
    fn datagram(attr: AttrId, fields: &[(usize, &[u8])]) -> Vec<u8> {
        let mut p = vec![0u8; MAD_OFFSET + mad::MAD_LEN + 4];
        let m = &mut p[MAD_OFFSET..MAD_OFFSET + mad::MAD_LEN];
        mad::Repr {
            base_version: 1,
            mgmt_class: MgmtClass::CommMgmt,
            class_version: rcm::CLASS_VERSION,
            method: mad::Method::Send,
            status: mad::Status::Ok,
            class_specific: 0,
            tid: 9,
            attr_id: attr.into(),
            attr_mod: 0,
        }
        .emit(&mut mad::Packet::new_unchecked(&mut m[..]));
        for (at, b) in fields {
            m[*at..*at + b.len()].copy_from_slice(b);
        }
        p
    }

    #[test]
    fn comm_ids_carry_their_slot() {
        for slot in 0..MAX_SLOTS {
            let (mask, value) = comm_id_prefix(slot);
            assert_eq!(mask.count_ones(), SLOT_BITS);
            for low in [1u32, 0x1234_5678, u32::MAX] {
                assert_eq!(slot_of_comm_id(value | (low & !mask)), slot);
            }
        }
    }

    /// Each message routes by the field of IBTA tables 106-120 that names the receiver's side.
    #[test]
    fn routes_follow_the_cm_fields() {
        let sid = rcm::service_id(rcm::port_space::TCP, 7471);
        let (local_id, remote_id) = (0x0800_0001u32.to_be_bytes(), 0x1800_0003u32.to_be_bytes());
        let req = datagram(AttrId::Req, &[(24, &local_id), (32, &sid.to_be_bytes())]);
        assert_eq!(route_of(&req), MadRoute::Service(sid));
        let sidr = datagram(
            AttrId::SidrReq,
            &[(24, &local_id), (32, &(sid + 1).to_be_bytes())],
        );
        assert_eq!(route_of(&sidr), MadRoute::Service(sid + 1));
        for attr in [
            AttrId::Mra,
            AttrId::Rej,
            AttrId::Rep,
            AttrId::Rtu,
            AttrId::Dreq,
            AttrId::Drep,
        ] {
            let d = datagram(attr, &[(24, &local_id), (28, &remote_id)]);
            assert_eq!(route_of(&d), MadRoute::CommId(0x1800_0003), "{attr:?}");
        }
        let srep = datagram(AttrId::SidrRep, &[(24, &remote_id)]);
        assert_eq!(route_of(&srep), MadRoute::CommId(0x1800_0003));
        // A REJ of a REQ the peer never matched names no local ID of ours.
        let rej0 = datagram(AttrId::Rej, &[(24, &local_id)]);
        assert_eq!(route_of(&rej0), MadRoute::Receiver);
        assert_eq!(route_of(&[0u8; 30]), MadRoute::Receiver);
        let mut other = datagram(AttrId::Rep, &[(28, &remote_id)]);
        other[MAD_OFFSET + 1] = 0x04; // performance management class
        assert_eq!(route_of(&other), MadRoute::Receiver);
        let mut get = datagram(AttrId::Rep, &[(28, &remote_id)]);
        get[MAD_OFFSET + 3] = 0x01; // Get: the GSI answers it
        assert_eq!(route_of(&get), MadRoute::Receiver);
    }

    fn local(test: u16) -> SocketAddr {
        let port = 30000 + (std::process::id() % 8000) as u16 * 4 + test;
        SocketAddr::new("127.0.0.1".parse().unwrap(), port)
    }

    /// A claim is exclusive, found by lookups in its slot, and gone once dropped.
    #[test]
    fn claims_are_exclusive_and_found() {
        let local = local(0);
        let uid = crate::link::sys::effective_uid();
        let sid = 0x0106_0000_0000_1234;
        assert_eq!(lookup_service(local, sid, uid), (Lookup::Unclaimed, 0));
        let c = ServiceClaim::claim(local, 3, sid).unwrap();
        let again = ServiceClaim::claim(local, 4, sid).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AddrInUse);
        for _ in 0..3 {
            assert_eq!(lookup_service(local, sid, uid), (Lookup::Owner(3), 0));
        }
        assert_eq!(c.drain(), 3, "each lookup left one connection");
        assert_eq!(c.drain(), 0);
        // Another user's view: the claim is not theirs.
        assert_eq!(
            lookup_service(local, sid, uid.wrapping_add(1)),
            (Lookup::Unclaimed, 1)
        );
        drop(c);
        assert_eq!(lookup_service(local, sid, uid), (Lookup::Unclaimed, 0));
        ServiceClaim::claim(local, 4, sid).expect("free again");
    }

    /// A claim made by a process of another user (a stranger) is ignored and counted. Needs
    /// root (to listen as another user): skips otherwise.
    #[test]
    fn a_strangers_claim_is_ignored() {
        if crate::link::sys::effective_uid() != 0 {
            eprintln!("skip: claiming as another user needs root");
            return;
        }
        let local = local(1);
        let sid = 0x0106_0000_0000_4321;
        let base = service_name(local, sid);
        let held = crate::link::sys::hold_as_user(
            65534,
            &[(base.clone(), false), (format!("{base}/slot2"), true)],
        )
        .expect("a child holds the names as uid 65534");
        assert_eq!(lookup_service(local, sid, 0), (Lookup::Unclaimed, 1));
        // The stranger holds the exclusive name: our claim is refused, as a port in use.
        assert_eq!(
            ServiceClaim::claim(local, 0, sid).unwrap_err().kind(),
            io::ErrorKind::AddrInUse
        );
        drop(held);
    }
}

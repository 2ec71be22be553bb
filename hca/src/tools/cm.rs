//! perftest's `-R` connection: an RC QP connected by RDMA CM ([`CmService`]) that carries the
//! tool's messages instead of TCP ([`CmChannel`], a [`MessageChannel`]).
//!
//! Source: linux-rdma/perftest tag `v4.5-0.17`, `src/perftest_communication.c`:
//! `create_comm_struct` (with `use_rdma_cm`: one RC QP, `tx_depth` = `rx_depth` = 1, messages
//! from one buffer), `rdma_client_connect` (`rdma_resolve_addr` / `rdma_resolve_route` to the
//! server's address and port `-p`, one receive posted, `rdma_connect` with `rnr_retry_count` 7
//! and no private data, then `ESTABLISHED`), `rdma_server_connect` (`rdma_bind_addr` +
//! `rdma_listen` on the port, the first `CONNECT_REQUEST`, one receive posted, `rdma_accept`,
//! the listening ID destroyed), `rdma_write_data` / `rdma_read_data` (each message one signaled
//! SEND; the receiver polls its receive CQ, copies the message out and posts the next receive).
//! The order of the exchanges on it is that of the TCP connection
//! ([`super::oob::perftest`]); only `pingpong_dest` travels as the binary struct
//! ([`KeyFormat::Binary`](super::oob::perftest::KeyFormat::Binary)).
//!
//! Every wait here is bounded: each CM event and each message by the channel's timeout.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{HostMemory, Memory};

use crate::rdma_cm::{CmService, RdmaCmEvent, RdmaCmEventType, RdmaId};
use crate::verbs::api::Verbs;
use crate::verbs::cq::CqHandle;
use crate::verbs::mr::{AccessFlags, MemoryRegion};
use crate::verbs::pd::PdHandle;
use crate::verbs::qp::{QpAttr, QpAttrMask, QpCap, QpInitAttr, QpState, QpType};
use crate::verbs::wc::WcStatus;
use crate::verbs::wr::{RecvWr, SendFlags, SendOp, SendWr, Sge};

use super::oob::perftest::MessageChannel;
use super::oob::OobError;

/// Bytes of the channel's buffer: receives land at 0, sends leave from [`SEND_AT`].
const BUF_LEN: usize = 4096;
/// Where sends leave from.
const SEND_AT: usize = 2048;
/// The largest message either way (what the receive buffer holds).
pub const MAX_MESSAGE: usize = SEND_AT;

/// Waits for the next event of `cm`, which must be `want` for `id` (any ID when `None`).
///
/// Errors: the event that came instead (`REJECTED` with its reason, `UNREACHABLE`, ...), or
/// none within `timeout`, as text.
pub fn expect_event(
    cm: &CmService,
    id: Option<RdmaId>,
    want: RdmaCmEventType,
    timeout: Duration,
) -> Result<RdmaCmEvent, String> {
    let Some(e) = cm.get_event(timeout) else {
        return Err(format!("no RDMA CM event {want:?} within {timeout:?}"));
    };
    if e.event != want || id.is_some_and(|id| id != e.id) {
        return Err(format!(
            "unexpected RDMA CM event {:?} (status {}) waiting for {want:?}",
            e.event, e.status
        ));
    }
    Ok(e)
}

/// How often [`connect_qps`] tries a QP whose connection is rejected, and the pause between
/// tries (perftest's `rdma_cm_client_connection`: 10 tries, 100 ms apart: its client may
/// connect before the server listens again after the hand-shake).
pub const CONNECT_TRIES: u32 = 10;
/// The pause between two tries of [`connect_qps`].
pub const CONNECT_RETRY_DELAY: Duration = Duration::from_millis(100);

/// `create_rdma_cm_connection` on a client: connects each RC QP of `qpns` (created by the
/// caller, in RESET or INIT) to the server at `dst` with its own CM ID (`rdma_resolve_addr`,
/// `rdma_resolve_route`, `rdma_connect` with no private data), one after the other, each up to
/// `ESTABLISHED` within `timeout`; a rejected QP is moved back to RESET and tried again, at most
/// [`CONNECT_TRIES`] times. Returns the IDs, in the order of `qpns`.
///
/// Errors: as text; the IDs made so far are destroyed.
pub fn connect_qps(
    dev: &dyn Verbs,
    cm: &CmService,
    dst: SocketAddr,
    qpns: &[u32],
    timeout: Duration,
) -> Result<Vec<RdmaId>, String> {
    let mut ids = Vec::with_capacity(qpns.len());
    let r = (|| {
        for &qpn in qpns {
            let mut tries = 0;
            loop {
                tries += 1;
                let id = cm.create_id().map_err(|e| e.to_string())?;
                let r = (|| {
                    cm.resolve_addr(id, None, dst).map_err(|e| e.to_string())?;
                    expect_event(cm, Some(id), RdmaCmEventType::AddrResolved, timeout)?;
                    cm.resolve_route(id).map_err(|e| e.to_string())?;
                    expect_event(cm, Some(id), RdmaCmEventType::RouteResolved, timeout)?;
                    cm.connect(id, qpn, &[]).map_err(|e| e.to_string())?;
                    expect_event(cm, Some(id), RdmaCmEventType::Established, timeout)
                })();
                match r {
                    Ok(_) => {
                        ids.push(id);
                        break;
                    }
                    Err(e) if tries < CONNECT_TRIES && e.contains("Rejected") => {
                        cm.destroy_id(id);
                        // The REJ moved the QP to ERR: back to RESET for the next REQ.
                        let reset = QpAttr {
                            qp_state: QpState::Reset,
                            ..QpAttr::default()
                        };
                        dev.modify_qp(qpn, &reset, QpAttrMask::STATE)
                            .map_err(|e| format!("resetting QP {qpn:#x}: {e}"))?;
                        std::thread::sleep(CONNECT_RETRY_DELAY);
                    }
                    Err(e) => {
                        cm.destroy_id(id);
                        return Err(e);
                    }
                }
            }
        }
        Ok(())
    })();
    match r {
        Ok(()) => Ok(ids),
        Err(e) => {
            for id in ids {
                cm.destroy_id(id);
            }
            Err(e)
        }
    }
}

/// `create_rdma_cm_connection` on a server: listens on `addr`, accepts one `CONNECT_REQUEST`
/// per QP of `qpns` (in order; the first within `accept`, the others within `timeout`), waits
/// for their `ESTABLISHED`, and destroys the listening ID. Returns the connections' IDs.
///
/// Errors: as text; the IDs made so far are destroyed.
pub fn accept_qps(
    cm: &CmService,
    addr: SocketAddr,
    qpns: &[u32],
    accept: Duration,
    timeout: Duration,
) -> Result<Vec<RdmaId>, String> {
    let l = listen_qps(cm, addr)?;
    accept_qps_on(cm, l, qpns, accept, timeout)
}

/// The listening ID of [`accept_qps_on`]: `rdma_listen` on `addr`. A server that tells its
/// client to connect over another channel (perftest's hand-shake before the test's QPs connect)
/// listens first, so that the client's REQ cannot come before the listener and get REJ
/// `InvalidServiceId` (perftest 4.5's server listens only after that hand-shake, and its client
/// does not survive the REJ).
///
/// Errors: as text; nothing is left behind.
pub fn listen_qps(cm: &CmService, addr: SocketAddr) -> Result<RdmaId, String> {
    let l = cm.create_id().map_err(|e| e.to_string())?;
    if let Err(e) = cm.listen(l, addr) {
        cm.destroy_id(l);
        return Err(format!("rdma_listen on {addr}: {e}"));
    }
    Ok(l)
}

/// [`accept_qps`] on listening ID `l` (from [`listen_qps`]), which it destroys.
///
/// Errors: as text; the IDs made so far are destroyed.
pub fn accept_qps_on(
    cm: &CmService,
    l: RdmaId,
    qpns: &[u32],
    accept: Duration,
    timeout: Duration,
) -> Result<Vec<RdmaId>, String> {
    let mut ids = Vec::with_capacity(qpns.len());
    let r = (|| {
        // Requests and the ESTABLISHED of those accepted interleave: take them as they come.
        let mut established = 0;
        while established < qpns.len() {
            let wait = if ids.is_empty() { accept } else { timeout };
            let Some(e) = cm.get_event(wait) else {
                return Err(format!(
                    "{} of {} RDMA CM connections made within {wait:?}",
                    established,
                    qpns.len()
                ));
            };
            match e.event {
                RdmaCmEventType::ConnectRequest if ids.len() < qpns.len() => {
                    ids.push(e.id);
                    cm.accept(e.id, qpns[ids.len() - 1], &[])
                        .map_err(|e| e.to_string())?;
                }
                RdmaCmEventType::Established if ids.contains(&e.id) => established += 1,
                other => {
                    return Err(format!(
                        "unexpected RDMA CM event {other:?} (status {}) accepting connections",
                        e.status
                    ))
                }
            }
        }
        Ok(())
    })();
    cm.destroy_id(l);
    match r {
        Ok(()) => Ok(ids),
        Err(e) => {
            for id in ids {
                cm.destroy_id(id);
            }
            Err(e)
        }
    }
}

/// `rdma_cm_disconnect_nodes`: disconnects every ID of `ids` (an ID the peer disconnected
/// first needs nothing sent) and waits until each has had its `DISCONNECTED` (each wait within
/// `timeout`; events of other IDs, and `TIMEWAIT_EXIT`s, are passed over), then destroys them.
///
/// Errors: as text (the IDs are destroyed anyway).
pub fn disconnect_qps(cm: &CmService, ids: &[RdmaId], timeout: Duration) -> Result<(), String> {
    for &id in ids {
        // BadState: the peer's DREQ came first; its DISCONNECTED is queued already.
        let _ = cm.disconnect(id);
    }
    let mut left: Vec<RdmaId> = ids.to_vec();
    let mut r = Ok(());
    // Bounded: each turn takes an event or ends the wait; at most this many events are read.
    for _ in 0..(16 * ids.len() + 16) {
        if left.is_empty() {
            break;
        }
        match cm.get_event(timeout) {
            None => {
                r = Err(format!(
                    "no RDMA CM event Disconnected within {timeout:?} ({} of {} left)",
                    left.len(),
                    ids.len()
                ));
                break;
            }
            Some(e) if e.event == RdmaCmEventType::Disconnected => left.retain(|&id| id != e.id),
            Some(_) => {}
        }
    }
    if r.is_ok() && !left.is_empty() {
        r = Err(format!(
            "{} RDMA CM connections not disconnected",
            left.len()
        ));
    }
    for &id in ids {
        cm.destroy_id(id);
    }
    r
}

/// perftest's `-R` message connection; see the [module docs](self).
pub struct CmChannel {
    dev: Arc<dyn Verbs>,
    cm: Arc<CmService>,
    id: RdmaId,
    pd: PdHandle,
    qpn: u32,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
    local: Option<SocketAddr>,
    peer: SocketAddr,
    io_timeout: Duration,
}

impl std::fmt::Debug for CmChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmChannel")
            .field("qpn", &self.qpn)
            .field("peer", &self.peer)
            .finish_non_exhaustive()
    }
}

/// The channel's PD, CQs, buffer, MR and RC QP (in RESET: the CM moves it).
struct Parts {
    pd: PdHandle,
    send_cq: CqHandle,
    recv_cq: CqHandle,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
    qpn: u32,
}

impl Parts {
    /// Frees what [`parts`] made (errors ignored: the objects are unused).
    fn destroy(&self, dev: &Arc<dyn Verbs>) {
        let _ = dev.destroy_qp(self.qpn);
        let _ = dev.dereg_mr(self.mr.lkey());
        let _ = dev.destroy_cq(self.send_cq);
        let _ = dev.destroy_cq(self.recv_cq);
        let _ = dev.dealloc_pd(self.pd);
    }
}

fn parts(dev: &Arc<dyn Verbs>) -> Result<Parts, String> {
    let e = |what: &str, err: &dyn std::fmt::Display| format!("RDMA CM channel: {what}: {err}");
    let pd = dev.alloc_pd().map_err(|x| e("alloc_pd", &x))?;
    let send_cq = dev.create_cq(4).map_err(|x| e("create_cq", &x))?;
    let recv_cq = dev.create_cq(4).map_err(|x| e("create_cq", &x))?;
    let mem = Arc::new(HostMemory::new(BUF_LEN).map_err(|x| e("buffer", &x))?);
    let mr = dev
        .reg_mr(pd, mem.clone(), 0, BUF_LEN, 0, AccessFlags::LOCAL_WRITE)
        .map_err(|x| e("reg_mr", &x))?;
    let qpn = dev
        .create_qp(
            pd,
            &QpInitAttr {
                qp_type: QpType::Rc,
                send_cq,
                recv_cq,
                srq: None,
                cap: QpCap {
                    max_send_wr: 2,
                    max_recv_wr: 2,
                    max_send_sge: 1,
                    max_recv_sge: 1,
                    max_inline_data: 0,
                },
                sq_sig_all: false,
            },
        )
        .map_err(|x| e("create_qp", &x))?;
    Ok(Parts {
        pd,
        send_cq,
        recv_cq,
        mem,
        mr,
        qpn,
    })
}

impl CmChannel {
    /// The channel over `p` (which the channel frees when dropped; a caller whose `new` failed
    /// frees them itself).
    #[allow(clippy::too_many_arguments)]
    fn new(
        dev: Arc<dyn Verbs>,
        cm: Arc<CmService>,
        id: RdmaId,
        p: &Parts,
        local: Option<SocketAddr>,
        peer: Option<SocketAddr>,
        io_timeout: Duration,
    ) -> Result<CmChannel, String> {
        Ok(CmChannel {
            dev,
            cm,
            id,
            pd: p.pd,
            qpn: p.qpn,
            send_cq: p.send_cq,
            recv_cq: p.recv_cq,
            mem: p.mem.clone(),
            mr: p.mr.clone(),
            local,
            peer: peer.ok_or("RDMA CM channel: no peer address")?,
            io_timeout,
        })
    }

    /// `rdma_client_connect`: connects to a perftest server at `dst` (its `-p` port) and waits
    /// for `ESTABLISHED`, each step at most `timeout`.
    ///
    /// Errors: as text, for the tool to print: `ADDR_ERROR`, `REJECTED` (no server on the port),
    /// `UNREACHABLE`, a verb refused.
    pub fn connect(
        dev: Arc<dyn Verbs>,
        cm: Arc<CmService>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<CmChannel, String> {
        let id = cm.create_id().map_err(|e| e.to_string())?;
        let r = (|| {
            cm.resolve_addr(id, None, dst).map_err(|e| e.to_string())?;
            expect_event(&cm, Some(id), RdmaCmEventType::AddrResolved, timeout)?;
            cm.resolve_route(id).map_err(|e| e.to_string())?;
            expect_event(&cm, Some(id), RdmaCmEventType::RouteResolved, timeout)?;
            let p = parts(&dev)?;
            let connected = (|| {
                cm.connect(id, p.qpn, &[]).map_err(|e| e.to_string())?;
                let (local, peer) = cm.addresses(id).unwrap_or((None, None));
                let ch = CmChannel::new(dev.clone(), cm.clone(), id, &p, local, peer, timeout)?;
                ch.post_recv()?;
                expect_event(&cm, Some(id), RdmaCmEventType::Established, timeout)?;
                Ok(ch)
            })();
            if connected.is_err() {
                cm.destroy_id(id);
                p.destroy(&dev);
            }
            connected
        })();
        if r.is_err() {
            cm.destroy_id(id);
        }
        r
    }

    /// `rdma_server_connect`: listens on `addr`, takes the first `CONNECT_REQUEST`, accepts it
    /// (and waits for `ESTABLISHED`, so that the QP is in RTS before the first send), and
    /// destroys the listening ID. Waits at most `accept` for the request and `timeout` for the
    /// rest.
    ///
    /// Errors: as text: the port in use, no request in time, a verb refused.
    pub fn accept(
        dev: Arc<dyn Verbs>,
        cm: Arc<CmService>,
        addr: SocketAddr,
        accept: Duration,
        timeout: Duration,
    ) -> Result<CmChannel, String> {
        let l = cm.create_id().map_err(|e| e.to_string())?;
        let r = (|| {
            cm.listen(l, addr)
                .map_err(|e| format!("rdma_listen on {addr}: {e}"))?;
            let req = expect_event(&cm, None, RdmaCmEventType::ConnectRequest, accept)?;
            let p = parts(&dev)?;
            let accepted = (|| {
                cm.accept(req.id, p.qpn, &[]).map_err(|e| e.to_string())?;
                let (local, peer) = cm.addresses(req.id).unwrap_or((None, None));
                let ch = CmChannel::new(dev.clone(), cm.clone(), req.id, &p, local, peer, timeout)?;
                ch.post_recv()?;
                expect_event(&cm, Some(req.id), RdmaCmEventType::Established, timeout)?;
                Ok(ch)
            })();
            if accepted.is_err() {
                cm.destroy_id(req.id);
                p.destroy(&dev);
            }
            accepted
        })();
        cm.destroy_id(l);
        r
    }

    fn post_recv(&self) -> Result<(), String> {
        let sge = [Sge {
            addr: self.mr.iova(),
            length: MAX_MESSAGE as u32,
            lkey: self.mr.lkey(),
        }];
        self.dev
            .post_recv(
                self.qpn,
                &RecvWr {
                    wr_id: 0,
                    sg_list: &sge,
                },
            )
            .map_err(|e| format!("RDMA CM channel: post_recv: {e}"))
    }

    fn io_error(&self, what: &'static str, write: bool, text: String) -> OobError {
        let source = std::io::Error::other(text);
        if write {
            OobError::Write {
                peer: self.peer,
                what,
                source,
            }
        } else {
            OobError::Read {
                peer: self.peer,
                what,
                source,
            }
        }
    }

    /// The CM ID of the connection.
    pub fn id(&self) -> RdmaId {
        self.id
    }
}

impl MessageChannel for CmChannel {
    fn send(&mut self, what: &'static str, msg: &[u8]) -> Result<(), OobError> {
        if msg.len() > MAX_MESSAGE {
            return Err(self.io_error(what, true, format!("{} bytes", msg.len())));
        }
        self.mem
            .write(SEND_AT, msg)
            .map_err(|e| self.io_error(what, true, e.to_string()))?;
        let sge = [Sge {
            addr: self.mr.iova() + SEND_AT as u64,
            length: msg.len() as u32,
            lkey: self.mr.lkey(),
        }];
        let wr = SendWr {
            wr_id: 1,
            sg_list: &sge,
            op: SendOp::Send,
            send_flags: SendFlags::SIGNALED,
        };
        self.dev
            .post_send(self.qpn, &wr)
            .map_err(|e| self.io_error(what, true, e.to_string()))?;
        let wc = self
            .dev
            .wait_cq(self.send_cq, 1, self.io_timeout)
            .map_err(|e| self.io_error(what, true, e.to_string()))?;
        match wc.first() {
            None => Err(OobError::Timeout {
                peer: self.peer,
                what,
                got: 0,
                expected: msg.len(),
                after: self.io_timeout,
            }),
            Some(wc) if wc.status != WcStatus::Success => {
                Err(self.io_error(what, true, format!("send completion {:?}", wc.status)))
            }
            Some(_) => Ok(()),
        }
    }

    fn recv(&mut self, what: &'static str, buf: &mut [u8]) -> Result<(), OobError> {
        let wc = self
            .dev
            .wait_cq(self.recv_cq, 1, self.io_timeout)
            .map_err(|e| self.io_error(what, false, e.to_string()))?;
        let Some(wc) = wc.first() else {
            return Err(OobError::Timeout {
                peer: self.peer,
                what,
                got: 0,
                expected: buf.len(),
                after: self.io_timeout,
            });
        };
        if wc.status != WcStatus::Success {
            return Err(self.io_error(what, false, format!("receive completion {:?}", wc.status)));
        }
        if (wc.byte_len as usize) < buf.len() {
            return Err(self.io_error(
                what,
                false,
                format!("{} bytes, {} expected", wc.byte_len, buf.len()),
            ));
        }
        self.mem
            .read(0, buf)
            .map_err(|e| self.io_error(what, false, e.to_string()))?;
        self.post_recv()
            .map_err(|e| self.io_error(what, false, e))?;
        Ok(())
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.local
    }

    fn set_io_timeout(&mut self, io: Duration) {
        self.io_timeout = io.max(Duration::from_millis(1));
    }
}

impl Drop for CmChannel {
    /// `rdma_destroy_id` of a connected ID: the CM disconnects it (DREQ); then the QP and its
    /// objects are freed.
    fn drop(&mut self) {
        self.cm.destroy_id(self.id);
        Parts {
            pd: self.pd,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            mem: self.mem.clone(),
            mr: self.mr.clone(),
            qpn: self.qpn,
        }
        .destroy(&self.dev);
    }
}

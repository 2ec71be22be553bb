//! QP1, the General Services Interface (GSI, IBTA vol. 1 §13.5): the UD QP every port has for
//! management datagrams (MADs), here the transport of the communication manager.
//!
//! On RoCEv2 a MAD is the 256-byte payload of a UD SEND ONLY to destination QP 1 with Q_Key
//! 0x80010000 ([`roce::mad::GSI_QKEY`]) and P_Key 0xFFFF, sent from QP 1, as Linux rxe sends
//! them (rxe `rxe_recv.c` `check_keys`: QP1 takes the GSI Q_Key). The receive path
//! (`recv.rs`) hands such packets here after the P_Key, Q_Key and ICRC checks; this module then
//! applies the MAD rules (IBTA vol. 1 §13.4.7 and §13.5.3, Linux `ib_mad.c`):
//!
//! * A MAD that is not exactly 256 bytes, or whose base version is not 1 and is not a Get or Set,
//!   is dropped and counted (`gsi_bad_mad`). A Get or Set with a bad base version, or of the CM
//!   class with a class version other than 2, is answered with a GetResp of status
//!   [`Status::BadVersion`].
//! * A CM-class (0x07, version 2) Send, and any response (method with the R bit, or
//!   TrapRepress) of any class, is queued for the consumer ([`SoftHca::poll_mad`]): the CM
//!   protocol above matches responses to its requests by TID.
//! * Any other Get or Set (an unknown class, or a method the CM class does not serve) is answered
//!   with a GetResp of status [`Status::UnsupportedMethodAttr`], as Linux `ib_mad.c`
//!   `generate_unmatched_resp` does; any other method is dropped and counted.
//!
//! Both queues are bounded ([`GSI_RECV_QUEUE_LEN`], [`GSI_SEND_QUEUE_LEN`]): a flood of MADs can
//! neither grow memory nor starve the other QPs (a MAD that finds its queue full is dropped and
//! counted in `gsi_queue_full`; the CM protocol's retries cover a lost MAD). No other QP's state
//! is touched by anything here.

use alloc::collections::VecDeque;
use core::net::IpAddr;

use roce::mad::{self, Method, MgmtClass, Status, MAD_LEN};
use roce::packet::{ExtReprs, TransportRepr};
use roce::{bth, deth, udp, Opcode};

use super::counters::bump;
use super::net::{self, Route};
use super::tx::TxOut;
use super::{src_port_for, SoftHca, Transmit};
use crate::verbs::error::{Cause, VerbsError};

/// Most received MADs kept for the consumer ([`SoftHca::poll_mad`]) before further ones are
/// dropped (Linux rxe's QP1 receive queue is of this order: `IB_MAD_QP_RECV_SIZE` = 512; the CM
/// retries what is lost).
pub const GSI_RECV_QUEUE_LEN: usize = 64;
/// Most MADs waiting for transmission ([`SoftHca::gsi_send`] and the GSI's own answers).
pub const GSI_SEND_QUEUE_LEN: usize = 64;

/// A MAD received on QP1, with the addressing needed to answer it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedMad {
    /// The sender's IP address (its GID on RoCEv2).
    pub src_ip: IpAddr,
    /// The local IP address it was sent to.
    pub dst_ip: IpAddr,
    /// The sending QP (DETH SrcQP; 1 for a peer's GSI).
    pub src_qpn: u32,
    /// The whole 256-byte MAD.
    pub mad: [u8; MAD_LEN],
}

/// A MAD waiting to be sent from QP1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingMad {
    pub(crate) src_ip: IpAddr,
    pub(crate) dst_ip: IpAddr,
    pub(crate) dest_qpn: u32,
    pub(crate) mad: [u8; MAD_LEN],
}

/// The GSI's queues and its send PSN (UD PSNs only number packets; receivers ignore them).
#[derive(Debug, Default)]
pub(crate) struct Gsi {
    pub(crate) recv: VecDeque<ReceivedMad>,
    pub(crate) send: VecDeque<PendingMad>,
    pub(crate) psn: u32,
    /// Whether QP1 sends next when QPs also have work (they alternate).
    pub(crate) turn: bool,
}

/// What the GSI does with a MAD that passed the packet checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Disposition {
    /// Queue it for the consumer.
    Deliver,
    /// Answer it with a GetResp of this status.
    Answer(Status),
    /// Drop and count it.
    Drop,
}

/// A refused [`SoftHca::gsi_send`], reported as a post-send on QP 1.
fn gsi_error(cause: Cause) -> VerbsError {
    VerbsError::PostSend {
        qpn: mad::GSI_QPN,
        wr_id: 0,
        cause,
    }
}

fn disposition(header: &mad::Repr) -> Disposition {
    let answer_or_drop = |status| match header.error_response(status) {
        Some(_) => Disposition::Answer(status),
        None => Disposition::Drop,
    };
    if header.base_version != mad::BASE_VERSION {
        return answer_or_drop(Status::BadVersion);
    }
    if header.method.is_response() {
        return Disposition::Deliver;
    }
    if header.mgmt_class == MgmtClass::CommMgmt {
        if header.class_version != roce::cm::CLASS_VERSION {
            return answer_or_drop(Status::BadVersion);
        }
        if header.method == Method::Send {
            return Disposition::Deliver;
        }
    }
    answer_or_drop(Status::UnsupportedMethodAttr)
}

impl SoftHca {
    /// A MAD for QP1 passed the packet checks (opcode, P_Key, Q_Key, ICRC): apply the MAD rules
    /// of the [module docs](self).
    pub(crate) fn gsi_receive(
        &mut self,
        src_ip: IpAddr,
        dst_ip: IpAddr,
        src_qpn: u32,
        payload: &[u8],
    ) {
        let Ok(header) = mad::Repr::parse_mad(payload) else {
            bump!(self.counters.gsi_bad_mad);
            return;
        };
        let mut buf = [0u8; MAD_LEN];
        buf.copy_from_slice(payload);
        match disposition(&header) {
            Disposition::Deliver => {
                if self.gsi.recv.len() >= GSI_RECV_QUEUE_LEN {
                    bump!(self.counters.gsi_queue_full);
                    return;
                }
                bump!(self.counters.gsi_rcvd);
                self.gsi.recv.push_back(ReceivedMad {
                    src_ip,
                    dst_ip,
                    src_qpn,
                    mad: buf,
                });
            }
            Disposition::Answer(status) => {
                let Some(resp) = header.error_response(status) else {
                    bump!(self.counters.gsi_bad_mad);
                    return;
                };
                resp.emit(&mut mad::Packet::new_unchecked(&mut buf[..]));
                if self.gsi.send.len() >= GSI_SEND_QUEUE_LEN {
                    bump!(self.counters.gsi_queue_full);
                    return;
                }
                bump!(self.counters.gsi_answered);
                self.gsi.send.push_back(PendingMad {
                    src_ip: dst_ip,
                    dst_ip: src_ip,
                    dest_qpn: src_qpn,
                    mad: buf,
                });
            }
            Disposition::Drop => bump!(self.counters.gsi_bad_mad),
        }
    }

    /// The next MAD received on QP1 for the consumer (the CM), oldest first; see the
    /// [module docs](self) for which MADs are delivered.
    pub fn poll_mad(&mut self) -> Option<ReceivedMad> {
        self.gsi.recv.pop_front()
    }

    /// Whether QP1 holds received MADs that [`SoftHca::poll_mad`] has not returned yet (a device
    /// checks this after each progress round to wake its CM).
    pub fn has_pending_mads(&self) -> bool {
        !self.gsi.recv.is_empty()
    }

    /// MADs queued on QP1 ([`SoftHca::gsi_send`], the GSI's own answers) and not yet handed to
    /// the link: a CM in a process about to exit waits for 0, so that its last answers (a DREP)
    /// leave before it does.
    pub fn gsi_sends_pending(&self) -> usize {
        self.gsi.send.len()
    }

    /// Queues `mad` (exactly [`MAD_LEN`] = 256 bytes) for transmission from QP1 at `src_ip` to QP
    /// `dest_qpn` (1 for a peer's GSI) at `dst_ip`: a UD SEND ONLY with the GSI Q_Key and P_Key
    /// 0xFFFF (IBTA vol. 1 §13.5.1).
    ///
    /// # Errors
    /// [`VerbsError::PostSend`] on QPN 1 with [`Cause::InvalidValue`] (`EINVAL`) if `mad` is not 256 bytes or the two addresses are of
    /// different families; [`Cause::QueueFull`] (`ENOMEM`) when [`GSI_SEND_QUEUE_LEN`] MADs wait.
    pub fn gsi_send(
        &mut self,
        src_ip: IpAddr,
        dst_ip: IpAddr,
        dest_qpn: u32,
        mad: &[u8],
    ) -> Result<(), VerbsError> {
        let Ok(buf) = <[u8; MAD_LEN]>::try_from(mad) else {
            return Err(gsi_error(Cause::InvalidValue {
                attr: "mad length",
                value: mad.len() as u64,
            }));
        };
        if src_ip.is_ipv4() != dst_ip.is_ipv4() {
            return Err(gsi_error(Cause::InvalidValue {
                attr: "address family",
                value: 0,
            }));
        }
        if self.gsi.send.len() >= GSI_SEND_QUEUE_LEN {
            return Err(gsi_error(Cause::QueueFull {
                max_wr: GSI_SEND_QUEUE_LEN as u32,
            }));
        }
        self.gsi.send.push_back(PendingMad {
            src_ip,
            dst_ip,
            dest_qpn: dest_qpn & roce::Psn::MASK,
            mad: buf,
        });
        Ok(())
    }

    /// Builds the MAD at the front of the GSI send queue into `out`; `None` when the buffer is too
    /// small (the MAD stays queued, `send_err` counts it).
    pub(crate) fn build_gsi(&mut self, out: &mut TxOut<'_>) -> Option<Transmit> {
        let pending = self.gsi.send.front()?.clone();
        out.reset();
        let buf = &mut *out.buf;
        let transport = TransportRepr {
            bth: bth::Repr {
                opcode: Opcode::UdSendOnly,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: mad::DEFAULT_PKEY,
                fecn: false,
                becn: false,
                dest_qpn: pending.dest_qpn,
                ack_req: false,
                psn: self.gsi.psn,
            },
            ext: ExtReprs {
                deth: Some(deth::Repr {
                    qkey: mad::GSI_QKEY,
                    src_qpn: mad::GSI_QPN,
                }),
                ..ExtReprs::default()
            },
        };
        let route = Route {
            src_ip: pending.src_ip,
            dst_ip: pending.dst_ip,
            src_port: src_port_for(
                &self.config.udp_src_ports,
                udp::rocev2_src_port(mad::GSI_QPN),
            ),
            dscp: 0,
            ecn: roce::ipv4::Ecn::NotEct,
            hop_limit: 64,
            flow_label: 0,
        };
        let built = net::write_headers(buf, &transport, MAD_LEN, MAD_LEN).and_then(|header_len| {
            buf.get_mut(header_len..header_len + MAD_LEN)
                .ok_or(net::BuildError::BufferTooSmall)?
                .copy_from_slice(&pending.mad);
            net::seal(buf, header_len, MAD_LEN, &route)
        });
        match built {
            Ok(len) => {
                out.built_in_buffer(len);
                self.gsi.send.pop_front();
                self.gsi.psn = (self.gsi.psn + 1) & roce::Psn::MASK;
                bump!(self.counters.gsi_sent);
                bump!(self.counters.sent_pkts);
                Some(Transmit::new(&route, len))
            }
            Err(net::BuildError::BufferTooSmall) => {
                bump!(self.counters.send_err);
                None
            }
            Err(net::BuildError::Headers) => {
                bump!(self.counters.send_err);
                self.gsi.send.pop_front();
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(class: MgmtClass, class_version: u8, method: Method) -> mad::Repr {
        mad::Repr {
            base_version: 1,
            mgmt_class: class,
            class_version,
            method,
            status: Status::Ok,
            class_specific: 0,
            tid: 7,
            attr_id: 0x10,
            attr_mod: 0,
        }
    }

    #[test]
    fn dispositions_follow_ib_mad() {
        use Disposition::*;
        let cm = MgmtClass::CommMgmt;
        assert_eq!(disposition(&header(cm, 2, Method::Send)), Deliver);
        assert_eq!(disposition(&header(cm, 2, Method::GetResp)), Deliver);
        assert_eq!(
            disposition(&header(MgmtClass::PerfMgmt, 1, Method::GetResp)),
            Deliver
        );
        assert_eq!(
            disposition(&header(cm, 2, Method::Get)),
            Answer(Status::UnsupportedMethodAttr)
        );
        assert_eq!(
            disposition(&header(cm, 1, Method::Get)),
            Answer(Status::BadVersion)
        );
        assert_eq!(disposition(&header(cm, 3, Method::Send)), Drop);
        assert_eq!(
            disposition(&header(MgmtClass::Unknown(0x30), 1, Method::Set)),
            Answer(Status::UnsupportedMethodAttr)
        );
        assert_eq!(
            disposition(&header(MgmtClass::PerfMgmt, 1, Method::Trap)),
            Drop
        );
        let bad_base = mad::Repr {
            base_version: 2,
            ..header(MgmtClass::PerfMgmt, 1, Method::Get)
        };
        assert_eq!(disposition(&bad_base), Answer(Status::BadVersion));
        let bad_base_send = mad::Repr {
            base_version: 2,
            ..header(cm, 2, Method::Send)
        };
        assert_eq!(disposition(&bad_base_send), Drop);
    }
}

//! Receive validation and demultiplexing (rxe `rxe_recv.c`).
//!
//! Every received datagram goes through the same checks in a fixed order; the first that fails
//! drops the packet, counts it under its [`DropReason`] and records a rate-limited diagnostic.
//! No input can make this code panic: headers are parsed by `roce`'s checked parsers, every
//! lookup is by table index with a bounds check.
//!
//! 1. **UDP port**: destination 4791 (IBTA Annex A17.4.2).
//! 2. **Length, version, opcode, pad** (`roce::packet::parse_udp_payload`): BTH and the extended
//!    headers the opcode carries fit, TVer is 0 (IBTA vol. 1 §9.2), the opcode is an RC, UC or UD
//!    opcode or the CNP, PadCnt is consistent.
//! 3. **Destination address**: one of the port's RoCEv2 GIDs (rxe `rxe_chk_dgid`).
//! 4. **QPN**: names a live QP (QP0 is not offered); a CNP only needs its QP to exist. QP1, the
//!    GSI, takes UD SEND ONLY with the GSI P_Key and Q_Key, then the ICRC, and hands the MAD to
//!    module `gsi`.
//! 5. **QP type** matches the opcode's transport, and **QP state**: requests need RTR, RTS, SQD or
//!    SQE; responses RTS or SQD (rxe `check_type_state`).
//! 6. **Addresses** (RC/UC): the source is the QP's peer and the destination its own source GID
//!    (rxe `check_addr`).
//! 7. **Keys**: the BTH P_Key matches the QP's partition (IBTA vol. 1 §10.9.3); UD: the DETH
//!    Q_Key equals the QP's (§10.2.4; violations also bump the port's `qkey_viol_cntr`).
//! 8. **ICRC** (IBTA vol. 1 §7.8.1, Annex A17.3.3), over the IP and UDP headers rebuilt from the
//!    datagram's metadata. When the link cannot report the IPv4 identification the ICRC covers
//!    (a kernel UDP socket), the identification that makes the ICRC verify is solved for
//!    ([`roce::icrc::solve_ipv4_ident`]; counted in `icrc_ident_solved`) and the packet is
//!    dropped when none does: 16 of the ICRC's 32 bits still check the packet.
//! 9. **Dispatch**: requests to the responder, responses to the completer, CNPs to the
//!    rate-control hook. A CE-marked packet first queues a CNP (rate-limited per QP).

use core::net::IpAddr;

use roce::opcode::{OpcodeInfo, Operation, Transport};
use roce::packet::{icrc_of_udp_payload, parse_udp_payload, ExtReprs, IpRepr};
use roce::{bth, mad, udp, Error, Gid, Opcode, Psn};

use super::counters::{bump, DropReason};
use super::diag::{DiagKind, DiagRecord};
use super::net::{ip_repr, Route};
use super::{Datagram, PendingCnp, SoftHca};
use crate::verbs::event::{AsyncEventType, EventElement};
use crate::verbs::qp::{QpState, QpType, MIN_QPN};

/// A validated packet, as the state machines see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RxPacket<'a> {
    pub(crate) bth: bth::Repr,
    pub(crate) ext: ExtReprs,
    pub(crate) opcode: Opcode,
    pub(crate) info: OpcodeInfo,
    pub(crate) psn: Psn,
    /// The payload without pad bytes.
    pub(crate) payload: &'a [u8],
    /// The IP header as received (for a UD receive buffer's GRH area).
    pub(crate) ip: IpRepr,
    /// UDP length (header + payload), bytes.
    pub(crate) udp_len: usize,
}

/// A dropped datagram.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rejection {
    pub(crate) reason: DropReason,
    pub(crate) qpn: Option<u32>,
    pub(crate) psn: Option<u32>,
    pub(crate) detail: &'static str,
}

fn reject(reason: DropReason, detail: &'static str) -> Rejection {
    Rejection {
        reason,
        qpn: None,
        psn: None,
        detail,
    }
}

/// Whether two P_Keys match (IBTA vol. 1 §10.9.3): the same partition (low 15 bits, not 0) and at
/// least one full member (bit 15).
pub(crate) fn pkey_matches(a: u16, b: u16) -> bool {
    let (pa, pb) = (a & 0x7fff, b & 0x7fff);
    pa == pb && pa != 0 && (a | b) & 0x8000 != 0
}

/// Whether the operation is a request (handled by the responder).
fn is_request(op: Operation) -> bool {
    matches!(
        op,
        Operation::Send
            | Operation::RdmaWrite
            | Operation::RdmaReadRequest
            | Operation::CompareSwap
            | Operation::FetchAdd
    )
}

fn same_address(a: IpAddr, b: IpAddr) -> bool {
    Gid::from(a) == Gid::from(b)
}

impl SoftHca {
    /// Validates and dispatches one datagram; the caller counts and logs a rejection.
    pub(crate) fn receive(
        &mut self,
        now: super::Instant,
        d: &Datagram<'_>,
    ) -> Result<(), Rejection> {
        if d.dst_port != udp::ROCEV2_PORT {
            return Err(reject(
                DropReason::NotRoce,
                "UDP destination port is not 4791",
            ));
        }
        let parsed = parse_udp_payload(d.payload).map_err(|e| match e {
            Error::BadVersion { .. } => reject(DropReason::Version, "BTH TVer is not 0"),
            Error::UnknownOpcode(_) => reject(DropReason::Opcode, "opcode not used by RoCEv2"),
            _ => reject(DropReason::Length, "headers or pad do not fit the datagram"),
        })?;
        let t = parsed.transport;
        let opcode = t.bth.opcode;
        let info = opcode
            .info()
            .ok_or(reject(DropReason::Opcode, "opcode not used by RoCEv2"))?;
        let dst_gid = Gid::from(d.dst_ip);
        if !self.local_gids.contains(&dst_gid) {
            return Err(reject(
                DropReason::DestinationAddress,
                "destination is not a RoCEv2 GID of the port",
            ));
        }
        let mut ip = ip_repr(
            d.src_ip,
            d.dst_ip,
            d.hop_limit,
            d.dscp,
            d.ecn,
            d.ip_ident.unwrap_or(super::net::IPV4_IDENT),
        )
        .ok_or(reject(
            DropReason::SourceAddress,
            "source and destination addresses of different families",
        ))?;
        let qpn = t.bth.dest_qpn;
        if qpn == mad::GSI_QPN {
            return self.receive_gsi(d, &parsed, &mut ip);
        }
        let with_qp = |reason, detail| Rejection {
            reason,
            qpn: Some(qpn),
            psn: Some(t.bth.psn),
            detail,
        };
        let Some(qp) = (qpn >= MIN_QPN).then(|| self.ctx.qp(qpn)).flatten() else {
            return Err(with_qp(DropReason::Qpn, "no such QP"));
        };
        let qp_type = qp.qp_type();
        let state = qp.state();
        let qkey = qp.attr().qkey;
        let dest_qp_num = qp.attr().dest_qp_num;
        let Some(transport) = self.qp_transport(qpn) else {
            return Err(with_qp(DropReason::Qpn, "no such QP"));
        };
        let (route, pkey) = (transport.route, transport.pkey);
        let cnp = opcode == Opcode::Cnp;
        if !cnp {
            let type_ok = matches!(
                (info.transport, qp_type),
                (Transport::Rc, QpType::Rc)
                    | (Transport::Uc, QpType::Uc)
                    | (Transport::Ud, QpType::Ud)
            );
            if !type_ok {
                return Err(with_qp(
                    DropReason::QpType,
                    "opcode transport differs from the QP type",
                ));
            }
            let request = is_request(info.operation);
            let state_ok = if request {
                matches!(
                    state,
                    QpState::Rtr | QpState::Rts | QpState::Sqd | QpState::Sqe
                )
            } else {
                matches!(state, QpState::Rts | QpState::Sqd)
            };
            if !state_ok {
                return Err(with_qp(
                    DropReason::QpState,
                    "QP state does not accept the packet",
                ));
            }
            if qp_type != QpType::Ud {
                let ok = route.is_some_and(|r: Route| {
                    same_address(r.dst_ip, d.src_ip) && same_address(r.src_ip, d.dst_ip)
                });
                if !ok {
                    return Err(with_qp(
                        DropReason::SourceAddress,
                        "addresses are not the connection's",
                    ));
                }
            }
            if !pkey_matches(t.bth.pkey, pkey) {
                self.ctx.count_port_violation(false);
                return Err(with_qp(
                    DropReason::Pkey,
                    "P_Key does not match the QP's partition",
                ));
            }
            if qp_type == QpType::Ud && t.ext.deth.map(|x| x.qkey) != Some(qkey) {
                self.ctx.count_port_violation(true);
                return Err(with_qp(DropReason::Qkey, "Q_Key does not match the QP's"));
            }
        }
        self.check_icrc(&mut ip, d, parsed.icrc, Some(qpn), Some(t.bth.psn))?;
        bump!(self.counters.rcvd_pkts);
        if cnp {
            bump!(self.counters.cnp_rcvd);
            let rp = self.qp_transport(qpn).and_then(|t| t.rp.as_mut());
            if let Some(rp) = rp {
                rp.on_cnp(now);
                self.after_qp(qpn, now);
            }
            if let Some(hook) = self.rate_control.as_mut() {
                hook.on_cnp(now, qpn);
            }
            return Ok(());
        }
        if d.ecn == roce::ipv4::Ecn::Ce {
            let sender = match qp_type {
                QpType::Ud => t.ext.deth.map_or(0, |x| x.src_qpn),
                _ => dest_qp_num,
            };
            self.queue_cnp(now, qpn, sender, t.bth.pkey, d);
        }
        if state == QpState::Rtr {
            if let Some(tr) = self.qp_transport(qpn) {
                if !tr.comm_est {
                    tr.comm_est = true;
                    self.ctx
                        .record_event(AsyncEventType::CommEst, EventElement::Qp(qpn));
                }
            }
        }
        let pkt = RxPacket {
            bth: t.bth,
            ext: t.ext,
            opcode,
            info,
            psn: Psn::new(t.bth.psn),
            payload: parsed.payload,
            ip,
            udp_len: udp::HEADER_LEN + d.payload.len(),
        };
        let result = match self.split(qpn, now) {
            Some((tr, mut env)) => {
                if is_request(info.operation) {
                    tr.on_request(&mut env, &pkt)
                } else {
                    tr.on_response(&mut env, &pkt)
                }
            }
            None => Err(DropReason::Qpn),
        };
        self.after_qp(qpn, now);
        result.map_err(|reason| {
            let detail = match reason {
                DropReason::UnexpectedResponse => "response matches no outstanding request",
                DropReason::RequestDropped => {
                    "request dropped without effect (resources busy, UC message being dropped, \
                     no or too small UD receive buffer)"
                }
                _ => "malformed request or response",
            };
            with_qp(reason, detail)
        })
    }

    /// Steps 5-9 for QP1, the GSI (module `gsi`): only UD SEND ONLY, P_Key 0xFFFF's partition,
    /// the GSI Q_Key 0x80010000 (IBTA vol. 1 §10.2.4.1; rxe `check_keys`), then the ICRC; the MAD
    /// rules are `SoftHca::gsi_receive`'s.
    fn receive_gsi(
        &mut self,
        d: &Datagram<'_>,
        parsed: &roce::packet::ParsedTransport<'_>,
        ip: &mut IpRepr,
    ) -> Result<(), Rejection> {
        let t = parsed.transport;
        let rej = |reason, detail| Rejection {
            reason,
            qpn: Some(mad::GSI_QPN),
            psn: Some(t.bth.psn),
            detail,
        };
        if t.bth.opcode != Opcode::UdSendOnly {
            return Err(rej(DropReason::QpType, "QP1 takes only UD SEND ONLY"));
        }
        if !pkey_matches(t.bth.pkey, mad::DEFAULT_PKEY) {
            self.ctx.count_port_violation(false);
            return Err(rej(DropReason::Pkey, "P_Key is not the GSI's (0xFFFF)"));
        }
        let Some(deth) = t.ext.deth.filter(|x| x.qkey == mad::GSI_QKEY) else {
            self.ctx.count_port_violation(true);
            return Err(rej(DropReason::Qkey, "Q_Key is not the GSI's (0x80010000)"));
        };
        self.check_icrc(ip, d, parsed.icrc, Some(mad::GSI_QPN), Some(t.bth.psn))?;
        bump!(self.counters.rcvd_pkts);
        self.gsi_receive(d.src_ip, d.dst_ip, deth.src_qpn, parsed.payload);
        Ok(())
    }

    /// Step 8: the ICRC over the IP and UDP headers rebuilt from the datagram's metadata; for
    /// IPv4 from a socket, solved for the identification (module docs). On success `ip` carries
    /// the identification the sender used.
    fn check_icrc(
        &mut self,
        ip: &mut IpRepr,
        d: &Datagram<'_>,
        icrc: u32,
        qpn: Option<u32>,
        psn: Option<u32>,
    ) -> Result<(), Rejection> {
        let rej = |reason, detail| Rejection {
            reason,
            qpn,
            psn,
            detail,
        };
        let udp = udp::Repr {
            src_port: d.src_port,
            dst_port: d.dst_port,
            payload_len: d.payload.len(),
        };
        let computed = icrc_of_udp_payload(&*ip, &udp, d.payload)
            .map_err(|_| rej(DropReason::Length, "datagram too long for its IP header"))?;
        match ip {
            // The identification is unknown (`ip` was built with IPV4_IDENT): solve for it.
            IpRepr::Ipv4(v4) if d.ip_ident.is_none() => {
                // `ip_repr` builds the 20-byte header without options.
                let total_len = roce::ipv4::HEADER_LEN + udp::HEADER_LEN + d.payload.len();
                let solved = roce::icrc::solve_ipv4_ident(total_len, v4.ident, computed, icrc);
                let Some(ident) = solved else {
                    bump!(self.counters.icrc_errors);
                    return Err(rej(
                        DropReason::Icrc,
                        "ICRC does not verify for any IPv4 identification",
                    ));
                };
                // The IP header as sent, for a UD receive buffer's GRH area.
                v4.ident = ident;
                bump!(self.counters.icrc_ident_solved);
            }
            _ => {
                if computed != icrc {
                    bump!(self.counters.icrc_errors);
                    return Err(rej(DropReason::Icrc, "ICRC does not verify"));
                }
            }
        }
        Ok(())
    }

    /// Queues a CNP to `sender` (the QP that sent the CE-marked packet), unless one went to it
    /// from QP `qpn` less than the CNP interval ago (IBTA Annex A17.9.3; rate-limited as NICs
    /// do, e.g. mlx5's `min_time_between_cnps`).
    fn queue_cnp(
        &mut self,
        now: super::Instant,
        qpn: u32,
        sender: u32,
        pkey: u16,
        d: &Datagram<'_>,
    ) {
        let interval = self.config.cnp_interval;
        let full = self.cnps.len() >= self.config.max_pending_cnps;
        let Some(tr) = self.qp_transport(qpn) else {
            return;
        };
        let recent = tr
            .last_cnp
            .is_some_and(|t| now.saturating_duration_since(t) < interval);
        if recent || full {
            bump!(self.counters.cnp_suppressed);
            return;
        }
        tr.last_cnp = Some(now);
        self.cnps.push_back(PendingCnp {
            src_ip: d.dst_ip,
            dst_ip: d.src_ip,
            src_qpn: qpn,
            dest_qpn: sender,
            pkey,
        });
    }

    /// Counts and logs a rejected datagram.
    pub(crate) fn record_drop(&mut self, now: super::Instant, r: Rejection) {
        self.counters.drop(r.reason);
        self.diag.record(DiagRecord {
            time: now,
            kind: DiagKind::Dropped(r.reason),
            qpn: r.qpn,
            psn: r.psn,
            detail: r.detail,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pkey_membership() {
        assert!(pkey_matches(0xffff, 0xffff));
        assert!(
            pkey_matches(0x7fff, 0xffff),
            "limited member meets full member"
        );
        assert!(!pkey_matches(0x7fff, 0x7fff), "two limited members do not");
        assert!(!pkey_matches(0x8001, 0x8002));
        assert!(!pkey_matches(0x8000, 0x8000), "partition 0 is invalid");
    }
}

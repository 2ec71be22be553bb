//! Per-device counters, named as Linux rxe's `hw_counters` are, plus drop counters per receive
//! validation step.
//!
//! `rdma statistic show` (iproute2) and `/sys/class/infiniband/rxe0/ports/1/hw_counters/*` show
//! rxe's counters; this engine keeps the same ones under the same names (rxe
//! `rxe_hw_counters.c`), so tools and dashboards built for rxe read it alike. It adds the ICRC and
//! CNP counters a RoCE NIC reports and one drop counter per validation step ([`DropReason`]).

use core::fmt;

/// Why a received packet was dropped: one reason per receive validation step, in the order the
/// steps run ([`crate::engine`] module docs), then the reasons found while processing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DropReason {
    /// Not RoCEv2: the UDP destination port is not 4791.
    NotRoce = 0,
    /// Too short for its headers, or PadCnt inconsistent with the length (IBTA vol. 1 §9.2).
    Length,
    /// BTH TVer is not 0 (IBTA vol. 1 §9.2).
    Version,
    /// Opcode not defined for RoCEv2 (reserved, RD, manufacturer-specific).
    Opcode,
    /// Destination IP address is not one of the port's RoCEv2 GIDs.
    DestinationAddress,
    /// Destination QPN names no QP (or QP 0, the SMI, which is not offered; QP 1 is the GSI).
    Qpn,
    /// The opcode's transport (RC, UC, UD) differs from the QP's type.
    QpType,
    /// The QP is in a state that does not accept this packet (requests need RTR or later,
    /// responses RTS or SQD).
    QpState,
    /// RC/UC: the source or destination IP address is not the QP's peer / own address.
    SourceAddress,
    /// The BTH P_Key does not match the QP's partition (IBTA vol. 1 §10.9).
    Pkey,
    /// UD: the DETH Q_Key does not match the QP's (IBTA vol. 1 §10.2.4).
    Qkey,
    /// The ICRC does not verify (IBTA vol. 1 §7.8.1, Annex A17.3.3).
    Icrc,
    /// A response (ACK, READ response, atomic ACK) that matches no outstanding request:
    /// duplicate, stale, or for a PSN never sent.
    UnexpectedResponse,
    /// A request that could not be processed now and was dropped without state change
    /// (responder resources or response queue full, UC message being dropped, UD receive
    /// buffer too small or missing); the sender's retry or the datagram semantics cover it.
    RequestDropped,
}

impl DropReason {
    /// Every reason, in declaration order.
    pub const ALL: [DropReason; 14] = [
        DropReason::NotRoce,
        DropReason::Length,
        DropReason::Version,
        DropReason::Opcode,
        DropReason::DestinationAddress,
        DropReason::Qpn,
        DropReason::QpType,
        DropReason::QpState,
        DropReason::SourceAddress,
        DropReason::Pkey,
        DropReason::Qkey,
        DropReason::Icrc,
        DropReason::UnexpectedResponse,
        DropReason::RequestDropped,
    ];

    /// A short snake_case name, for counter listings.
    pub const fn as_str(self) -> &'static str {
        match self {
            DropReason::NotRoce => "drop_not_roce",
            DropReason::Length => "drop_length",
            DropReason::Version => "drop_version",
            DropReason::Opcode => "drop_opcode",
            DropReason::DestinationAddress => "drop_dst_addr",
            DropReason::Qpn => "drop_qpn",
            DropReason::QpType => "drop_qp_type",
            DropReason::QpState => "drop_qp_state",
            DropReason::SourceAddress => "drop_src_addr",
            DropReason::Pkey => "drop_pkey",
            DropReason::Qkey => "drop_qkey",
            DropReason::Icrc => "drop_icrc",
            DropReason::UnexpectedResponse => "drop_unexpected_response",
            DropReason::RequestDropped => "drop_request",
        }
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The device's counters. Every field counts events since the engine was created; all wrap at
/// 2^64 (never in practice).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Packets handed to the link by `poll_transmit` (rxe `sent_pkts`).
    pub sent_pkts: u64,
    /// Packets received that passed validation (rxe `rcvd_pkts`).
    pub rcvd_pkts: u64,
    /// Responder: requests with a PSN before the expected one (rxe `duplicate_request`).
    pub duplicate_request: u64,
    /// Responder: requests with a PSN after the expected one (rxe `out_of_seq_request`).
    pub out_of_seq_request: u64,
    /// Requester: PSN sequence error NAKs received (rxe `rcvd_seq_err`).
    pub rcvd_seq_err: u64,
    /// Requester: RNR NAKs received (rxe `rcvd_rnr_err`).
    pub rcvd_rnr_err: u64,
    /// Responder: RNR NAKs sent (rxe `send_rnr_err`).
    pub send_rnr_err: u64,
    /// Responder: ACKs merged into a later ACK instead of being sent (coalescing). rxe's
    /// `ack_deferred` counts responses its completer had to queue; this engine defers ACKs, not
    /// completer work, so the name carries the closest meaning.
    pub ack_deferred: u64,
    /// Requester: WRs failed with RETRY_EXC_ERR (rxe `retry_exceeded_err`).
    pub retry_exceeded_err: u64,
    /// Requester: WRs failed with RNR_RETRY_EXC_ERR (rxe `retry_rnr_exceeded_err`).
    pub retry_rnr_exceeded_err: u64,
    /// Requester: go-back-N retransmissions started (timeouts, sequence NAKs, implicit NAKs;
    /// rxe `completer_retry_err`).
    pub completer_retry_err: u64,
    /// Packets that could not be built (transmit buffer too small, local protection error while
    /// gathering; rxe `send_err`).
    pub send_err: u64,
    /// Send-queue WRs completed successfully (rxe `rdma_sends`).
    pub rdma_sends: u64,
    /// Receive WRs completed successfully (rxe `rdma_recvs`).
    pub rdma_recvs: u64,
    /// Packets dropped because the ICRC did not verify.
    pub icrc_errors: u64,
    /// IPv4 packets whose link could not report the identification the ICRC covers (a kernel
    /// UDP socket; `Datagram::ip_ident` is `None`) and whose ICRC was verified by solving for
    /// it ([`roce::icrc::solve_ipv4_ident`]: 16 of the ICRC's 32 bits of integrity). Those
    /// for which no identification verifies count in `icrc_errors`. Every packet's ICRC is
    /// checked, on every link.
    pub icrc_ident_solved: u64,
    /// CNPs sent (IBTA Annex A17.9.3).
    pub cnp_sent: u64,
    /// CNPs received (and handed to the rate-control hook).
    pub cnp_rcvd: u64,
    /// CE-marked packets that did not trigger a CNP because one was sent for that QP within the
    /// CNP interval, or the CNP queue was full.
    pub cnp_suppressed: u64,
    /// Completions that could not be queued because their CQ had overrun (the CQ is in error and
    /// an `IBV_EVENT_CQ_ERR` was recorded; they are counted, never silently lost).
    pub cq_overrun_lost: u64,
    /// Packets whose payload a gathering link sends from MR memory in place (zero-copy transmit,
    /// `SoftHca::poll_transmit_gather`).
    pub tx_gathered_pkts: u64,
    /// Packets whose payload was copied from MR memory into the transmit buffer (a copying link,
    /// or memory the CPU cannot address, or more pieces than a gathered packet may have). Inline
    /// data and payload-less packets count in neither.
    pub tx_copied_pkts: u64,
    /// QP1 (GSI): MADs queued for the consumer (`SoftHca::poll_mad`).
    pub gsi_rcvd: u64,
    /// QP1: MADs sent (the consumer's and the GSI's own answers).
    pub gsi_sent: u64,
    /// QP1: requests answered by the GSI itself with an error status (bad version, unsupported
    /// method/attribute; IBTA vol. 1 §13.4.7).
    pub gsi_answered: u64,
    /// QP1: MADs dropped as malformed or unanswerable (not 256 bytes, an unknown non-Get/Set
    /// method, a bad version on a method that gets no answer).
    pub gsi_bad_mad: u64,
    /// QP1: MADs dropped because the receive or send queue was full.
    pub gsi_queue_full: u64,
    drops: [u64; DropReason::ALL.len()],
}

impl Counters {
    /// Packets dropped for `reason`.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    /// All dropped packets.
    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    pub(crate) fn drop(&mut self, reason: DropReason) {
        let slot = &mut self.drops[reason as usize];
        *slot = slot.wrapping_add(1);
    }

    /// Every counter with its name: rxe's names first, then this engine's.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        let named = [
            ("sent_pkts", self.sent_pkts),
            ("rcvd_pkts", self.rcvd_pkts),
            ("duplicate_request", self.duplicate_request),
            ("out_of_seq_request", self.out_of_seq_request),
            ("rcvd_seq_err", self.rcvd_seq_err),
            ("rcvd_rnr_err", self.rcvd_rnr_err),
            ("send_rnr_err", self.send_rnr_err),
            ("ack_deferred", self.ack_deferred),
            ("retry_exceeded_err", self.retry_exceeded_err),
            ("retry_rnr_exceeded_err", self.retry_rnr_exceeded_err),
            ("completer_retry_err", self.completer_retry_err),
            ("send_err", self.send_err),
            ("rdma_sends", self.rdma_sends),
            ("rdma_recvs", self.rdma_recvs),
            ("icrc_errors", self.icrc_errors),
            ("icrc_ident_solved", self.icrc_ident_solved),
            ("cnp_sent", self.cnp_sent),
            ("cnp_rcvd", self.cnp_rcvd),
            ("cnp_suppressed", self.cnp_suppressed),
            ("cq_overrun_lost", self.cq_overrun_lost),
            ("tx_gathered_pkts", self.tx_gathered_pkts),
            ("tx_copied_pkts", self.tx_copied_pkts),
            ("gsi_rcvd", self.gsi_rcvd),
            ("gsi_sent", self.gsi_sent),
            ("gsi_answered", self.gsi_answered),
            ("gsi_bad_mad", self.gsi_bad_mad),
            ("gsi_queue_full", self.gsi_queue_full),
        ];
        named.into_iter().chain(
            DropReason::ALL
                .into_iter()
                .map(|r| (r.as_str(), self.drops(r))),
        )
    }
}

/// Increments a counter field, wrapping.
macro_rules! bump {
    ($counter:expr) => {
        $counter = $counter.wrapping_add(1)
    };
}
pub(crate) use bump;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_drops_sum() {
        let mut c = Counters::default();
        c.drop(DropReason::Icrc);
        c.drop(DropReason::Icrc);
        c.drop(DropReason::Qpn);
        bump!(c.sent_pkts);
        assert_eq!(c.drops(DropReason::Icrc), 2);
        assert_eq!(c.total_drops(), 3);
        let names: std::vec::Vec<_> = c.iter().map(|(n, _)| n).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), names.len());
        assert!(c.iter().any(|(n, v)| n == "sent_pkts" && v == 1));
    }
}

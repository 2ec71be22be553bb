//! What the cases share: one side's objects ([`Side`]), bringing QPs up, posting and polling
//! with results as record text, data patterns and digests.

use std::sync::Arc;
use std::time::Duration;

use gpu_p2p::{HostMemory, Memory};
use hca::soft::DeviceError;
use hca::verbs::connect::{self, ConnectAttr};
use hca::verbs::Verbs;
use hca::{
    AccessFlags, AhAttr, AhHandle, CqHandle, MemoryRegion, PathMtu, PdHandle, QpAttr, QpAttrMask,
    QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr, Sge, SrqAttr, SrqHandle,
    WcFlags, WcOpcode, WcStatus, WorkCompletion,
};

/// Bytes of registered memory per side.
pub(crate) const MEM_LEN: usize = 64 << 10;

/// The Q_Key of the UD cases.
pub(crate) const QKEY: u32 = 0x1111_1111;

/// Adds what failed to a refused setup verb.
pub(crate) trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for Result<T, DeviceError> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// The errno name of a refused verb (`ok` for success), as the record shows it.
pub(crate) fn outcome(r: &Result<(), DeviceError>) -> String {
    match r {
        Ok(()) => "ok".into(),
        Err(e) => errno_name(e),
    }
}

pub(crate) fn errno_name(e: &DeviceError) -> String {
    let Some(errno) = e.errno() else {
        return format!("error({e})");
    };
    let name = match errno {
        libc::EINVAL => "EINVAL",
        libc::ENOMEM => "ENOMEM",
        libc::EBUSY => "EBUSY",
        libc::EPERM => "EPERM",
        libc::EFAULT => "EFAULT",
        libc::ENOENT => "ENOENT",
        libc::EAGAIN => "EAGAIN",
        libc::ENOSYS => "ENOSYS",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        libc::EACCES => "EACCES",
        _ => return format!("errno{errno}"),
    };
    name.into()
}

/// A deterministic byte pattern: `len` bytes for `seed`.
pub(crate) fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed.wrapping_mul(7) ^ ((i >> 8) as u8))
        .collect()
}

/// FNV-1a (64 bits) of `bytes`, as hex: the record's data digest.
pub(crate) fn digest(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

fn opcode_name(op: WcOpcode) -> &'static str {
    match op {
        WcOpcode::Send => "SEND",
        WcOpcode::RdmaWrite => "RDMA_WRITE",
        WcOpcode::RdmaRead => "RDMA_READ",
        WcOpcode::CompSwap => "COMP_SWAP",
        WcOpcode::FetchAdd => "FETCH_ADD",
        WcOpcode::BindMw => "BIND_MW",
        WcOpcode::LocalInv => "LOCAL_INV",
        WcOpcode::Recv => "RECV",
        WcOpcode::RecvRdmaWithImm => "RECV_RDMA_WITH_IMM",
    }
}

/// How a side is built.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SideOpts {
    pub qp_type: QpType,
    pub qps: usize,
    pub srq: bool,
    pub sq_sig_all: bool,
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_sge: u32,
    pub max_inline: u32,
    pub mr_access: AccessFlags,
}

impl SideOpts {
    pub(crate) fn new(qp_type: QpType) -> SideOpts {
        SideOpts {
            qp_type,
            qps: 1,
            srq: false,
            sq_sig_all: false,
            max_send_wr: 16,
            max_recv_wr: 16,
            max_sge: 4,
            max_inline: 0,
            mr_access: AccessFlags::LOCAL_WRITE
                | AccessFlags::REMOTE_WRITE
                | AccessFlags::REMOTE_READ
                | AccessFlags::REMOTE_ATOMIC,
        }
    }
}

/// RC / UC connection parameters (IBTA vol. 1 §11.2.4.2 / ibv_modify_qp(3)).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Conn {
    /// Local ACK timeout exponent: 4.096 us x 2^timeout.
    pub timeout: u8,
    pub retry_cnt: u8,
    /// 7: retry for ever.
    pub rnr_retry: u8,
    pub min_rnr_timer: u8,
}

impl Default for Conn {
    fn default() -> Self {
        Conn {
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 1,
        }
    }
}

/// One side of a case: a PD, a send CQ and a receive CQ, an MR over [`MEM_LEN`] bytes of host
/// memory registered at its own address (so that a hardware backend, which reads inline data
/// from the process, sees the same bytes), optionally an SRQ, and QPs. Dropping it destroys
/// everything in reverse order.
pub(crate) struct Side {
    pub dev: Arc<dyn Verbs>,
    pub label: char,
    pub pd: PdHandle,
    pub scq: CqHandle,
    pub rcq: CqHandle,
    pub mem: Arc<HostMemory>,
    pub mr: MemoryRegion,
    pub extra_lkeys: Vec<u32>,
    pub srq: Option<SrqHandle>,
    pub qps: Vec<u32>,
    pub ahs: Vec<AhHandle>,
    /// The transport of every QP of the side.
    pub qp_type: QpType,
}

impl Side {
    pub(crate) fn new(dev: &Arc<dyn Verbs>, label: char, o: SideOpts) -> Result<Side, String> {
        let dev = dev.clone();
        let pd = dev.alloc_pd().ctx("alloc_pd")?;
        let mem = Arc::new(HostMemory::new(MEM_LEN).map_err(|e| e.to_string())?);
        let iova = mem.as_ptr() as u64;
        let mr = dev
            .reg_mr(pd, mem.clone(), 0, MEM_LEN, iova, o.mr_access)
            .ctx("reg_mr")?;
        let mut side = Side {
            qp_type: o.qp_type,
            pd,
            scq: dev.create_cq(256).ctx("create_cq")?,
            rcq: dev.create_cq(256).ctx("create_cq")?,
            mem,
            extra_lkeys: vec![mr.lkey()],
            mr,
            srq: None,
            qps: Vec::new(),
            ahs: Vec::new(),
            label,
            dev,
        };
        if o.srq {
            let attr = SrqAttr {
                max_wr: o.max_recv_wr,
                max_sge: o.max_sge,
                srq_limit: 0,
            };
            side.srq = Some(side.dev.create_srq(pd, &attr).ctx("create_srq")?);
        }
        for _ in 0..o.qps {
            let init = QpInitAttr {
                qp_type: o.qp_type,
                send_cq: side.scq,
                recv_cq: side.rcq,
                srq: side.srq,
                cap: QpCap {
                    max_send_wr: o.max_send_wr,
                    max_recv_wr: if o.srq { 0 } else { o.max_recv_wr },
                    max_send_sge: o.max_sge,
                    max_recv_sge: if o.srq { 0 } else { o.max_sge },
                    max_inline_data: o.max_inline,
                },
                sq_sig_all: o.sq_sig_all,
            };
            let qpn = side.dev.create_qp(pd, &init).ctx("create_qp")?;
            side.qps.push(qpn);
        }
        Ok(side)
    }

    /// Registers all of the side's memory again with `access` (another MR, another key).
    pub(crate) fn reg(&mut self, access: AccessFlags) -> Result<MemoryRegion, String> {
        let iova = self.mem.as_ptr() as u64;
        let mr = self
            .dev
            .reg_mr(self.pd, self.mem.clone(), 0, MEM_LEN, iova, access)
            .ctx("reg_mr")?;
        self.extra_lkeys.push(mr.lkey());
        Ok(mr)
    }

    pub(crate) fn qp_label(&self, i: usize) -> String {
        format!("{}{i}", self.label)
    }

    /// The I/O virtual address of byte `off` of the side's memory.
    pub(crate) fn addr(&self, off: usize) -> u64 {
        self.mr.iova() + off as u64
    }

    pub(crate) fn sge(&self, off: usize, len: u32) -> Sge {
        Sge {
            addr: self.addr(off),
            length: len,
            lkey: self.mr.lkey(),
        }
    }

    pub(crate) fn fill(&self, off: usize, bytes: &[u8]) -> Result<(), String> {
        self.mem.write(off, bytes).map_err(|e| e.to_string())
    }

    pub(crate) fn read(&self, off: usize, len: usize) -> Result<Vec<u8>, String> {
        let mut v = vec![0; len];
        self.mem.read(off, &mut v).map_err(|e| e.to_string())?;
        Ok(v)
    }

    pub(crate) fn post_send(
        &self,
        qi: usize,
        wr_id: u64,
        sg_list: &[Sge],
        op: SendOp,
        send_flags: SendFlags,
    ) -> Result<(), DeviceError> {
        let wr = SendWr {
            wr_id,
            sg_list,
            op,
            send_flags,
        };
        self.dev.post_send(self.qps[qi], &wr)
    }

    pub(crate) fn post_recv(
        &self,
        qi: usize,
        wr_id: u64,
        sg_list: &[Sge],
    ) -> Result<(), DeviceError> {
        self.dev.post_recv(self.qps[qi], &RecvWr { wr_id, sg_list })
    }

    pub(crate) fn post_srq_recv(&self, wr_id: u64, sg_list: &[Sge]) -> Result<(), String> {
        let srq = self.srq.ok_or("side has no SRQ")?;
        self.dev
            .post_srq_recv(srq, &RecvWr { wr_id, sg_list })
            .ctx("post_srq_recv")
    }

    pub(crate) fn wait_send(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, String> {
        self.dev
            .wait_cq(self.scq, n, timeout)
            .ctx("wait_cq (send CQ)")
    }

    pub(crate) fn wait_recv(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<Vec<WorkCompletion>, String> {
        self.dev
            .wait_cq(self.rcq, n, timeout)
            .ctx("wait_cq (recv CQ)")
    }

    /// The QP's state (ibv_query_qp(3)), as the record shows it.
    pub(crate) fn qp_state(&self, qi: usize) -> String {
        match self.dev.query_qp(self.qps[qi]) {
            Ok((attr, _)) => format!("{:?}", attr.qp_state).to_uppercase(),
            Err(e) => errno_name(&e),
        }
    }

    /// The QP's capabilities as the device provided them (ibv_query_qp(3)).
    pub(crate) fn qp_cap(&self, qi: usize) -> Result<QpCap, String> {
        Ok(self.dev.query_qp(self.qps[qi]).ctx("query_qp")?.0.cap)
    }

    fn modify(&self, qi: usize, attr: &QpAttr, mask: QpAttrMask) -> Result<(), String> {
        self.dev
            .modify_qp(self.qps[qi], attr, mask)
            .map(|_| ())
            .ctx(&format!(
                "modify_qp {} to {:?}",
                self.qp_label(qi),
                attr.qp_state
            ))
    }

    /// Moves QP `qi` to `state` with only the state in the mask (ERR, RESET).
    pub(crate) fn set_state(&self, qi: usize, state: QpState) -> Result<(), String> {
        let attr = QpAttr {
            qp_state: state,
            ..QpAttr::default()
        };
        self.modify(qi, &attr, QpAttrMask::STATE)
    }

    /// Runs the one bring-up ([`connect::bring_up`]) of QP `qi` from `from` to `to` through
    /// [`Side::modify`] (whose error names the QP and the state).
    fn bring_up(
        &self,
        qi: usize,
        attr: &ConnectAttr,
        from: QpState,
        to: QpState,
    ) -> Result<(), String> {
        connect::bring_up(attr, from, to, |qp, mask| self.modify(qi, qp, mask))
            .map_err(|e| e.source)
    }

    /// RESET -> INIT of an RC QP (receives may be posted from INIT on, ibv_post_recv(3)).
    pub(crate) fn set_init(&self, qi: usize) -> Result<(), String> {
        let a = ConnectAttr {
            access: AccessFlags::REMOTE_WRITE,
            ..ConnectAttr::default()
        };
        self.bring_up(qi, &a, QpState::Reset, QpState::Init)
    }

    /// RESET -> INIT -> RTR -> RTS of an RC / UC QP connected to `peer`'s QP `pi` (IBTA vol. 1
    /// §10.3.1; the attribute masks of ibv_modify_qp(3)). PSNs are fixed per side.
    pub(crate) fn connect(&self, qi: usize, peer: &Side, pi: usize, c: Conn) -> Result<(), String> {
        let qp_type = self.dev.query_qp(self.qps[qi]).ctx("query_qp")?.1.qp_type;
        let rc = qp_type == QpType::Rc;
        let (sgid_index, _) = self.dev.default_gid();
        let a = ConnectAttr {
            qp_type,
            access: if rc {
                AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_ATOMIC
            } else {
                AccessFlags::REMOTE_WRITE
            },
            path_mtu: PathMtu::Mtu1024,
            ah_attr: ConnectAttr::av(peer.dev.default_gid().1, sgid_index as u8, 64, 0),
            remote_qpn: peer.qps[pi],
            remote_psn: psn(peer.label, pi),
            local_psn: psn(self.label, qi),
            max_dest_rd_atomic: 4,
            min_rnr_timer: c.min_rnr_timer,
            timeout: c.timeout,
            retry_cnt: c.retry_cnt,
            rnr_retry: c.rnr_retry,
            max_rd_atomic: 4,
            ..ConnectAttr::default()
        };
        self.bring_up(qi, &a, QpState::Reset, QpState::Rts)
    }

    /// RESET -> INIT -> RTR -> RTS of a UD QP with Q_Key [`QKEY`].
    pub(crate) fn ud_up(&self, qi: usize) -> Result<(), String> {
        let a = ConnectAttr {
            qp_type: QpType::Ud,
            qkey: QKEY,
            local_psn: psn(self.label, qi),
            ..ConnectAttr::default()
        };
        self.bring_up(qi, &a, QpState::Reset, QpState::Rts)
    }

    /// An address handle to `peer`'s device (its default GID), hop limit 64.
    pub(crate) fn ah_to(&mut self, peer: &Side) -> Result<AhHandle, String> {
        let attr = AhAttr {
            dgid: peer.dev.default_gid().1,
            sgid_index: self.dev.default_gid().0 as u8,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        };
        let ah = self.dev.create_ah(self.pd, &attr).ctx("create_ah")?;
        self.ahs.push(ah);
        Ok(ah)
    }
}

impl Drop for Side {
    fn drop(&mut self) {
        // Teardown errors cannot change what the case observed; a leak on a refused destroy is
        // the backend's to report.
        for &qpn in &self.qps {
            let _ = self.dev.destroy_qp(qpn);
        }
        for &ah in &self.ahs {
            let _ = self.dev.destroy_ah(ah);
        }
        if let Some(srq) = self.srq {
            let _ = self.dev.destroy_srq(srq);
        }
        for &lkey in &self.extra_lkeys {
            let _ = self.dev.dereg_mr(lkey);
        }
        let _ = self.dev.destroy_cq(self.scq);
        let _ = self.dev.destroy_cq(self.rcq);
        let _ = self.dev.dealloc_pd(self.pd);
    }
}

/// The fixed initial PSN of a side's QP.
fn psn(label: char, qi: usize) -> u32 {
    (u32::from(label) << 12) | (qi as u32 * 0x10)
}

/// A completion as the record shows it, QPNs named by role (`a0`, `b1`; `?` for a QPN the side
/// does not have): `qp_num` among the QPs of `own` (the side whose CQ it came from), `src_qp`
/// among those of `peer`. Only what the verbs define is shown: per ibv_poll_cq(3), an error
/// completion has only `wr_id`, status and QP valid; `byte_len`, the immediate data and the
/// WITH_IMM / WITH_INV flags are outputs of receive completions (IBTA vol. 1 11.4.2.1, Poll for
/// Completion), so a send completion shows its opcode only; the GRH flag and `src_qp` are
/// "valid only for UD QPs" (ibv_poll_cq(3)), so an RC / UC receive shows neither (rxe sets the
/// GRH flag on every RoCE receive and WITH_IMM on the send completion of a WR with immediate).
pub(crate) fn wc_text(wc: &WorkCompletion, own: &Side, peer: &Side) -> String {
    let name = |side: &Side, qpn: u32| {
        side.qps
            .iter()
            .position(|&q| q == qpn)
            .map_or_else(|| "?".into(), |i| side.qp_label(i))
    };
    let mut t = format!(
        "{:?} wr={} qp={}",
        wc.status,
        wc.wr_id,
        name(own, wc.qp_num)
    );
    if wc.status != WcStatus::Success {
        return t;
    }
    t.push_str(&format!(" op={}", opcode_name(wc.opcode)));
    if !wc.opcode.is_recv() {
        return t;
    }
    t.push_str(&format!(" len={}", wc.byte_len));
    let ud = own.qp_type == QpType::Ud;
    if let Some(imm) = wc.imm_data {
        t.push_str(&format!(" imm={imm:#x}"));
    }
    let mut flags = Vec::new();
    if ud && wc.wc_flags.contains(WcFlags::GRH) {
        flags.push("GRH");
    }
    if wc.wc_flags.contains(WcFlags::WITH_IMM) {
        flags.push("WITH_IMM");
    }
    if wc.wc_flags.contains(WcFlags::WITH_INV) {
        flags.push("WITH_INV");
    }
    if !flags.is_empty() {
        t.push_str(&format!(" flags={}", flags.join("|")));
    }
    if ud && wc.wc_flags.contains(WcFlags::GRH) {
        t.push_str(&format!(" src_qp={}", name(peer, wc.src_qp)));
    }
    t
}

/// Records completions under `key.0`, `key.1`, ... and their count under `key.n`.
pub(crate) fn record_wcs(
    r: &mut super::Record,
    key: &str,
    wcs: &[WorkCompletion],
    own: &Side,
    peer: &Side,
) {
    r.set(format!("{key}.n"), wcs.len());
    for (i, wc) in wcs.iter().enumerate() {
        r.set(format!("{key}.{i}"), wc_text(wc, own, peer));
    }
}

/// Checks the statuses and `wr_id`s of completions against `want`, in order.
pub(crate) fn expect_wcs(
    r: &mut super::Record,
    what: &str,
    wcs: &[WorkCompletion],
    want: &[(u64, WcStatus)],
) {
    let got: Vec<(u64, WcStatus)> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
    r.expect_eq(what, got, want.to_vec());
}

//! The `responder` fuzz target: a peer that lies, against one software HCA ([`hca::SoftHca`], the
//! no_std engine, no sockets) holding memory regions.
//!
//! Set-up, the same for every input: an RC, a UC and a UD QP in RTS, the RC and UC ones connected
//! to a fixed peer; one host memory buffer of five pages, filled with a known pattern:
//!
//! ```text
//! page 0: guard (not registered)
//! page 1: MR "remote", LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ | REMOTE_ATOMIC, IOVA REMOTE_IOVA
//! page 2: guard (not registered)
//! page 3: MR "local",  LOCAL_WRITE only, IOVA REMOTE_IOVA + PAGE (right after the remote MR)
//! page 4: guard (not registered)
//! ```
//!
//! The input is read as a sequence of steps (structure-aware): crafted RoCEv2 packets (the opcode,
//! a PSN near the expected one, the QPN among the real ones or random, the R_Key among the real
//! keys or random, VA and DMA length near and across the MR bounds, payload bytes, ECN, and a
//! valid ICRC most of the time, a corrupted one sometimes), packets with header bytes overwritten
//! (ICRC recomputed or not), `poll_transmit` drains, time steps with `handle_timeout`, receive
//! posts (inside the remote MR, or with bad keys or bounds), and RDMA WRITE / READ posts of the
//! engine's own. After every step:
//!
//! * no panic (implicit);
//! * the guard pages and the LOCAL_WRITE-only MR are byte-identical to the pattern;
//! * every byte of the remote MR that changed lies inside the range of a WRITE (RETH) or atomic
//!   (AtomicETH) sent so far with the remote MR's R_Key, a receive buffer posted in it, or the
//!   local buffer of one of the engine's READs;
//! * bounded output: a `poll_transmit` drain ends (under [`MAX_DRAIN`] packets), and the CQ never
//!   holds more completions than work requests were posted.
//!
//! Run (libFuzzer needs nightly flags; `RUSTC_BOOTSTRAP=1` lets a stable toolchain accept them):
//!
//! ```text
//! cargo install cargo-fuzz
//! cd hca && RUSTC_BOOTSTRAP=1 cargo fuzz run responder -- -max_total_time=600
//! ```
//!
//! The minimized corpus is `hca/fuzz/corpus/responder/`.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use gpu_p2p::{HostMemory, Memory};
use hca::engine::{IPV4_IDENT, MAX_UDP_PAYLOAD};
use hca::verbs::connect::{self, ConnectAttr};
use hca::verbs::random::RandomSource;
use hca::{
    AccessFlags, CqHandle, Datagram, Device, EngineConfig, Gid, GidEntry, GidType, Instant,
    MemoryRegion, PathMtu, QpCap, QpInitAttr, QpState, QpType, RecvWr, SendFlags, SendOp, SendWr,
    Sge, SoftHca, WorkCompletion,
};
use roce::opcode::{ExtHeaders, Transport};
use roce::packet::{ExtReprs, TransportRepr};
use roce::{aeth, atomic_eth, bth, deth, ieth, immdt, reth, Opcode};

/// Bytes per page of the memory buffer.
pub const PAGE: usize = 4096;
/// IOVA of the remote-access MR; the LOCAL_WRITE-only MR follows it.
pub const REMOTE_IOVA: u64 = 0x10_0000;
/// Path MTU of the connections, bytes.
pub const PMTU: usize = 1024;
/// The most packets one `poll_transmit` drain may give before it counts as unbounded.
pub const MAX_DRAIN: usize = 4096;
/// The most steps one input runs.
const MAX_STEPS: usize = 256;
/// Peer QPNs of the RC and UC connections.
const PEER_RC_QPN: u32 = 0x123;
const PEER_UC_QPN: u32 = 0x124;
/// The PSN the RC and UC responders expect first (near the 24-bit wrap).
const PEER_PSN: u32 = 0xff_fff0;
const QKEY: u32 = 0x1111_1111;
const PEER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const LOCAL_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);

/// The byte at offset `i` of the buffer before anything ran.
fn pattern(i: usize) -> u8 {
    (i as u8).wrapping_mul(31) ^ ((i >> 8) as u8) ^ 0xa5
}

/// Reads the fuzz input as numbers; past its end everything is zero.
struct Input<'a> {
    data: &'a [u8],
    pos: usize,
}

impl Input<'_> {
    fn done(&self) -> bool {
        self.pos >= self.data.len()
    }
    fn u8(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos += 1;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.u8()).collect()
    }
}

/// Opcodes thrown at the responder: every named one (a raw byte picks any other).
const OPCODES: &[Opcode] = &Opcode::ALL;

/// The engine under test and what the checks need.
struct Harness {
    hca: SoftHca,
    mem: Arc<HostMemory>,
    remote: MemoryRegion,
    local: MemoryRegion,
    cq: CqHandle,
    /// RC, UC, UD QPNs.
    qpns: [u32; 3],
    /// The PSN each of the RC and UC responders should expect next, as far as this side knows.
    next_psn: [u32; 2],
    /// Bytes of the remote MR that some packet or work request may legitimately have changed.
    allowed: Vec<bool>,
    now: u64,
    posted_wrs: usize,
    completions: usize,
    wr_id: u64,
    buf: Vec<u8>,
}

fn qp_attr(qp_type: QpType, cq: CqHandle) -> QpInitAttr {
    QpInitAttr {
        qp_type,
        send_cq: cq,
        recv_cq: cq,
        srq: None,
        cap: QpCap {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        sq_sig_all: false,
    }
}

/// The harness's keys and QPNs: deterministic (splitmix64 from a fixed seed), so that an input
/// replays the same engine every time. The harness reads every key and QPN back from the engine
/// and assumes none; a peer must never be able to predict them in a real device (which draws
/// them from the OS, `hca::verbs::random::OsRandom`), but a fuzz input is no peer.
struct FuzzRandom(u64);

impl RandomSource for FuzzRandom {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            *b = (z ^ (z >> 31)) as u8;
        }
    }
}

impl Harness {
    fn new() -> Harness {
        let ip = IpAddr::V4(LOCAL_IP);
        let mut hca = SoftHca::with_random(
            Device::soft_roce([2, 0, 10, 0, 0, 1], 9000),
            EngineConfig::default(),
            Box::new(FuzzRandom(0x5eed)),
        );
        let sgid = hca
            .add_gid(
                1,
                GidEntry {
                    gid: Gid::from(ip),
                    gid_type: GidType::RoceV2,
                },
            )
            .unwrap();
        let pd = hca.alloc_pd().unwrap();
        let cq = hca.create_cq(256).unwrap();
        let mem = Arc::new(HostMemory::new(5 * PAGE).unwrap());
        let fill: Vec<u8> = (0..5 * PAGE).map(pattern).collect();
        mem.write(0, &fill).unwrap();
        let remote = hca
            .reg_mr_range(
                pd,
                mem.clone(),
                PAGE,
                PAGE,
                REMOTE_IOVA,
                AccessFlags::LOCAL_WRITE
                    | AccessFlags::REMOTE_WRITE
                    | AccessFlags::REMOTE_READ
                    | AccessFlags::REMOTE_ATOMIC,
            )
            .unwrap();
        let local = hca
            .reg_mr_range(
                pd,
                mem.clone(),
                3 * PAGE,
                PAGE,
                REMOTE_IOVA + PAGE as u64,
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap();
        let mut qpns = [0; 3];
        for (i, (t, peer)) in [
            (QpType::Rc, PEER_RC_QPN),
            (QpType::Uc, PEER_UC_QPN),
            (QpType::Ud, 0),
        ]
        .into_iter()
        .enumerate()
        {
            let qpn = hca.create_qp(pd, &qp_attr(t, cq)).unwrap();
            let a = ConnectAttr {
                qp_type: t,
                access: if t == QpType::Uc {
                    AccessFlags::REMOTE_WRITE
                } else {
                    AccessFlags::REMOTE_WRITE
                        | AccessFlags::REMOTE_READ
                        | AccessFlags::REMOTE_ATOMIC
                },
                qkey: QKEY,
                path_mtu: PathMtu::Mtu1024,
                ah_attr: ConnectAttr::av(Gid::from(IpAddr::V4(PEER_IP)), sgid as u8, 64, 0),
                remote_qpn: peer,
                remote_psn: PEER_PSN,
                local_psn: 0x10,
                max_dest_rd_atomic: 4,
                min_rnr_timer: 1,
                timeout: 8,
                retry_cnt: 3,
                rnr_retry: 3,
                max_rd_atomic: 4,
                ..ConnectAttr::default()
            };
            connect::bring_up(&a, QpState::Reset, QpState::Rts, |qp, mask| {
                hca.modify_qp(qpn, qp, mask).map(|_| ())
            })
            .unwrap();
            qpns[i] = qpn;
        }
        while hca.poll_event().is_some() {}
        let mut h = Harness {
            hca,
            mem,
            remote,
            local,
            cq,
            qpns,
            next_psn: [PEER_PSN; 2],
            allowed: vec![false; PAGE],
            now: 0,
            posted_wrs: 0,
            completions: 0,
            wr_id: 0,
            buf: vec![0; MAX_UDP_PAYLOAD],
        };
        // Receive buffers to start with: two per QP, each 1 KiB of the remote MR.
        for (q, qpn) in qpns.into_iter().enumerate() {
            for k in 0..2u64 {
                let off = (q as u64 * 2 + k) * 512;
                let sge = Sge {
                    addr: REMOTE_IOVA + off,
                    length: 1024,
                    lkey: h.remote.lkey(),
                };
                h.post_recv(qpn, &[sge]);
            }
        }
        h
    }

    /// Marks `[iova, iova + len)` (clipped to the remote MR) as legitimately writable.
    fn allow(&mut self, iova: u64, len: u64) {
        let start = iova.max(REMOTE_IOVA);
        let end = iova.saturating_add(len).min(REMOTE_IOVA + PAGE as u64);
        for a in start..end.max(start) {
            self.allowed[(a - REMOTE_IOVA) as usize] = true;
        }
    }

    fn post_recv(&mut self, qpn: u32, sges: &[Sge]) {
        self.wr_id += 1;
        let ok = self
            .hca
            .post_recv(
                qpn,
                &RecvWr {
                    wr_id: self.wr_id,
                    sg_list: sges,
                },
            )
            .is_ok();
        if ok {
            self.posted_wrs += 1;
            for s in sges {
                if s.lkey == self.remote.lkey() {
                    self.allow(s.addr, u64::from(s.length));
                }
            }
        }
    }

    fn sge_from(&mut self, inp: &mut Input<'_>) -> Sge {
        let kind = inp.u8();
        let off = u64::from(inp.u16()) % (PAGE as u64 + 64);
        let length = match kind & 3 {
            0 => u32::from(inp.u16()) % (PAGE as u32 + 64),
            1 => 64,
            2 => PAGE as u32,
            _ => inp.u32(),
        };
        let (addr, lkey) = match (kind >> 2) & 7 {
            // The local-only MR's lkey is legitimate for a receive, but would let the engine write
            // it: receives there are exercised with a bad length only (refused at post).
            0 => (REMOTE_IOVA + PAGE as u64 + off, self.local.lkey()),
            1 => (REMOTE_IOVA + off, self.remote.rkey()),
            2 => (REMOTE_IOVA + off, inp.u32()),
            3 => (inp.u64(), self.remote.lkey()),
            _ => (REMOTE_IOVA + off, self.remote.lkey()),
        };
        if lkey == self.local.lkey() {
            return Sge {
                addr,
                length: u32::MAX,
                lkey,
            };
        }
        Sge { addr, length, lkey }
    }

    fn step(&mut self, inp: &mut Input<'_>) {
        match inp.u8() % 16 {
            0..=8 => self.crafted(inp),
            9 => self.raw(inp),
            10 => self.drain(),
            11 => {
                let dt = match inp.u8() & 3 {
                    0 => u64::from(inp.u8()) * 1_000,
                    1 => u64::from(inp.u16()) * 1_000_000,
                    _ => 0,
                };
                self.now = self.now.saturating_add(dt);
                if let Some(t) = self.hca.poll_timeout() {
                    if inp.u8() & 1 == 1 {
                        self.now = self.now.max(t.as_nanos());
                    }
                }
                self.hca.handle_timeout(Instant::from_nanos(self.now));
            }
            12 => {
                let q = usize::from(inp.u8() % 4);
                let qpn = if q < 3 { self.qpns[q] } else { inp.u32() };
                let n = usize::from(inp.u8() % 3) + 1;
                let sges: Vec<Sge> = (0..n).map(|_| self.sge_from(inp)).collect();
                self.post_recv(qpn, &sges);
            }
            13 => self.post_send(inp),
            14 => self.poll_cq(),
            _ => {
                // A burst: the same crafted packet shape several times.
                let n = inp.u8() % 8;
                let at = inp.pos;
                for _ in 0..n {
                    inp.pos = at;
                    self.crafted(inp);
                }
            }
        }
    }

    /// The engine posts an RDMA WRITE (from the remote MR) or READ (into it) to its RC peer.
    fn post_send(&mut self, inp: &mut Input<'_>) {
        let kind = inp.u8();
        let off = u64::from(inp.u16()) % PAGE as u64;
        let len = u32::from(inp.u16()) % (PAGE as u32 - off as u32 + 1);
        let sge = [Sge {
            addr: REMOTE_IOVA + off,
            length: len,
            lkey: self.remote.lkey(),
        }];
        let remote_addr = inp.u64();
        let rkey = inp.u32();
        let op = if kind & 1 == 0 {
            SendOp::RdmaWrite { remote_addr, rkey }
        } else {
            SendOp::RdmaRead { remote_addr, rkey }
        };
        self.wr_id += 1;
        let wr = SendWr {
            wr_id: self.wr_id,
            sg_list: &sge,
            op,
            send_flags: SendFlags::SIGNALED,
        };
        let qpn = self.qpns[usize::from(kind >> 1) % 2];
        if self.hca.post_send(qpn, &wr).is_ok() {
            self.posted_wrs += 1;
            if kind & 1 == 1 {
                self.allow(REMOTE_IOVA + off, u64::from(len));
            }
        }
    }

    fn poll_cq(&mut self) {
        let mut wcs = [WorkCompletion::success(0, hca::WcOpcode::Send, 0, 0); 32];
        loop {
            let n = self.hca.poll_cq(self.cq, &mut wcs).unwrap();
            self.completions += n;
            assert!(
                self.completions <= self.posted_wrs,
                "{} completions for {} work requests",
                self.completions,
                self.posted_wrs
            );
            if n < wcs.len() {
                return;
            }
        }
    }

    fn drain(&mut self) {
        for _ in 0..MAX_DRAIN {
            if self
                .hca
                .poll_transmit(Instant::from_nanos(self.now), &mut self.buf)
                .is_none()
            {
                return;
            }
        }
        panic!("poll_transmit gave {MAX_DRAIN} packets in a row");
    }

    fn deliver(&mut self, payload: &[u8], inp: &mut Input<'_>, meta: u8) {
        self.now += 100;
        let src_ip = if meta & 0x40 != 0 && meta & 0x20 != 0 {
            IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3))
        } else {
            IpAddr::V4(PEER_IP)
        };
        let ecn = if meta & 0x10 != 0 {
            roce::ipv4::Ecn::Ce
        } else {
            roce::ipv4::Ecn::NotEct
        };
        let _ = inp;
        self.hca.handle_datagram(
            Instant::from_nanos(self.now),
            &Datagram {
                src_ip,
                dst_ip: IpAddr::V4(LOCAL_IP),
                src_port: 0xc000,
                dst_port: 4791,
                ecn,
                dscp: 0,
                hop_limit: 64,
                ip_ident: Some(IPV4_IDENT),
                payload,
            },
        );
    }

    fn rkey(&self, inp: &mut Input<'_>) -> u32 {
        match inp.u8() % 8 {
            0..=3 => self.remote.rkey(),
            4 => self.local.rkey(),
            5 => self.remote.rkey() ^ 0x100,
            6 => self.remote.rkey().wrapping_add(1),
            _ => inp.u32(),
        }
    }

    fn va(&self, inp: &mut Input<'_>) -> u64 {
        let base = match inp.u8() % 8 {
            0..=2 => REMOTE_IOVA,
            3 => REMOTE_IOVA + PAGE as u64,
            4 => REMOTE_IOVA + 2 * PAGE as u64,
            5 => 0,
            6 => u64::MAX,
            _ => return inp.u64(),
        };
        base.wrapping_add(i64::from(inp.u16() as i16) as u64)
    }

    fn dma_len(&self, inp: &mut Input<'_>, payload: usize) -> u32 {
        match inp.u8() % 8 {
            0..=3 => payload as u32,
            4 => 0,
            5 => u32::from(inp.u16()),
            6 => PAGE as u32 + 1,
            _ => inp.u32(),
        }
    }

    /// A packet with headers chosen from the input and a valid ICRC (corrupted sometimes).
    fn crafted(&mut self, inp: &mut Input<'_>) {
        let meta = inp.u8();
        let op_byte = inp.u8();
        let opcode = if op_byte < 0xf0 {
            OPCODES[usize::from(op_byte) % OPCODES.len()]
        } else {
            Opcode::from(inp.u8())
        };
        let q = match meta & 7 {
            0..=4 => match opcode.transport() {
                Transport::Uc => 1,
                Transport::Ud => 2,
                _ => 0,
            },
            5 => usize::from(inp.u8() % 3),
            6 => 3,
            _ => 4,
        };
        let dest_qpn = match q {
            0..=2 => self.qpns[q],
            3 => inp.u32() & 0xff_ffff,
            _ => 1,
        };
        let psn_kind = inp.u8();
        let expected = if q < 2 { self.next_psn[q] } else { 0 };
        let psn = match psn_kind % 8 {
            0..=4 => expected,
            5 => expected.wrapping_sub(u32::from(inp.u8() % 8) + 1),
            6 => expected.wrapping_add(u32::from(inp.u8() % 8) + 1),
            _ => inp.u32(),
        } & 0xff_ffff;
        let plen_kind = inp.u8();
        let payload_len = match plen_kind % 8 {
            0 => 0,
            1 => 8,
            2 => PMTU,
            3 => PMTU + 1,
            4 | 5 => usize::from(inp.u8()),
            _ => usize::from(inp.u16()) % (PMTU + 64),
        };
        let payload = if plen_kind & 0x80 != 0 {
            inp.bytes(payload_len)
        } else {
            vec![inp.u8(); payload_len]
        };
        let opcode_payload = if opcode.has_payload() || opcode == Opcode::Cnp {
            payload
        } else {
            Vec::new()
        };
        let headers = opcode.ext_headers();
        let mut ext = ExtReprs::default();
        if headers.contains(ExtHeaders::DETH) {
            let qkey = if inp.u8() & 3 == 0 { inp.u32() } else { QKEY };
            ext.deth = Some(deth::Repr {
                qkey,
                src_qpn: inp.u32() & 0xff_ffff,
            });
        }
        if headers.contains(ExtHeaders::RETH) {
            let rkey = self.rkey(inp);
            let va = self.va(inp);
            let dma_len = self.dma_len(inp, opcode_payload.len());
            if rkey == self.remote.rkey() && opcode.is_write() {
                self.allow(va, u64::from(dma_len));
            }
            ext.reth = Some(reth::Repr {
                virtual_address: va,
                rkey,
                dma_len,
            });
        }
        if headers.contains(ExtHeaders::ATOMIC_ETH) {
            let rkey = self.rkey(inp);
            let va = self.va(inp);
            if rkey == self.remote.rkey() {
                self.allow(va, 8);
            }
            ext.atomic_eth = Some(atomic_eth::request::Repr {
                virtual_address: va,
                rkey,
                swap_add_data: inp.u64(),
                compare_data: inp.u64(),
            });
        }
        if headers.contains(ExtHeaders::AETH) {
            ext.aeth = Some(aeth::Repr {
                syndrome: aeth::Syndrome::from_byte(inp.u8()),
                msn: inp.u32() & 0xff_ffff,
            });
        }
        if headers.contains(ExtHeaders::ATOMIC_ACK_ETH) {
            ext.atomic_ack_eth = Some(atomic_eth::ack::Repr {
                orig_remote_data: inp.u64(),
            });
        }
        if headers.contains(ExtHeaders::IMMDT) {
            ext.immdt = Some(immdt::Repr {
                imm_data: inp.u32(),
            });
        }
        if headers.contains(ExtHeaders::IETH) {
            ext.ieth = Some(ieth::Repr {
                rkey: self.rkey(inp),
            });
        }
        let transport = TransportRepr {
            bth: bth::Repr {
                opcode,
                solicited: meta & 0x08 != 0,
                mig_req: false,
                pad_cnt: 0,
                pkey: if meta & 0x40 != 0 && meta & 0x20 == 0 {
                    0x7fff
                } else {
                    0xffff
                },
                fecn: false,
                becn: false,
                dest_qpn,
                ack_req: meta & 0x80 != 0,
                psn,
            },
            ext,
        };
        let Some(mut packet) = build(transport, &opcode_payload) else {
            return;
        };
        if q < 2 && psn == expected {
            self.next_psn[q] = (expected + 1) & 0xff_ffff;
        }
        // About one packet in sixteen has a corrupted byte (and so a bad ICRC, or a bad header
        // under a recomputed one).
        let corrupt = inp.u8();
        if corrupt & 0x0f == 0 {
            let at = usize::from(inp.u16()) % packet.len();
            packet[at] ^= inp.u8() | 1;
            if corrupt & 0x10 != 0 {
                fix_icrc(&mut packet);
            }
        }
        self.deliver(&packet, inp, meta);
    }

    /// Header bytes overwritten in a packet of the RC QP, the ICRC fixed or not.
    fn raw(&mut self, inp: &mut Input<'_>) {
        let len = usize::from(inp.u16()) % 1200;
        let mut packet = inp.bytes(len);
        if packet.len() >= 12 && inp.u8() & 1 == 0 {
            // Point the BTH at a real QP.
            let qpn = self.qpns[usize::from(packet[0]) % 3];
            packet[5..8].copy_from_slice(&qpn.to_be_bytes()[1..]);
        }
        if packet.len() >= 16 && inp.u8() & 1 == 0 {
            fix_icrc(&mut packet);
        }
        let meta = inp.u8();
        self.deliver(&packet, inp, meta);
    }

    fn check(&self) {
        let mut now = vec![0u8; 5 * PAGE];
        self.mem.read(0, &mut now).unwrap();
        for (i, &b) in now.iter().enumerate() {
            if b == pattern(i) {
                continue;
            }
            let page = i / PAGE;
            assert!(
                page == 1,
                "byte {i:#x} (page {page}: {}) changed from {:#04x} to {b:#04x}",
                if page == 3 {
                    "the LOCAL_WRITE-only MR"
                } else {
                    "unregistered guard"
                },
                pattern(i)
            );
            assert!(
                self.allowed[i - PAGE],
                "byte {:#x} of the remote MR changed from {:#04x} to {b:#04x} though no WRITE, \
                 atomic, receive or READ named it",
                i - PAGE,
                pattern(i)
            );
        }
    }
}

/// Builds the UDP payload (BTH through ICRC) of a packet from the peer; `None` where the headers
/// cannot be built for the opcode.
fn build(transport: TransportRepr, payload: &[u8]) -> Option<Vec<u8>> {
    let repr = roce::packet::PacketRepr {
        ip: roce::packet::IpRepr::Ipv4(roce::ipv4::Repr {
            src_addr: PEER_IP,
            dst_addr: LOCAL_IP,
            protocol: roce::ipv4::IpProtocol::Udp,
            payload_len: 0,
            hop_limit: 64,
            dscp: 0,
            ecn: roce::ipv4::Ecn::NotEct,
            ident: IPV4_IDENT,
            dont_frag: true,
        }),
        udp_src_port: 0xc000,
        udp_checksum: false,
        transport,
    };
    let mut out = vec![0u8; payload.len() + 128];
    let len = roce::packet::build_udp_payload(&repr, &[payload], &mut out).ok()?;
    out.truncate(len);
    Some(out)
}

/// Recomputes the ICRC (the last four bytes) of a UDP payload from the peer to this engine.
fn fix_icrc(udp_payload: &mut [u8]) {
    let total = 28 + udp_payload.len();
    let mut ip = vec![0u8; total];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&IPV4_IDENT.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = 17;
    ip[12..16].copy_from_slice(&PEER_IP.octets());
    ip[16..20].copy_from_slice(&LOCAL_IP.octets());
    ip[20..22].copy_from_slice(&0xc000u16.to_be_bytes());
    ip[22..24].copy_from_slice(&4791u16.to_be_bytes());
    ip[24..26].copy_from_slice(&((8 + udp_payload.len()) as u16).to_be_bytes());
    ip[28..].copy_from_slice(udp_payload);
    if roce::icrc::write(&mut ip).is_ok() {
        udp_payload.copy_from_slice(&ip[28..]);
    }
}

/// Runs one fuzz input; panics on a violated property.
pub fn run(data: &[u8]) {
    let mut h = Harness::new();
    let mut inp = Input { data, pos: 0 };
    for _ in 0..MAX_STEPS {
        if inp.done() {
            break;
        }
        h.step(&mut inp);
        h.check();
    }
    h.drain();
    h.hca
        .handle_timeout(Instant::from_nanos(h.now + 60_000_000_000));
    h.drain();
    h.poll_cq();
    h.check();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `fix_icrc` computes what the packet builder does, so raw packets with a fixed ICRC reach
    /// the transport checks.
    #[test]
    fn fix_icrc_matches_the_builder() {
        let transport = TransportRepr {
            bth: bth::Repr {
                opcode: Opcode::RcSendOnly,
                solicited: false,
                mig_req: false,
                pad_cnt: 0,
                pkey: 0xffff,
                fecn: false,
                becn: false,
                dest_qpn: 0x11,
                ack_req: true,
                psn: 5,
            },
            ext: ExtReprs::default(),
        };
        let built = build(transport, &[1, 2, 3, 4, 5]).unwrap();
        let mut fixed = built.clone();
        let n = fixed.len();
        fixed[n - 4..].fill(0);
        fix_icrc(&mut fixed);
        assert_eq!(built, fixed);
    }

    /// A well-formed RDMA WRITE ONLY at the expected PSN lands in the remote MR: crafted packets
    /// reach the responder.
    #[test]
    fn a_valid_write_lands() {
        let write_only = OPCODES
            .iter()
            .position(|o| *o == Opcode::RcRdmaWriteOnly)
            .unwrap() as u8;
        // crafted; meta (ack_req, QP by transport); opcode; PSN as expected; 8 bytes of 0x77;
        // RETH: the remote R_Key, REMOTE_IOVA + 0, DMA length = payload; no corruption.
        let input = [0, 0x80, write_only, 0, 1, 0x77, 0, 0, 0, 0, 0, 0x01];
        let mut h = Harness::new();
        let mut inp = Input {
            data: &input,
            pos: 0,
        };
        h.step(&mut inp);
        h.check();
        let mut got = [0u8; 8];
        h.mem.read(PAGE, &mut got).unwrap();
        assert_eq!(got, [0x77; 8]);
    }

    /// Empty and arbitrary inputs run (the target's smoke test on stable).
    #[test]
    fn some_inputs_run() {
        run(&[]);
        let mut x = 0x1234_5678u32;
        for _ in 0..200 {
            let data: Vec<u8> = (0..600)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect();
            run(&data);
        }
    }
}

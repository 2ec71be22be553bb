//! Transmit (`engine/tx.rs`, `engine/net.rs`): building packets into the caller's buffer, and
//! zero-copy transmit (`SoftHca::poll_transmit_gather`): payloads leave from MR memory in place,
//! the ICRC covers the bytes the link will send, and copying stays for what cannot be gathered.

mod common;

use std::sync::Arc;

use common::work_requests::*;
use common::*;
use gpu_p2p::{HostMemory, Memory, MemoryError, MemoryKind};
use hca::engine::{GatherTransmit, MAX_TX_SEGMENTS, MAX_UDP_PAYLOAD};
use hca::fabric::Fabric;
use hca::{AccessFlags, QpType, SendOp, Sge, WcStatus};

/// A gathered packet and its bytes as the link would send them (head, segments, trailer).
struct Gathered {
    g: GatherTransmit,
    head: Vec<u8>,
    pkt: Pkt,
}

/// Everything `p`'s engine wants to send now, through the gathering API.
fn transmit_gather(f: &mut Fabric, p: &Peer, now: hca::Instant) -> Vec<Gathered> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; MAX_UDP_PAYLOAD];
    while let Some(g) = f.node_mut(p.node).poll_transmit_gather(now, &mut buf) {
        let head = buf[..g.head_len()].to_vec();
        let pkt = flatten(&g, &head);
        out.push(Gathered { g, head, pkt });
        assert!(out.len() < 10_000, "endless transmit");
    }
    out
}

fn flatten(g: &GatherTransmit, head: &[u8]) -> Pkt {
    let mut data = head.to_vec();
    for s in g.segments() {
        data.extend_from_slice(s.bytes());
    }
    data.extend_from_slice(g.trailer());
    assert_eq!(
        data.len(),
        g.transmit.len,
        "parts add up to the UDP payload"
    );
    Pkt {
        tx: g.transmit,
        data,
    }
}

fn counters(f: &mut Fabric, p: &Peer) -> (u64, u64) {
    let c = f.node_mut(p.node).counters();
    (c.tx_gathered_pkts, c.tx_copied_pkts)
}

/// Memory the CPU cannot address in place (as GPU memory): only copies reach it.
#[derive(Debug)]
struct CopyOnly(HostMemory);

impl Memory for CopyOnly {
    fn len(&self) -> usize {
        self.0.len()
    }
    fn kind(&self) -> MemoryKind {
        MemoryKind::CudaDevice(0)
    }
    fn read(&self, offset: usize, dst: &mut [u8]) -> Result<(), MemoryError> {
        self.0.read(offset, dst)
    }
    fn write(&self, offset: usize, src: &[u8]) -> Result<(), MemoryError> {
        self.0.write(offset, src)
    }
    fn compare_swap(&self, offset: usize, compare: u64, swap: u64) -> Result<u64, MemoryError> {
        self.0.compare_swap(offset, compare, swap)
    }
    fn fetch_add(&self, offset: usize, add: u64) -> Result<u64, MemoryError> {
        self.0.fetch_add(offset, add)
    }
}

#[test]
fn rc_send_payload_is_gathered_and_read_when_the_packet_is_built() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 7, &[b.sge(0, 4096)]);
    a.write(0, &pattern(3000, 1));
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 3000)], SendOp::Send));
    // Changed after the post, before the packets are built: the HCA reads the buffer when it
    // sends (IBTA vol. 1 §10.7), so the new bytes go out.
    let new = pattern(3000, 9);
    a.write(0, &new);
    let pkts = transmit_gather(&mut f, &a, t_us(1));
    assert_eq!(pkts.len(), 3, "3000 bytes at PMTU 1024");
    for (i, p) in pkts.iter().enumerate() {
        let segs: Vec<_> = p.g.segments().collect();
        assert_eq!(segs.len(), 1, "packet {i}: one SGE, one segment");
        let mem: Arc<dyn Memory> = a.mem.clone();
        assert!(Arc::ptr_eq(segs[0].memory(), &mem), "points into A's MR");
        assert_eq!(segs[0].offset(), i * 1024);
        assert_eq!(segs[0].len(), if i < 2 { 1024 } else { 952 });
        // The head is only the transport headers; pad and ICRC ride in the trailer.
        let parsed = p.pkt.parsed();
        assert_eq!(p.head.len(), parsed.transport.header_len());
        assert_eq!(
            p.g.trailer().len(),
            4 + usize::from(parsed.transport.bth.pad_cnt)
        );
        assert_eq!(parsed.payload, &new[i * 1024..(i * 1024 + segs[0].len())]);
    }
    assert_eq!(counters(&mut f, &a), (3, 0));
    let pkts: Vec<Pkt> = pkts.into_iter().map(|p| p.pkt).collect();
    deliver_all(&mut f, &b, &pkts, t_us(2));
    assert_eq!(
        f.node_mut(b.node).counters().icrc_errors,
        0,
        "ICRC over the gathered bytes verifies"
    );
    let wcs = poll(&mut f, &b);
    assert_eq!(wcs.len(), 1);
    assert_eq!(wcs[0].status, WcStatus::Success);
    assert_eq!(b.read(0, 3000), new);
    // The ACK has no payload: neither gathered nor copied.
    let acks = transmit_gather(&mut f, &b, t_us(3));
    assert!(!acks.is_empty());
    assert!(acks.iter().all(|p| p.g.segment_count() == 0));
    assert_eq!(counters(&mut f, &b), (0, 0));
    let acks: Vec<Pkt> = acks.into_iter().map(|p| p.pkt).collect();
    deliver_all(&mut f, &a, &acks, t_us(4));
    let wcs = poll(&mut f, &a);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
}

#[test]
fn gathered_and_copied_packets_are_byte_identical() {
    let run = |gather: bool| {
        // Both runs draw the same QPNs and keys (they are in the bytes compared below).
        let (mut f, a, _b) = pair(&Opts {
            random_seed: Some(5),
            ..Opts::default()
        });
        a.write(0, &pattern(8192, 3));
        let sges = [a.sge(100, 1500), a.sge(5000, 1003)];
        post_send(
            &mut f,
            &a,
            &send_wr(
                1,
                &sges,
                SendOp::RdmaWrite {
                    remote_addr: B_IOVA + 8,
                    rkey: 0,
                },
            ),
        );
        let pkts: Vec<Pkt> = if gather {
            transmit_gather(&mut f, &a, t_us(1))
                .into_iter()
                .map(|p| p.pkt)
                .collect()
        } else {
            transmit(&mut f, &a, t_us(1))
        };
        (pkts, counters(&mut f, &a))
    };
    let (gathered, gc) = run(true);
    let (copied, cc) = run(false);
    assert_eq!(gathered.len(), 3);
    assert_eq!((gc, cc), ((3, 0), (0, 3)));
    for (g, c) in gathered.iter().zip(&copied) {
        assert_eq!(g.tx, c.tx);
        assert_eq!(g.data, c.data);
    }
}

#[test]
fn sge_boundaries_split_segments_and_too_many_pieces_are_copied() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 1, &[b.sge(0, 8192)]);
    post_recv(&mut f, &b, 2, &[b.sge(0, 8192)]);
    a.write(0, &pattern(1 << 16, 5));
    // 500 + 700 bytes: packet 1 holds 500 from the first SGE and 524 from the second.
    let two = [a.sge(0, 500), a.sge(8192, 700)];
    post_send(&mut f, &a, &send_wr(1, &two, SendOp::Send));
    let pkts = transmit_gather(&mut f, &a, t_us(1));
    assert_eq!(pkts.len(), 2);
    let shape = |p: &Gathered| -> Vec<(usize, usize)> {
        p.g.segments().map(|s| (s.offset(), s.len())).collect()
    };
    assert_eq!(shape(&pkts[0]), [(0, 500), (8192, 524)]);
    assert_eq!(shape(&pkts[1]), [(8716, 176)]);
    // One packet over more SGEs than a packet may have segments: copied, with the same bytes.
    let many: Vec<Sge> = (0..MAX_TX_SEGMENTS as u64 + 2)
        .map(|i| a.sge(i * 1000, 100))
        .collect();
    post_send(&mut f, &a, &send_wr(2, &many, SendOp::Send));
    let more = transmit_gather(&mut f, &a, t_us(2));
    assert_eq!(more.len(), 1);
    assert_eq!(more[0].g.segment_count(), 0);
    assert_eq!(more[0].head.len(), more[0].pkt.data.len(), "copied whole");
    assert_eq!(counters(&mut f, &a), (2, 1));
    let all: Vec<Pkt> = pkts.iter().chain(&more).map(|p| p.pkt.clone()).collect();
    deliver_all(&mut f, &b, &all, t_us(3));
    let wcs = poll(&mut f, &b);
    assert_eq!(wcs.len(), 2);
    let mut want: Vec<u8> = Vec::new();
    for s in &many {
        want.extend(a.read((s.addr - A_IOVA) as usize, 100));
    }
    assert_eq!(b.read(0, want.len()), want);
}

#[test]
fn memory_the_cpu_cannot_address_and_inline_data_are_copied() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
    post_recv(&mut f, &b, 2, &[b.sge(4096, 4096)]);
    let dev = Arc::new(CopyOnly(HostMemory::new(4096).unwrap()));
    dev.write(0, &pattern(2000, 7)).unwrap();
    let h = f.node_mut(a.node);
    let mr = h
        .reg_mr(a.pd, dev.clone(), 0x9000_0000, AccessFlags::LOCAL_WRITE)
        .unwrap();
    let sge = [Sge {
        addr: 0x9000_0000,
        length: 2000,
        lkey: mr.lkey(),
    }];
    post_send(&mut f, &a, &send_wr(1, &sge, SendOp::Send));
    a.write(0, b"inline!!");
    let inline_sge = [a.sge(0, 8)];
    let mut wr = send_wr(2, &inline_sge, SendOp::Send);
    wr.send_flags |= hca::SendFlags::INLINE;
    post_send(&mut f, &a, &wr);
    let pkts = transmit_gather(&mut f, &a, t_us(1));
    assert_eq!(pkts.len(), 3);
    assert!(pkts.iter().all(|p| p.g.segment_count() == 0));
    assert_eq!(
        counters(&mut f, &a),
        (0, 2),
        "inline data counts in neither"
    );
    let pkts: Vec<Pkt> = pkts.into_iter().map(|p| p.pkt).collect();
    deliver_all(&mut f, &b, &pkts, t_us(2));
    assert_eq!(poll(&mut f, &b).len(), 2);
    assert_eq!(b.read(0, 2000), pattern(2000, 7));
    assert_eq!(b.read(4096, 8), b"inline!!");
}

#[test]
fn uc_and_ud_sends_are_copied_because_they_complete_when_built() {
    for qp_type in [QpType::Uc, QpType::Ud] {
        let o = Opts {
            qp_type,
            ..Opts::default()
        };
        let (mut f, a, b) = pair(&o);
        a.write(0, &pattern(512, 2));
        let op = if qp_type == QpType::Ud {
            let ah = f
                .node_mut(a.node)
                .create_ah(
                    a.pd,
                    &hca::verbs::ah::AhAttr {
                        dgid: hca::Gid::from(b.ip),
                        sgid_index: 2,
                        hop_limit: 64,
                        port_num: 1,
                        ..Default::default()
                    },
                )
                .unwrap();
            SendOp::UdSend {
                dest: hca::verbs::wr::UdDest {
                    ah,
                    remote_qpn: b.qpn,
                    remote_qkey: 0x1111_1111,
                },
                imm_data: None,
            }
        } else {
            SendOp::Send
        };
        post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 512)], op));
        let pkts = transmit_gather(&mut f, &a, t_us(1));
        assert_eq!(pkts.len(), 1, "{qp_type:?}");
        assert_eq!(pkts[0].g.segment_count(), 0, "{qp_type:?}");
        assert_eq!(counters(&mut f, &a), (0, 1), "{qp_type:?}");
        // Completed on hand-off: the program may reuse the buffer at once.
        assert_eq!(poll(&mut f, &a).len(), 1, "{qp_type:?}");
    }
}

#[test]
fn read_responses_are_gathered_from_the_responders_mr() {
    let (mut f, a, b) = pair(&Opts::default());
    b.write(4096, &pattern(2500, 4));
    post(&mut f, &a, read(&a, 1, (0, 2500), &b, 4096));
    let req = transmit(&mut f, &a, t_us(1));
    deliver_all(&mut f, &b, &req, t_us(2));
    let resp = transmit_gather(&mut f, &b, t_us(3));
    assert_eq!(resp.len(), 3);
    let shape: Vec<Vec<(usize, usize)>> = resp
        .iter()
        .map(|p| p.g.segments().map(|s| (s.offset(), s.len())).collect())
        .collect();
    assert_eq!(
        shape,
        [vec![(4096, 1024)], vec![(5120, 1024)], vec![(6144, 452)]]
    );
    assert_eq!(counters(&mut f, &b), (3, 0));
    let resp: Vec<Pkt> = resp.into_iter().map(|p| p.pkt).collect();
    deliver_all(&mut f, &a, &resp, t_us(4));
    let wcs = poll(&mut f, &a);
    assert_eq!((wcs.len(), wcs[0].status), (1, WcStatus::Success));
    assert_eq!(a.read(0, 2500), pattern(2500, 4));
}

#[test]
fn a_gathered_packet_keeps_its_memory_alive_after_dereg() {
    let (mut f, a, _b) = pair(&Opts::default());
    a.write(0, &pattern(600, 6));
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 600)], SendOp::Send));
    let mut pkts = transmit_gather(&mut f, &a, t_us(1));
    assert_eq!(pkts.len(), 1);
    let weak = Arc::downgrade(&a.mem);
    f.node_mut(a.node).dereg_mr(a.mr.lkey()).unwrap();
    drop(a);
    let p = pkts.pop().unwrap();
    assert!(weak.upgrade().is_some(), "the packet holds the memory");
    let seg = p.g.segments().next().unwrap();
    assert_eq!(seg.bytes(), &pattern(600, 6)[..]);
    drop(p);
    assert!(weak.upgrade().is_none(), "released with the packet");
}

#[test]
fn reseal_for_a_gso_segment_identification() {
    let (mut f, a, b) = pair(&Opts::default());
    post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
    a.write(0, &pattern(1001, 8));
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 1001)], SendOp::Send));
    let mut pkts = transmit_gather(&mut f, &a, t_us(1));
    let p = &mut pkts[0];
    let mut head = p.head.clone();
    p.g.reseal_ipv4(&mut head, 5);
    let resealed = flatten(&p.g, &head);
    // Built for identification 0, resealed for 5: each verifies only with its own.
    deliver_with_ident(&mut f, &b, &resealed, t_us(2), 0);
    assert_eq!(f.node_mut(b.node).counters().icrc_errors, 1);
    deliver_with_ident(&mut f, &b, &resealed, t_us(2), 5);
    assert_eq!(f.node_mut(b.node).counters().icrc_errors, 1);
    assert_eq!(poll(&mut f, &b).len(), 1);
    assert_eq!(b.read(0, 1001), pattern(1001, 8));
}

/// A packet resealed along a GSO train's positions (5, then 9, then back to 0) verifies for the
/// last identification only, gathered and copied (inline) alike: the ICRC update from the last
/// identification (issue 21: no CRC pass) equals a full recompute.
#[test]
fn chained_reseals_verify_for_the_last_identification_only() {
    for inline in [false, true] {
        let (mut f, a, b) = pair(&Opts::default());
        post_recv(&mut f, &b, 1, &[b.sge(0, 4096)]);
        post_recv(&mut f, &b, 2, &[b.sge(0, 4096)]);
        let len: usize = if inline { 32 } else { 1001 };
        a.write(0, &pattern(len, 9));
        let sge = [a.sge(0, len as u32)];
        let mut wr = send_wr(1, &sge, SendOp::Send);
        if inline {
            wr.send_flags |= hca::SendFlags::INLINE;
        }
        post_send(&mut f, &a, &wr);
        let mut pkts = transmit_gather(&mut f, &a, t_us(1));
        assert_eq!(pkts.len(), 1);
        let p = &mut pkts[0];
        assert_eq!(p.g.segment_count() == 0, inline, "inline {inline}");
        let mut head = p.head.clone();
        let original = flatten(&p.g, &head);
        let mut at = Vec::new();
        for ident in [5u16, 9, 9, 0x1234] {
            p.g.reseal_ipv4(&mut head, ident);
            at.push((ident, flatten(&p.g, &head)));
        }
        p.g.reseal_ipv4(&mut head, 0);
        assert_eq!(
            flatten(&p.g, &head).data,
            original.data,
            "back to identification 0: the bytes as built (inline {inline})"
        );
        // Each resealed form fails with identification 0 and with the one before it.
        let mut errors = 0;
        for (k, (ident, pkt)) in at.iter().enumerate() {
            let before = if k == 0 { 0 } else { at[k - 1].0 };
            if before != *ident {
                deliver_with_ident(&mut f, &b, pkt, t_us(2), before);
                errors += 1;
            }
            deliver_with_ident(&mut f, &b, pkt, t_us(2), 0);
            errors += 1;
            assert_eq!(f.node_mut(b.node).counters().icrc_errors, errors);
        }
        // The last form verifies with its own identification: the SEND lands once.
        deliver_with_ident(&mut f, &b, &at[3].1, t_us(2), 0x1234);
        assert_eq!(f.node_mut(b.node).counters().icrc_errors, errors);
        assert_eq!(poll(&mut f, &b).len(), 1);
        assert_eq!(b.read(0, len), pattern(len, 9));
    }
}

// ---- the copying form ----

#[test]
fn a_small_transmit_buffer_loses_nothing() {
    let (mut f, a, _b) = pair(&Opts::default());
    post_send(&mut f, &a, &send_wr(1, &[a.sge(0, 2000)], SendOp::Send));
    let mut small = [0u8; 100];
    assert!(f
        .node_mut(a.node)
        .poll_transmit(t_us(0), &mut small)
        .is_none());
    assert_eq!(f.node(a.node).counters().send_err, 1);
    assert_eq!(
        transmit(&mut f, &a, t_us(0)).len(),
        2,
        "both packets, later"
    );
}

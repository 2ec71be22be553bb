//! RDMA CM among processes that share one device address (issue 19 with issue 18's shared
//! devices, `hca::link::udp::cm_route`): the kernel steers every MAD for QP 1 to one process of
//! the address; it forwards REQs to the process that claims their service and every other CM
//! message to the process whose slot is in the Communication ID that names its side.
//!
//! The processes are this test binary, re-executed with `CM_SHARED_ROLE` set (see
//! [`helper_process`]). Addresses: the servers share `127.0.0.1:PS`, the clients share
//! `127.0.0.2:PC` (free ports picked at start; each side is told the other's port). The test
//! process opens both addresses first, so it holds slot 0 of each (where the kernel steers QP 1)
//! and routes for the others without being an endpoint.
//!
//! Covered: two servers (ports 7301 and 7302 of one address, separate processes) and two clients
//! (separate processes of one address) connecting to both at the same time, a SEND checked on
//! each of the four connections and disconnects from the client side; a second listen on a
//! claimed port from another process (`EADDRINUSE`, then free once the owner is gone); a listener
//! killed with SIGKILL (a later connect gets REJECTED with reason 8, its claim is released, and
//! the DREQ of a connection that was established to it is dropped and counted); SIDR between an
//! IB CM claiming a service and one resolving it from slot 1 of the clients' address, and an
//! unclaimed service answered by slot 0's CM. Every wait is bounded by a timeout; no assertion is
//! on a duration.
#![cfg(all(feature = "std", target_os = "linux"))]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpu_p2p::{HostMemory, Memory};
use hca::cm::{Cm, CmConfig, CmEventKind};
use hca::link::udp::cm_route::{comm_id_prefix, ServiceClaim};
use hca::open::{open, DeviceSpec, OpenOptions};
use hca::rdma_cm::{CmService, RdmaCmError, RdmaCmEvent, RdmaCmEventType as E};
use hca::verbs::api::Verbs;
use hca::{
    AccessFlags, CqHandle, MemoryRegion, PdHandle, QpCap, QpInitAttr, QpType, RecvWr, SendFlags,
    SendOp, SendWr, Sge, WcStatus,
};

/// Longest wait for one event or one line of a helper.
const WAIT: Duration = Duration::from_secs(30);
/// Bytes of each connection's SEND.
const MSG: usize = 64;
/// The environment variable that makes [`helper_process`] a helper.
const ROLE: &str = "CM_SHARED_ROLE";

fn config() -> CmConfig {
    CmConfig {
        response_timeout: 16, // 268 ms
        max_cm_retries: 4,
        timewait: Duration::from_millis(100),
        ..CmConfig::default()
    }
}

fn free_port(ip: &str) -> u16 {
    UdpSocket::bind((ip, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A device on the shared address `local` that sends to `peer`'s port, with a PD, a CQ and a
/// 64 KiB MR.
struct Node {
    dev: Arc<dyn Verbs>,
    pd: PdHandle,
    cq: CqHandle,
    mem: Arc<HostMemory>,
    mr: MemoryRegion,
}

impl Node {
    fn open(local: SocketAddr, peer: SocketAddr) -> Node {
        let options = OpenOptions {
            udp_share: Some(true),
            ..OpenOptions::default()
        };
        let spec: DeviceSpec = format!("udp:{local}").parse().unwrap();
        let dev = open(&spec, &options).unwrap();
        dev.set_peer_port(peer.ip(), peer.port()).unwrap();
        let pd = dev.alloc_pd().unwrap();
        let cq = dev.create_cq(256).unwrap();
        let mem = Arc::new(HostMemory::new(1 << 16).unwrap());
        let mr = dev
            .reg_mr(
                pd,
                mem.clone(),
                0,
                1 << 16,
                0x1000,
                AccessFlags::LOCAL_WRITE,
            )
            .unwrap();
        Node {
            dev,
            pd,
            cq,
            mem,
            mr,
        }
    }

    fn qp(&self) -> u32 {
        let init = QpInitAttr {
            qp_type: QpType::Rc,
            send_cq: self.cq,
            recv_cq: self.cq,
            srq: None,
            cap: QpCap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            sq_sig_all: false,
        };
        self.dev.create_qp(self.pd, &init).unwrap()
    }

    fn mr_off(&self, slot: usize) -> usize {
        slot * MSG
    }

    fn sge(&self, slot: usize) -> [Sge; 1] {
        [Sge {
            addr: self.mr.iova() + (slot * MSG) as u64,
            length: MSG as u32,
            lkey: self.mr.lkey(),
        }]
    }

    /// A link counter of the device (its `stats()` line, `name: value`).
    fn link_counter(&self, name: &str) -> u64 {
        let stats = self.dev.stats().unwrap();
        let link = &stats.iter().find(|(k, _)| *k == "link").unwrap().1;
        let at = link
            .find(&format!("{name}: "))
            .unwrap_or_else(|| panic!("{link}"));
        link[at + name.len() + 2..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }
}

fn next_event(cm: &CmService) -> RdmaCmEvent {
    cm.get_event(WAIT)
        .unwrap_or_else(|| panic!("no RDMA CM event within {WAIT:?}"))
}

fn message(client: u8, port: u16) -> [u8; MSG] {
    let mut m = [0u8; MSG];
    let text = format!("client {client} to port {port}");
    m[..text.len()].copy_from_slice(text.as_bytes());
    m
}

/// Helper `server PORT COUNT`: listens on `PORT` of the shared server address, accepts `COUNT`
/// connections, checks each one's SEND (the text the client's private data announces) and
/// waits for its disconnect.
fn serve(node: &Node, cm: &CmService, port: u16, count: usize) {
    let l = cm.create_id().unwrap();
    cm.listen(l, SocketAddr::new(node.dev.default_gid().1.to_ip(), port))
        .unwrap();
    println!("READY");
    let mut conns: HashMap<u32, (u32, usize, u8)> = HashMap::new();
    let mut received = 0;
    let mut closed = 0;
    let deadline = Instant::now() + 3 * WAIT;
    while closed < count {
        assert!(
            Instant::now() < deadline,
            "server {port}: {closed} of {count} closed"
        );
        let e = next_event(cm);
        match e.event {
            E::ConnectRequest => {
                let slot = conns.len();
                assert!(slot < count, "more connections than expected");
                let qpn = node.qp();
                conns.insert(e.id, (qpn, slot, e.private_data[0]));
                // The CM moves the QP RESET -> RTR: receives can be posted from then on (a SEND
                // that comes first gets an RNR NAK and is retried: `rnr_retry` 7).
                cm.accept(e.id, qpn, b"").unwrap();
                node.dev
                    .post_recv(
                        qpn,
                        &RecvWr {
                            wr_id: slot as u64,
                            sg_list: &node.sge(slot),
                        },
                    )
                    .unwrap();
            }
            E::Established => {
                let (_, slot, client) = conns[&e.id];
                let wc = node.dev.wait_cq(node.cq, 1, WAIT).unwrap();
                assert_eq!(wc.len(), 1, "the SEND of client {client}");
                assert_eq!(wc[0].status, WcStatus::Success);
                let got_slot = wc[0].wr_id as usize;
                let mut got = [0u8; MSG];
                node.mem.read(node.mr_off(got_slot), &mut got).unwrap();
                let who = conns.values().find(|c| c.1 == got_slot).unwrap().2;
                assert_eq!(got, message(who, port), "slot {slot}");
                received += 1;
            }
            E::Disconnected => {}
            E::TimewaitExit => closed += 1,
            other => panic!("server {port}: unexpected {other:?} {e:?}"),
        }
    }
    assert_eq!(received, count);
    println!("OK");
}

/// Helper `client INDEX PORT...`: connects to every `PORT` of the shared server address at
/// once, SENDs each the text for (INDEX, PORT), then disconnects all.
fn connect_all(node: &Node, cm: &CmService, index: u8, server: IpAddr, ports: &[u16]) {
    let mut ids = HashMap::new();
    for (k, &port) in ports.iter().enumerate() {
        let id = cm.create_id().unwrap();
        cm.resolve_addr(id, None, SocketAddr::new(server, port))
            .unwrap();
        assert_eq!(next_event(cm).event, E::AddrResolved);
        cm.resolve_route(id).unwrap();
        assert_eq!(next_event(cm).event, E::RouteResolved);
        let qpn = node.qp();
        node.mem
            .write(node.mr_off(k), &message(index, port))
            .unwrap();
        ids.insert(id, (qpn, k));
    }
    // All REQs leave before any answer is handled: the connections are set up concurrently.
    for (&id, &(qpn, _)) in &ids {
        cm.connect(id, qpn, &[index]).unwrap();
    }
    let mut established = 0;
    while established < ids.len() {
        let e = next_event(cm);
        if e.event != E::Established {
            eprintln!("client {index}: {e:?}\n{:?}", node.dev.stats());
        }
        assert_eq!(e.event, E::Established, "{e:?}");
        let (qpn, k) = ids[&e.id];
        let wr = SendWr {
            wr_id: k as u64,
            sg_list: &node.sge(k),
            op: SendOp::Send,
            send_flags: SendFlags::SIGNALED,
        };
        node.dev.post_send(qpn, &wr).unwrap();
        let wc = node.dev.wait_cq(node.cq, 1, WAIT).unwrap();
        assert_eq!(wc.len(), 1);
        assert_eq!((wc[0].wr_id, wc[0].status), (k as u64, WcStatus::Success));
        established += 1;
    }
    for &id in ids.keys() {
        cm.disconnect(id).unwrap();
    }
    let mut exits = 0;
    let deadline = Instant::now() + 3 * WAIT;
    while exits < ids.len() {
        assert!(Instant::now() < deadline);
        match next_event(cm).event {
            E::Disconnected => {}
            E::TimewaitExit => exits += 1,
            other => panic!("client {index}: unexpected {other:?}"),
        }
    }
    println!("OK");
}

/// An IB CM (`hca::cm::Cm`, no RDMA CM above it) on `node`'s QP 1, with the slot of its shared
/// address in its Communication IDs, as `CmService` sets it up.
fn raw_cm(node: &Node) -> (Cm, SocketAddr, usize) {
    let (local, slot) = node.dev.gsi().unwrap().shared_address().unwrap();
    let mut cm = Cm::new(config());
    let (mask, value) = comm_id_prefix(slot);
    cm.set_comm_id_prefix(mask, value);
    (cm, local, slot)
}

/// One turn of `cm` on `node`'s QP 1: received MADs, due timers; its events, in order.
fn raw_turn(
    node: &Node,
    cm: &mut Cm,
    then: &mut dyn FnMut(&mut Cm, &mut hca::SoftHca, CmEventKind, u32),
) {
    node.dev.gsi().unwrap().with_gsi(&mut |now, h| {
        while let Some(m) = h.poll_mad() {
            cm.handle_mad(now, h, &m);
        }
        if cm.poll_timeout().is_some_and(|t| t <= now) {
            cm.handle_timeout(now, h);
        }
        while let Some(e) = cm.poll_event() {
            then(cm, h, e.kind, e.id);
        }
    });
}

/// Helper `sidr_server SID`: claims the service ID (hex) on the shared server address, as
/// `CmService::listen` does, and answers every SIDR_REQ for it with UD QPN 0xabcd, Q_Key
/// 0x11112222, until killed (at most `3 * WAIT`).
fn sidr_serve(node: &Node, sid: u64) {
    let (mut cm, local, slot) = raw_cm(node);
    let claim = ServiceClaim::claim(local, slot, sid).unwrap();
    cm.listen(sid).unwrap();
    println!("READY");
    let deadline = Instant::now() + 3 * WAIT;
    while Instant::now() < deadline {
        raw_turn(node, &mut cm, &mut |cm, h, kind, id| {
            if let CmEventKind::SidrRequest { service_id, .. } = kind {
                assert_eq!(service_id, sid);
                cm.sidr_answer(h, id, Some((0xabcd, 0x1111_2222)), b"")
                    .unwrap();
                println!("ANSWERED");
            }
        });
        claim.drain();
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Helper `sidr_client SID served|unclaimed`: resolves the service ID (hex) on the server
/// address from the shared client address (not slot 0) and checks the SIDR_REP: the server's
/// QPN and Q_Key, or status 1 (unsupported) from slot 0's CM when nobody claims it.
fn sidr_resolve(node: &Node, server: IpAddr, sid: u64, served: bool) {
    let (mut cm, local, slot) = raw_cm(node);
    assert_ne!(slot, 0, "the test process holds slot 0");
    let mut req = None;
    node.dev.gsi().unwrap().with_gsi(&mut |now, h| {
        req = Some(
            cm.sidr_resolve(now, h, local.ip(), server, sid, b"")
                .unwrap(),
        );
    });
    let req = req.unwrap();
    assert_eq!(hca::link::udp::cm_route::slot_of_comm_id(req), slot);
    let mut answer = None;
    let deadline = Instant::now() + WAIT;
    while answer.is_none() && Instant::now() < deadline {
        raw_turn(node, &mut cm, &mut |_, _, kind, id| {
            assert_eq!(id, req);
            answer = Some(kind);
        });
        std::thread::sleep(Duration::from_millis(2));
    }
    match answer {
        Some(CmEventKind::SidrResolved {
            status, qpn, qkey, ..
        }) if served => {
            assert_eq!(
                (status, qpn, qkey),
                (roce::cm::SidrStatus::Success, 0xabcd, 0x1111_2222)
            );
        }
        Some(CmEventKind::SidrResolved { status, .. }) => {
            assert_eq!(status, roce::cm::SidrStatus::Unsupported);
        }
        other => panic!("SIDR: {other:?}"),
    }
    println!("OK");
}

/// The entry of the helper processes: does nothing unless `CM_SHARED_ROLE` is set (the tests
/// below set it when they re-execute this binary with `--exact helper_process`).
/// `CM_SHARED_ROLE` is `server PS PC PORT COUNT`, `client PS PC INDEX PORT...` or `hold PS PC
/// PORT` (listen, then wait to be killed, at most `3 * WAIT`).
#[test]
fn helper_process() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let args: Vec<&str> = role.split(' ').collect();
    let ps: u16 = args[1].parse().unwrap();
    let pc: u16 = args[2].parse().unwrap();
    let servers = SocketAddr::new("127.0.0.1".parse().unwrap(), ps);
    let clients = SocketAddr::new("127.0.0.2".parse().unwrap(), pc);
    let num = |s: &str| s.parse::<u16>().unwrap();
    match args[0] {
        "server" => {
            let node = Node::open(servers, clients);
            let cm = CmService::start(node.dev.clone(), config()).unwrap();
            serve(&node, &cm, num(args[3]), args[4].parse().unwrap());
        }
        "client" => {
            let node = Node::open(clients, servers);
            let cm = CmService::start(node.dev.clone(), config()).unwrap();
            let ports: Vec<u16> = args[4..].iter().map(|p| num(p)).collect();
            connect_all(&node, &cm, args[3].parse().unwrap(), servers.ip(), &ports);
        }
        "hold" => {
            let node = Node::open(servers, clients);
            let cm = CmService::start(node.dev.clone(), config()).unwrap();
            let l = cm.create_id().unwrap();
            cm.listen(l, SocketAddr::new(servers.ip(), num(args[3])))
                .unwrap();
            println!("READY");
            // Accept what comes (a connection the parent later finds dead) until killed.
            let deadline = Instant::now() + 3 * WAIT;
            while Instant::now() < deadline {
                if let Some(e) = cm.get_event(Duration::from_millis(200)) {
                    if e.event == E::ConnectRequest {
                        let qpn = node.qp();
                        cm.accept(e.id, qpn, b"").unwrap();
                    }
                    if e.event == E::Established {
                        println!("ESTABLISHED");
                    }
                }
            }
        }
        "sidr_server" => {
            let node = Node::open(servers, clients);
            sidr_serve(&node, u64::from_str_radix(args[3], 16).unwrap());
        }
        "sidr_client" => {
            let node = Node::open(clients, servers);
            let sid = u64::from_str_radix(args[3], 16).unwrap();
            sidr_resolve(&node, servers.ip(), sid, args[4] == "served");
        }
        other => panic!("unknown role {other}"),
    }
}

/// A helper process and its stdout lines.
struct Helper {
    child: Child,
    lines: mpsc::Receiver<String>,
    name: String,
}

impl Helper {
    fn start(role: String) -> Helper {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "helper_process",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(ROLE, &role)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Helper {
            child,
            lines,
            name: role,
        }
    }

    /// Waits (at most `timeout`) for the line `want`.
    fn expect(&self, want: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                // libtest may print "test helper_process ... " before the first line.
                Ok(l) if l.trim().ends_with(want) => return,
                Ok(_) => continue,
                Err(_) => panic!("helper `{}`: no `{want}` within {timeout:?}", self.name),
            }
        }
    }

    /// Waits for the helper to exit: `Err` (with its exit status) unless it succeeded.
    fn finish(mut self) -> Result<(), String> {
        let deadline = Instant::now() + 3 * WAIT;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return if st.success() {
                    Ok(())
                } else {
                    Err(format!("helper `{}` failed: {st}", self.name))
                };
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(format!("helper `{}` did not exit", self.name));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The two shared addresses, opened first by this process (slot 0 of each), with a CM on the
/// server address (it answers REQs nobody claims).
fn addresses() -> (u16, u16, Node, Node, CmService) {
    let (ps, pc) = (free_port("127.0.0.1"), free_port("127.0.0.2"));
    let servers = SocketAddr::new("127.0.0.1".parse().unwrap(), ps);
    let clients = SocketAddr::new("127.0.0.2".parse().unwrap(), pc);
    let s0 = Node::open(servers, clients);
    let c0 = Node::open(clients, servers);
    let cm = CmService::start(s0.dev.clone(), config()).unwrap();
    (ps, pc, s0, c0, cm)
}

#[test]
fn two_servers_and_two_clients_of_shared_addresses_connect_at_once() {
    let (ps, pc, s0, c0, cm0) = addresses();
    let servers: Vec<Helper> = [7301u16, 7302]
        .iter()
        .map(|p| Helper::start(format!("server {ps} {pc} {p} 2")))
        .collect();
    for s in &servers {
        s.expect("READY", WAIT);
    }
    let clients: Vec<Helper> = (0..2)
        .map(|i| Helper::start(format!("client {ps} {pc} {i} 7301 7302")))
        .collect();
    let failed: Vec<String> = clients
        .into_iter()
        .chain(servers)
        .filter_map(|h| h.finish().err())
        .collect();
    // What the routing processes saw, for a failure's diagnosis.
    assert!(
        failed.is_empty(),
        "{failed:?}\nservers' address, slot 0: {:?}\nits CM: {:?} {:?}\nclients' address, slot 0: {:?}",
        s0.dev.stats(),
        cm0.counters(),
        cm0.with_cm(|c| c.cm().counters().clone()),
        c0.dev.stats()
    );
    // The REQs reached the servers through this process (slot 0 of 127.0.0.1). The REPs and
    // DREPs to the clients are steered by the kernel straight to the slot their Communication ID
    // names (`share::steering_program`), so slot 0 of 127.0.0.2 routes them only if the reuseport
    // group has been reordered: its count is printed, not required.
    let (rs, rc) = (
        s0.link_counter("rx_mads_routed"),
        c0.link_counter("rx_mads_routed"),
    );
    eprintln!("routed: servers' address {rs}, clients' {rc}");
    assert!(rs >= 4, "routed: servers' address {rs}, clients' {rc}");
}

#[test]
fn a_claimed_port_is_in_use_for_other_processes_and_freed_by_sigkill() {
    let (ps, pc, s0, c0, cm0) = addresses();
    let port = 7303;
    let mut holder = Helper::start(format!("hold {ps} {pc} {port}"));
    holder.expect("READY", WAIT);
    let ip = s0.dev.default_gid().1.to_ip();
    let l = cm0.create_id().unwrap();
    assert_eq!(
        cm0.listen(l, SocketAddr::new(ip, port)),
        Err(RdmaCmError::InUse),
        "EADDRINUSE while another process claims the port"
    );
    assert!(cm0.claimed().is_empty());

    // A connection to the holder, from this process's client address (slot 0 there).
    let ccm = CmService::start(c0.dev.clone(), config()).unwrap();
    let id = ccm.create_id().unwrap();
    ccm.resolve_addr(id, None, SocketAddr::new(ip, port))
        .unwrap();
    assert_eq!(next_event(&ccm).event, E::AddrResolved);
    ccm.resolve_route(id).unwrap();
    assert_eq!(next_event(&ccm).event, E::RouteResolved);
    let qpn = c0.qp();
    ccm.connect(id, qpn, b"").unwrap();
    assert_eq!(next_event(&ccm).event, E::Established);
    holder.expect("ESTABLISHED", WAIT);

    // SIGKILL: the kernel frees its slot and its claim.
    holder.child.kill().unwrap();
    holder.child.wait().unwrap();
    let strays = s0.link_counter("rx_strays");
    // Its peer's DREQ names the dead process's Communication ID: dropped and counted here.
    ccm.disconnect(id).unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + 3 * WAIT;
    while !seen.contains(&E::TimewaitExit) {
        assert!(Instant::now() < deadline);
        seen.push(next_event(&ccm).event);
    }
    assert!(
        s0.link_counter("rx_strays") > strays,
        "the DREQs for the dead process were dropped and counted"
    );

    // A new connect to the port: nobody claims it, slot 0's CM answers REJ reason 8.
    let id2 = ccm.create_id().unwrap();
    ccm.resolve_addr(id2, None, SocketAddr::new(ip, port))
        .unwrap();
    assert_eq!(next_event(&ccm).event, E::AddrResolved);
    ccm.resolve_route(id2).unwrap();
    assert_eq!(next_event(&ccm).event, E::RouteResolved);
    ccm.connect(id2, c0.qp(), b"").unwrap();
    let e = next_event(&ccm);
    assert_eq!((e.event, e.status), (E::Rejected, 8), "{e:?}");

    // And the port can be claimed again.
    cm0.listen(l, SocketAddr::new(ip, port)).unwrap();
    assert_eq!(cm0.claimed().len(), 1);
    cm0.destroy_id(l);
    assert!(
        cm0.claimed().is_empty(),
        "destroying the listener releases the claim"
    );
}

/// SIDR (UD service resolution, IBTA vol. 1 §12.11) between processes of shared addresses: the
/// SIDR_REQ is routed by its service ID to the claiming process, the SIDR_REP by its Request ID
/// to the resolving process (slot 1 of the clients' address); a service nobody claims is
/// answered by slot 0's CM with status 1 (unsupported).
#[test]
fn sidr_reaches_the_claiming_process_and_its_answer_the_resolver() {
    let (ps, pc, s0, c0, _cm0) = addresses();
    let sid = 0x0111_0000_0000_1d4c_u64; // RDMA_PS_UDP, port 7500
    let server = Helper::start(format!("sidr_server {ps} {pc} {sid:x}"));
    server.expect("READY", WAIT);
    let served = Helper::start(format!("sidr_client {ps} {pc} {sid:x} served"));
    let r = served.finish();
    assert!(
        r.is_ok(),
        "{r:?}\n{:?}\n{:?}",
        s0.dev.stats(),
        c0.dev.stats()
    );
    server.expect("ANSWERED", WAIT);
    let unclaimed = Helper::start(format!("sidr_client {ps} {pc} {:x} unclaimed", sid + 1));
    unclaimed.finish().unwrap();
    // The SIDR_REQ went through slot 0 of the servers' address; the SIDR_REPs reach the resolvers
    // steered by the kernel by their Request ID (`share::steering_program`), not through slot 0.
    assert!(s0.link_counter("rx_mads_routed") >= 1);
}

/// A REQ for a port nobody claims, on an address whose slot 0 runs no CM (a verbs-only
/// process), is answered by the lowest slot that runs one (`cm_route::CmPresence`): REJECTED,
/// status 8, not a timeout.
#[test]
fn an_unclaimed_port_is_rejected_by_a_cm_outside_slot_0() {
    let (ps, pc) = (free_port("127.0.0.1"), free_port("127.0.0.2"));
    let servers = SocketAddr::new("127.0.0.1".parse().unwrap(), ps);
    let clients = SocketAddr::new("127.0.0.2".parse().unwrap(), pc);
    let s0 = Node::open(servers, clients); // slot 0, no CM
    let c0 = Node::open(clients, servers);
    let holder = Helper::start(format!("hold {ps} {pc} 7304"));
    holder.expect("READY", WAIT);
    let ccm = CmService::start(c0.dev.clone(), config()).unwrap();
    let id = ccm.create_id().unwrap();
    ccm.resolve_addr(id, None, SocketAddr::new(servers.ip(), 7399))
        .unwrap();
    assert_eq!(next_event(&ccm).event, E::AddrResolved);
    ccm.resolve_route(id).unwrap();
    assert_eq!(next_event(&ccm).event, E::RouteResolved);
    ccm.connect(id, c0.qp(), b"").unwrap();
    let e = next_event(&ccm);
    assert_eq!((e.event, e.status), (E::Rejected, 8), "{e:?}");
    assert!(s0.link_counter("rx_mads_routed") >= 1);
}

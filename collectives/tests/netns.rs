//! Multi-host over RoCE, on one machine: every rank runs in its own network namespace, so its
//! only network is a veth interface with its own address, as if each rank had a host of its own.
//! Two layouts:
//!
//! ```text
//! bridged:  r0 10.77.0.1 --+                      routed:  r0 10.78.1.1 --+ brA 10.78.1.254
//!           r1 10.77.0.2 --+-- br0 (namespace sw)          r1 10.78.1.2 --+   (namespace rt,
//!           r2 10.77.0.3 --+                               r2 10.78.2.1 --+    IP forwarding)
//!           r3 10.77.0.4 --+                               r3 10.78.2.2 --+ brB 10.78.2.254
//! ```
//!
//! In the routed layout RoCEv2 packets between the two subnets cross a router (RoCEv2 is routable
//! IP/UDP): the test checks that the router forwarded them. Each rank is a `coll-perf` process
//! (`ip netns exec`) bootstrapped the torchrun way (rank 0 serves the rendezvous on its address)
//! and forced onto RoCE; all-reduce results are checked on every rank. The test creates and
//! deletes its namespaces (names carry the test's pid) and touches no address outside them.
//! It needs root and iproute2; without them it says so and passes.

use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const EXE: &str = env!("CARGO_BIN_EXE_coll-perf");
const SAFETY: Duration = Duration::from_secs(240);

/// Why the test cannot run here, if it cannot.
fn unsupported() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root (network namespaces)".into());
    }
    match Command::new("ip").arg("-V").output() {
        Ok(o) if o.status.success() => None,
        _ => Some("needs iproute2's `ip`".into()),
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Network namespaces deleted on drop (also when the test fails).
struct Namespaces {
    names: Vec<String>,
}

impl Namespaces {
    fn new() -> Namespaces {
        Namespaces { names: Vec::new() }
    }

    /// Creates namespace `<prefix><pid>` with its loopback up; returns its name.
    fn add(&mut self, prefix: &str) -> Result<String, String> {
        let name = format!("{prefix}{}", std::process::id());
        let _ = ip(&["netns", "del", &name]);
        ip(&["netns", "add", &name])?;
        self.names.push(name.clone());
        ip(&["-n", &name, "link", "set", "lo", "up"])?;
        Ok(name)
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for n in self.names.iter().rev() {
            let _ = ip(&["netns", "del", n]);
        }
    }
}

/// A bridge `br` in namespace `ns`, up, with `addr` (CIDR) if given.
fn bridge(ns: &str, br: &str, addr: Option<&str>) -> Result<(), String> {
    ip(&["-n", ns, "link", "add", br, "type", "bridge"])?;
    if let Some(a) = addr {
        ip(&["-n", ns, "addr", "add", a, "dev", br])?;
    }
    ip(&["-n", ns, "link", "set", br, "up"])
}

/// Rank namespace `rank_ns` joined to bridge `br` of namespace `hub` by a veth pair: `eth0` in
/// the rank's namespace with `addr` (CIDR), `port` on the bridge.
fn attach(rank_ns: &str, hub: &str, br: &str, port: &str, addr: &str) -> Result<(), String> {
    ip(&[
        "-n", hub, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", rank_ns,
    ])?;
    ip(&["-n", hub, "link", "set", port, "master", br, "up"])?;
    ip(&["-n", rank_ns, "addr", "add", addr, "dev", "eth0"])?;
    ip(&["-n", rank_ns, "link", "set", "eth0", "up"])
}

fn wait_bounded(mut child: Child, deadline: Instant) -> Output {
    loop {
        if child.try_wait().expect("try_wait").is_some() || Instant::now() >= deadline {
            let _ = child.kill();
            return child.wait_with_output().expect("wait_with_output");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `coll-perf all-reduce` as rank `k` in namespace `namespaces[k]`, rank 0's rendezvous at
/// `master`, with `COLL_ROCE_LINK=links[k]` where given; returns every rank's output.
fn all_reduce_across(namespaces: &[String], master: &str, links: &[&str]) -> Vec<Output> {
    let n = namespaces.len().to_string();
    let children: Vec<Child> = namespaces
        .iter()
        .enumerate()
        .map(|(rank, ns)| {
            let mut cmd = Command::new("ip");
            if let Some(link) = links.get(rank) {
                cmd.env("COLL_ROCE_LINK", link);
            } else {
                cmd.env_remove("COLL_ROCE_LINK");
            }
            cmd.args(["netns", "exec", ns, EXE])
                .args([
                    "all-reduce",
                    "-b",
                    "1K",
                    "-e",
                    "1M",
                    "-f",
                    "4",
                    "-n",
                    "5",
                    "-T",
                    "60",
                    "--transport",
                    "roce",
                ])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", &n)
                .env("LOCAL_RANK", "0")
                .env("MASTER_ADDR", master)
                .env("MASTER_PORT", "29500")
                // The device's counters on stderr when it closes.
                .env("COLL_ROCE_STATS", "1")
                .env_remove("COLL_COMM_ID")
                .env_remove("COLL_ROCE_ADDR")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn ip netns exec coll-perf")
        })
        .collect();
    let deadline = Instant::now() + SAFETY;
    children
        .into_iter()
        .map(|c| wait_bounded(c, deadline))
        .collect()
}

fn check_outputs(outs: &[Output]) {
    for (rank, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "rank {rank}: {}\n{}",
            String::from_utf8_lossy(&o.stderr),
            String::from_utf8_lossy(&o.stdout)
        );
    }
    let stdout = String::from_utf8_lossy(&outs[0].stdout);
    let rows: Vec<Vec<&str>> = stdout
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 6, "1K .. 1M by 4:\n{stdout}");
    for r in &rows {
        assert_eq!((r[8], r[12]), ("0", "0"), "#wrong:\n{stdout}");
    }
    for rank in 1..outs.len() {
        assert!(
            stdout.contains(&format!("Rank {rank:>2} Pid")) && stdout.contains("via roce"),
            "{stdout}"
        );
    }
}

/// Bytes the interface `dev` of namespace `ns` has forwarded (its TX byte counter).
fn tx_bytes(ns: &str, dev: &str) -> u64 {
    let p = format!("/sys/class/net/{dev}/statistics/tx_bytes");
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "cat", &p])
        .output()
        .expect("read counter");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn all_reduce_across_namespaces_on_one_bridge() {
    if let Some(why) = unsupported() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut nss = Namespaces::new();
    let mut setup = || -> Result<Vec<String>, String> {
        let sw = nss.add("collsw")?;
        bridge(&sw, "br0", None)?;
        let mut ranks = Vec::new();
        for k in 0..4 {
            let r = nss.add(&format!("collb{k}-"))?;
            attach(
                &r,
                &sw,
                "br0",
                &format!("p{k}"),
                &format!("10.77.0.{}/24", k + 1),
            )?;
            ranks.push(r);
        }
        Ok(ranks)
    };
    let ranks = match setup() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skipped: cannot build the namespaces: {e}");
            return;
        }
    };
    let outs = all_reduce_across(&ranks, "10.77.0.1", &[]);
    check_outputs(&outs);
}

#[test]
fn all_reduce_across_two_subnets_joined_by_a_router() {
    if let Some(why) = unsupported() {
        eprintln!("skipped: {why}");
        return;
    }
    let mut nss = Namespaces::new();
    let mut setup = || -> Result<(String, Vec<String>), String> {
        let rt = nss.add("collrt")?;
        bridge(&rt, "brA", Some("10.78.1.254/24"))?;
        bridge(&rt, "brB", Some("10.78.2.254/24"))?;
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &rt,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        let mut ranks = Vec::new();
        for k in 0..4 {
            let r = nss.add(&format!("collr{k}-"))?;
            let (br, subnet, host) = if k < 2 {
                ("brA", 1, k + 1)
            } else {
                ("brB", 2, k - 1)
            };
            attach(
                &r,
                &rt,
                br,
                &format!("p{k}"),
                &format!("10.78.{subnet}.{host}/24"),
            )?;
            ip(&[
                "-n",
                &r,
                "route",
                "add",
                "default",
                "via",
                &format!("10.78.{subnet}.254"),
            ])?;
            ranks.push(r);
        }
        Ok((rt, ranks))
    };
    let (rt, ranks) = match setup() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("skipped: cannot build the namespaces: {e}");
            return;
        }
    };
    let before = (tx_bytes(&rt, "brA"), tx_bytes(&rt, "brB"));
    let outs = all_reduce_across(&ranks, "10.78.1.1", &[]);
    check_outputs(&outs);
    // The ring 0 -> 1 -> 2 -> 3 -> 0 crosses between the subnets twice per step: megabytes went
    // through the router in each direction.
    let after = (tx_bytes(&rt, "brA"), tx_bytes(&rt, "brB"));
    assert!(
        after.0 - before.0 > 1 << 20 && after.1 - before.1 > 1 << 20,
        "routed bytes: brA {} brB {}",
        after.0 - before.0,
        after.1 - before.1
    );
}

/// The value of counter `name` (`name: N` in a `Debug` dump of counters) in `text`.
fn counter(text: &str, name: &str) -> Option<u64> {
    let key = format!("{name}: ");
    let at = text.find(&key)? + key.len();
    text[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// Rank 0 on the AF_XDP link (`COLL_ROCE_LINK=xdp:eth0`: an XDP program on its veth steers
/// RoCEv2 to an AF_XDP socket), rank 1 on the UDP link, joined by a bridge: all-reduce results
/// checked on both ranks. The transport's own buffers live in the link's UMEM, so some payloads
/// leave without a copy (`tx_zero_copy` of rank 0's link counters).
#[test]
fn all_reduce_between_an_af_xdp_rank_and_a_udp_rank() {
    if let Some(why) = unsupported() {
        eprintln!("skipped: {why}");
        return;
    }
    if !hca::link::xdp::program::program_built() {
        eprintln!("skipped: the XDP program was not built (no clang / libbpf-dev: tests/setup.sh)");
        return;
    }
    let mut ns = Namespaces::new();
    let sw = ns.add("cxdsw").expect("namespace");
    bridge(&sw, "br0", None).expect("bridge");
    let ranks = vec![ns.add("cxd0").expect("ns"), ns.add("cxd1").expect("ns")];
    attach(&ranks[0], &sw, "br0", "p0", "10.77.0.1/24").expect("veth");
    attach(&ranks[1], &sw, "br0", "p1", "10.77.0.2/24").expect("veth");
    let outs = all_reduce_across(&ranks, "10.77.0.1", &["xdp:eth0", "udp:10.77.0.2:4791"]);
    check_outputs(&outs);
    let stats = String::from_utf8_lossy(&outs[0].stderr);
    let zc = counter(&stats, "tx_zero_copy").expect("rank 0's link counters (COLL_ROCE_STATS)");
    assert!(
        zc > 0,
        "no payload left from the UMEM:
{stats}"
    );
    assert_eq!(counter(&stats, "kernel_tx_invalid"), Some(0), "{stats}");
    eprintln!(
        "rank 0 (AF_XDP): tx_zero_copy {zc}, tx_copied {:?}",
        counter(&stats, "tx_copied")
    );
}

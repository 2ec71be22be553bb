//! Which interface holds a device's IPv4 address (`hca::link::udp::ipv4_interface`): the UDP device
//! takes its port's active MTU from that interface's MTU. Found missing against Linux rxe: a device
//! on an IPv4 address of a 4200-byte bridge got active MTU 1024 (the Ethernet default), so every
//! path MTU 4096 cell of the conformance matrix (`tests/guest/matrix.sh`) was refused.
#![cfg(feature = "std")]

use std::net::Ipv4Addr;

use hca::link::udp::ipv4_interface;
use hca::soft::{UdpDevice, UdpDeviceConfig};
use hca::PathMtu;

#[test]
fn loopback_address_is_on_lo() {
    assert_eq!(ipv4_interface(Ipv4Addr::LOCALHOST).as_deref(), Some("lo"));
    // TEST-NET-1 is on no interface of a test host.
    assert_eq!(ipv4_interface(Ipv4Addr::new(192, 0, 2, 77)), None);
}

#[test]
fn device_on_a_4200_byte_interface_runs_path_mtu_4096() {
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    #[allow(unsafe_code)]
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root (a network namespace with a bridge)");
        return;
    }
    // A namespace of our own (`ip netns exec` gives the process its own /sys as well, which the
    // device reads the MTU from): a bridge without ports, MTU 4200, with an IPv4 address, and a
    // child process of this test binary that opens a device there.
    if let Ok(ns) = std::env::var("HCA_TEST_IN_NETNS") {
        let dev = UdpDevice::open(UdpDeviceConfig::new("10.78.0.1".parse().unwrap())).unwrap();
        assert_eq!(
            ipv4_interface(Ipv4Addr::new(10, 78, 0, 1)).as_deref(),
            Some("d0")
        );
        assert_eq!(dev.query_port().active_mtu, PathMtu::Mtu4096, "in {ns}");
        return;
    }
    let ns = format!("hca-mtu-{}", std::process::id());
    let ip = |args: &[&str]| {
        std::process::Command::new("ip")
            .args(args)
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if !ip(&["netns", "add", &ns]) {
        eprintln!("skipped: ip netns add failed");
        return;
    }
    let ok = ip(&["-n", &ns, "link", "add", "d0", "type", "bridge"])
        && ip(&["-n", &ns, "link", "set", "d0", "mtu", "4200", "up"])
        && ip(&["-n", &ns, "addr", "add", "10.78.0.1/24", "dev", "d0"]);
    let status = ok.then(|| {
        std::process::Command::new("ip")
            .args(["netns", "exec", &ns])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "device_on_a_4200_byte_interface_runs_path_mtu_4096",
                "--nocapture",
            ])
            .env("HCA_TEST_IN_NETNS", &ns)
            .status()
    });
    ip(&["netns", "del", &ns]);
    assert!(ok, "could not set up the bridge in {ns}");
    let status = status.unwrap().unwrap();
    assert!(status.success(), "the device in {ns} failed: {status}");
}

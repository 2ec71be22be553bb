//! Debian's own, unmodified verbs programs (rdma-core's `ibverbs-utils`) on the drop-in
//! `libibverbs.so.1`, with `LD_LIBRARY_PATH` pointing at it: `ibv_devices`, `ibv_devinfo -v`, and
//! the pingpong examples as server and client (two processes, each on its own loopback address
//! through `ROCE_DEVICES`); the library's exported symbol versions against rdma-core's; and a C
//! program that resolves every symbol NCCL's IB transport looks up with dlvsym(3).
//!
//! The tools come from Debian packages (`tests/setup.sh` installs them); a test whose tool is
//! missing fails with that advice, unless `ROCE_SKIP_DEBIAN_TOOLS=1`. Every process runs under
//! `timeout`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

mod common;
use common::{lib_dir, text, tool};

fn run(devices: &str, args: &[&str]) -> Output {
    Command::new("timeout")
        .arg("30")
        .args(args)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("ROCE_DEVICES", devices)
        .output()
        .expect("run timeout")
}

#[test]
fn ibv_devices_lists_the_configured_devices() {
    let Some(t) = tool("ibv_devices") else { return };
    let o = run(
        "rxe0=udp:127.0.0.1,rxe1=udp:127.0.0.2",
        &[t.to_str().unwrap()],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("rxe0") && out.contains("rxe1"), "{out}");
    assert!(
        out.contains("020000fffe000001"),
        "GUID from the address: {out}"
    );
}

#[test]
fn ibv_devinfo_shows_an_active_roce_v2_port() {
    let Some(t) = tool("ibv_devinfo") else { return };
    let o = run("rxe9=udp:127.0.0.9", &[t.to_str().unwrap(), "-v"]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    for want in [
        "hca_id:\trxe9",
        "PORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "GID[  0]:\t\t::ffff:127.0.0.9, RoCE v2",
    ] {
        assert!(out.contains(want), "missing {want:?} in:\n{out}");
    }
}

/// Runs `tool` as server on `a` and client on `b` (their own devices), with `args`.
fn pingpong(name: &str, a: &str, b: &str, port: u16, args: &[&str]) {
    let Some(t) = tool(name) else { return };
    let port = port.to_string();
    let mut common = vec!["-d", "rxe0", "-g", "0", "-n", "20", "-p", &port];
    common.extend_from_slice(args);
    let server = Command::new("timeout")
        .arg("30")
        .arg(&t)
        .args(&common)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("ROCE_DEVICES", format!("rxe0=udp:{a}"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start server");
    // The server listens on its TCP port for the out-of-band exchange; the client retries.
    let mut client = None;
    for _ in 0..50 {
        std::thread::sleep(Duration::from_millis(100));
        let mut argv = vec![t.to_str().unwrap()];
        argv.extend_from_slice(&common);
        argv.push(a);
        let o = run(&format!("rxe0=udp:{b}"), &argv);
        let connect_failed = text(&o).contains("Couldn't connect");
        client = Some(o);
        if !connect_failed {
            break;
        }
    }
    let client = client.expect("client ran");
    let server = server.wait_with_output().expect("server exits");
    let (sout, cout) = (text(&server), text(&client));
    assert!(
        server.status.success(),
        "{name} server:\n{sout}\nclient:\n{cout}"
    );
    assert!(
        client.status.success(),
        "{name} client:\n{cout}\nserver:\n{sout}"
    );
    for out in [&sout, &cout] {
        assert!(out.contains("20 iters in"), "{name}:\n{out}");
        assert!(out.contains("GID ::ffff:127.0.0."), "{name}:\n{out}");
    }
}

#[test]
fn ibv_rc_pingpong_with_data_check() {
    pingpong(
        "ibv_rc_pingpong",
        "127.0.0.11",
        "127.0.0.12",
        18611,
        &["-c"],
    );
}

#[test]
fn ibv_rc_pingpong_with_completion_events() {
    pingpong(
        "ibv_rc_pingpong",
        "127.0.0.21",
        "127.0.0.22",
        18621,
        &["-c", "-e"],
    );
}

#[test]
fn ibv_uc_pingpong_with_data_check() {
    pingpong(
        "ibv_uc_pingpong",
        "127.0.0.13",
        "127.0.0.14",
        18613,
        &["-c"],
    );
}

#[test]
fn ibv_ud_pingpong() {
    pingpong("ibv_ud_pingpong", "127.0.0.15", "127.0.0.16", 18615, &[]);
}

#[test]
fn ibv_srq_pingpong() {
    pingpong(
        "ibv_srq_pingpong",
        "127.0.0.17",
        "127.0.0.18",
        18617,
        &["-q", "4"],
    );
}

/// `(version, name)` of every dynamic symbol of `lib` that has a version, from `objdump -T`.
fn versioned_symbols(lib: &Path) -> Option<Vec<(String, String)>> {
    let o = Command::new("objdump").arg("-T").arg(lib).output().ok()?;
    Some(
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter(|l| l.contains(" DF ") && !l.contains("*UND*"))
            .filter_map(|l| {
                let mut it = l.split_whitespace().rev();
                let name = it.next()?.to_owned();
                let ver = it.next()?.trim_matches(['(', ')']).to_owned();
                ver.starts_with("IBVERBS").then_some((ver, name))
            })
            .collect(),
    )
}

#[test]
fn exports_carry_rdma_core_symbol_versions() {
    let so = lib_dir().join("libibverbs.so.1");
    let Some(ours) = versioned_symbols(&so) else {
        eprintln!("objdump (binutils) is not installed: skipped");
        return;
    };
    for want in [
        ("IBVERBS_1.1", "ibv_get_device_list"),
        ("IBVERBS_1.0", "ibv_create_comp_channel"),
        ("IBVERBS_1.0", "ibv_destroy_comp_channel"),
        ("IBVERBS_1.8", "ibv_reg_mr_iova2"),
        ("IBVERBS_1.11", "_ibv_query_gid_ex"),
        ("IBVERBS_1.12", "ibv_reg_dmabuf_mr"),
        ("IBVERBS_PRIVATE_34", "ibv_query_gid_type"),
    ] {
        assert!(
            ours.iter().any(|(v, n)| (v.as_str(), n.as_str()) == want),
            "{want:?} not exported: {ours:?}"
        );
    }
    let soname = Command::new("readelf").arg("-d").arg(&so).output().unwrap();
    assert!(String::from_utf8_lossy(&soname.stdout).contains("[libibverbs.so.1]"));
    // Every symbol we export has rdma-core's default version, where rdma-core's library is here.
    let real = Path::new("/usr/lib/x86_64-linux-gnu/libibverbs.so.1");
    // Besides them, only the drop-in librdmacm's entry points (a private node of our own).
    if let (true, Some(theirs)) = (real.exists(), versioned_symbols(real)) {
        for (v, n) in ours.iter().filter(|(v, n)| {
            let private = v == "IBVERBS_PRIVATE_RDMACM";
            assert!(!private || n.starts_with("softrdmacm_"), "{n}@@{v}");
            !private
        }) {
            assert!(
                theirs.iter().any(|(tv, tn)| tv == v && tn == n),
                "{n}@@{v} is not a version rdma-core's libibverbs exports"
            );
        }
    }
}

/// `(version, name)` of every libibverbs symbol `file` imports (undefined, versioned
/// `IBVERBS_*`), from `objdump -T`.
fn imported_ibverbs_symbols(file: &Path) -> Vec<(String, String)> {
    let o = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .expect("objdump");
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("*UND*"))
        .filter_map(|l| {
            let mut it = l.split_whitespace().rev();
            let name = it.next()?.to_owned();
            let ver = it.next()?.trim_matches(['(', ')']).to_owned();
            ver.starts_with("IBVERBS").then_some((ver, name))
        })
        .collect()
}

/// Every Debian library and program of rdma-core's family that links against libibverbs
/// (librdmacm, the mlx4/mlx5/efa/mana direct-verbs libraries, the ibverbs-providers plugins,
/// perftest's binaries) finds each symbol it imports, with the version it asks for, in ours;
/// and each perftest binary loads with every symbol bound at start (`LD_BIND_NOW=1`).
#[test]
fn debian_libraries_and_perftest_find_every_import() {
    let Some(write_bw) = tool("ib_write_bw") else {
        return;
    };
    let so = lib_dir().join("libibverbs.so.1");
    let o = Command::new("objdump").arg("-T").arg(&so).output();
    let Ok(o) = o else {
        eprintln!("objdump (binutils) is not installed: skipped");
        return;
    };
    let exported: Vec<(String, String)> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| !l.contains("*UND*"))
        .filter_map(|l| {
            let mut it = l.split_whitespace().rev();
            let name = it.next()?.to_owned();
            let ver = it.next()?.trim_matches(['(', ')']).to_owned();
            ver.starts_with("IBVERBS").then_some((ver, name))
        })
        .collect();
    let libdir = Path::new("/usr/lib/x86_64-linux-gnu");
    let mut files: Vec<PathBuf> = [
        "librdmacm.so.1",
        "libmlx4.so.1",
        "libmlx5.so.1",
        "libefa.so.1",
        "libmana.so.1",
    ]
    .iter()
    .map(|f| libdir.join(f))
    .filter(|p| p.exists())
    .collect();
    if let Ok(rd) = std::fs::read_dir(libdir.join("libibverbs")) {
        files.extend(rd.filter_map(|e| e.ok().map(|e| e.path())));
    }
    let perftest: Vec<PathBuf> = ["send", "write", "read", "atomic"]
        .iter()
        .flat_map(|k| ["bw", "lat"].map(|m| Path::new("/usr/bin").join(format!("ib_{k}_{m}"))))
        .filter(|p| p.exists())
        .collect();
    files.extend(perftest.iter().cloned());
    assert!(files.contains(&libdir.join("librdmacm.so.1")) && files.contains(&write_bw));
    let mut missing = Vec::new();
    for f in &files {
        for (v, n) in imported_ibverbs_symbols(f) {
            if !exported.iter().any(|(ev, en)| *ev == v && *en == n) {
                missing.push(format!("{}: {n}@{v}", f.display()));
            }
        }
    }
    assert!(missing.is_empty(), "not exported:\n{}", missing.join("\n"));
    for exe in &perftest {
        let o = Command::new("timeout")
            .args(["10"])
            .arg(exe)
            .arg("-V")
            .env("LD_LIBRARY_PATH", lib_dir())
            .env("LD_BIND_NOW", "1")
            .output()
            .expect("run perftest");
        let out = text(&o);
        assert!(
            out.contains("Version") && !out.contains("symbol lookup error"),
            "{}: {out}",
            exe.display()
        );
    }
}

/// The symbols NCCL's IB transport resolves (nccl `src/misc/ibvsymbols.cc`) and the versions it
/// asks dlvsym(3) for.
const NCCL_SYMBOLS: &[(&str, &str)] = &[
    ("ibv_get_device_list", "IBVERBS_1.1"),
    ("ibv_free_device_list", "IBVERBS_1.1"),
    ("ibv_get_device_name", "IBVERBS_1.1"),
    ("ibv_open_device", "IBVERBS_1.1"),
    ("ibv_close_device", "IBVERBS_1.1"),
    ("ibv_get_async_event", "IBVERBS_1.1"),
    ("ibv_ack_async_event", "IBVERBS_1.1"),
    ("ibv_query_device", "IBVERBS_1.1"),
    ("ibv_query_port", "IBVERBS_1.1"),
    ("ibv_query_gid", "IBVERBS_1.1"),
    ("ibv_query_qp", "IBVERBS_1.1"),
    ("ibv_alloc_pd", "IBVERBS_1.1"),
    ("ibv_dealloc_pd", "IBVERBS_1.1"),
    ("ibv_reg_mr", "IBVERBS_1.1"),
    ("ibv_reg_mr_iova2", "IBVERBS_1.8"),
    ("ibv_reg_dmabuf_mr", "IBVERBS_1.12"),
    ("ibv_dereg_mr", "IBVERBS_1.1"),
    ("ibv_create_cq", "IBVERBS_1.1"),
    ("ibv_destroy_cq", "IBVERBS_1.1"),
    ("ibv_create_qp", "IBVERBS_1.1"),
    ("ibv_modify_qp", "IBVERBS_1.1"),
    ("ibv_destroy_qp", "IBVERBS_1.1"),
    ("ibv_fork_init", "IBVERBS_1.1"),
    ("ibv_event_type_str", "IBVERBS_1.1"),
    ("ibv_query_ece", "IBVERBS_1.10"),
    ("ibv_set_ece", "IBVERBS_1.10"),
];

#[test]
fn nccl_resolves_every_symbol_with_dlvsym() {
    let dir = std::env::temp_dir().join(format!("abi-nccl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c = String::from(
        "#define _GNU_SOURCE\n#include <dlfcn.h>\n#include <stdio.h>\nint main(void) {\n\
         void *h = dlopen(\"libibverbs.so.1\", RTLD_NOW);\n\
         if (!h) { printf(\"dlopen: %s\\n\", dlerror()); return 2; }\nint missing = 0;\n",
    );
    for (name, ver) in NCCL_SYMBOLS {
        c.push_str(&format!(
            "if (!dlvsym(h, \"{name}\", \"{ver}\")) {{ printf(\"missing {name}@{ver}\\n\"); missing++; }}\n"
        ));
    }
    c.push_str("printf(\"%d missing\\n\", missing);\nreturn missing ? 1 : 0;\n}\n");
    let src = dir.join("nccl_syms.c");
    std::fs::write(&src, c).unwrap();
    let exe = dir.join("nccl_syms");
    let cc = Command::new("cc")
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg("-ldl")
        .output()
        .expect("cc is installed");
    assert!(cc.status.success(), "{}", text(&cc));
    let o = run("", &[exe.to_str().unwrap()]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("0 missing"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

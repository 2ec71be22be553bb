//! The extended verbs through the drop-in `libibverbs.so.1`: a C program (tests/c/qp_ex.c,
//! compiled here against rdma-core's `<infiniband/verbs.h>` and linked against this library)
//! drives the `ibv_qp_ex` work-request API (ibv_wr_post(3): RDMA write with two SGEs, inline
//! send, send with immediate, fetch-and-add, compare-and-swap, RDMA read, write with immediate,
//! `wr_abort`, an oversized inline refused with `ENOSPC`) and the `ibv_cq_ex` polling API
//! (ibv_create_cq_ex(3): `start_poll` / `next_poll` / `end_poll`, `read_*`), and checks the
//! data, the completions, rxe's `EOPNOTSUPP` refusals and 24-bit PSN masking; a second one
//! (tests/c/events_fork.c) checks completion channels under epoll, fork(2) and dma-buf refusals, a
//! third (tests/c/exit_after_last.c) a responder that exits right after its last completion. The struct
//! layouts it relies on are rdma-core's: the bindgen structures assert their sizes and offsets
//! at compile time.

use std::path::Path;
use std::process::Command;

mod common;
use common::{lib_dir, text};

/// Compiles `tests/c/NAME.c` against rdma-core's header and this library, runs it with
/// `devices` under `timeout`, and checks it exits 0 printing `all checks passed`.
fn run_c(name: &str, devices: &str) {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        panic!(
            "<infiniband/verbs.h> is missing: run `bash tests/setup.sh` as root (libibverbs-dev)"
        );
    }
    let dir = std::env::temp_dir().join(format!("abi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let exe = dir.join(name);
    let cc = Command::new("cc")
        .args(["-Wall", "-Werror", "-O1"])
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .arg(format!("-L{}", lib_dir().display()))
        .arg("-l:libibverbs.so.1")
        .output()
        .expect("cc is installed");
    assert!(cc.status.success(), "{}", text(&cc));
    let o = Command::new("timeout")
        .arg("30")
        .arg(&exe)
        .env("LD_LIBRARY_PATH", lib_dir())
        .env("ROCE_DEVICES", devices)
        // Unshared devices: events_fork.c checks that a child cannot open the parent's bound
        // address (with sharing on, the library's default, it would get a slot of its own).
        .env("SOFT_HCA_SHARE", "0")
        .output()
        .expect("run timeout");
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("all checks passed"), "{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn qp_ex_and_cq_ex_from_c() {
    run_c("qp_ex", "rxe0=udp:127.0.0.21,rxe1=udp:127.0.0.22");
}

/// tests/c/events_fork.c: a completion channel's descriptor under epoll(7) becomes readable
/// exactly when an armed CQ completes (ibv_get_cq_event / ibv_ack_cq_events; `EAGAIN` on a
/// non-blocking channel with no event), the async event descriptor is pollable and silent;
/// ibv_fork_init(3) succeeds, ibv_is_fork_initialized says `IBV_FORK_UNNEEDED`, and after
/// fork(2) the child runs RC traffic on devices of its own while the parent keeps using its
/// QPs; ibv_reg_dmabuf_mr(3) refuses fd -1 and a memfd with `EOPNOTSUPP`.
#[test]
fn completion_channels_epoll_fork_and_dmabuf_from_c() {
    run_c(
        "events_fork",
        "rxe0=udp:127.0.0.23,rxe1=udp:127.0.0.24,rxe2=udp:127.0.0.25,rxe3=udp:127.0.0.26",
    );
}

/// tests/c/exit_after_last.c: a responder process that exits (exit(3), nothing destroyed)
/// right after the completion of the last SEND it received; the requester's send still
/// completes with `IBV_WC_SUCCESS`: the ACK that the library's polling rounds held for a reply
/// (`hca::soft::ACK_HOLD`) leaves from its atexit handler. Five rounds of 200 ping-pongs and
/// a last SEND, with the requester's Local ACK Timeout at 16.8 ms and `retry_cnt` 2 (a lost ACK
/// fails the round with `IBV_WC_RETRY_EXC_ERR`).
#[test]
fn responder_exiting_after_its_last_completion_from_c() {
    run_c("exit_after_last", "rxe0=udp:127.0.0.27,rxe1=udp:127.0.0.28");
}
